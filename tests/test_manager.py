"""Which models the daemon holds and how requests share them: queueing, batching concurrent
clients, swapping models, keep-alive expiry, reloading for a larger context or after a crash."""

from __future__ import annotations

import threading
import time

import ollama
import pytest

from daemon_util import fake_factory, install_fake_models, ollama_client, openai_client, serve


def test_full_queue_is_503_with_retry_after(home):
    install_fake_models("fake:1b-f16")
    factory = fake_factory(max_queue=1, reply="tok " * 2000, step_delay_s=0.005, n_slots=1)
    with serve(factory) as d, d.uds() as c1, d.uds() as c2, d.uds() as c3:
        # No speculation: the first reply must still be running when the third request comes.
        with c1.stream("POST", "/v1/completions", json={"model": "fake:1b", "prompt": "a",
                                                         "stream": True, "speculative": False}
                       ) as r1:
            # Keep the iterator: a dropped one is closed, and httpx then closes the connection
            # (the daemon would rightly cancel the first reply).
            lines = r1.iter_lines()
            next(lines)
            with c2.stream("POST", "/v1/completions", json={"model": "fake:1b",
                                                             "prompt": "b", "stream": True}):
                third = c3.post("/v1/completions", json={"model": "fake:1b", "prompt": "c"})
    assert third.status_code == 503
    assert third.headers["retry-after"]
    assert third.json()["error"]["code"] == "server_busy"


def test_concurrent_clients_all_complete_correctly(home):
    install_fake_models("fake:1b-f16")
    factory = fake_factory(reply=lambda p: "answer to " + p.split()[-1], step_delay_s=0.002,
                           n_slots=4)
    with serve(factory) as d:
        results = {}

        def ask(i):
            client = openai_client(d, tcp=i % 2 == 0)
            out = client.completions.create(model="fake:1b", prompt=f"question q{i}",
                                            temperature=0)
            results[i] = out.choices[0].text

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results == {i: f"answer to q{i}" for i in range(8)}


def test_swapping_models_waits_for_in_flight_work(home):
    install_fake_models("fake:1b-f16", "other:2b-f16")
    loads = []
    factory = fake_factory(loads=loads, reply="tok " * 100, step_delay_s=0.002)
    with serve(factory) as d:
        client = openai_client(d)
        first = iter(client.completions.create(model="fake:1b", prompt="a", stream=True))
        text = next(first).choices[0].text  # the first model is generating
        second = client.completions.create(model="other:2b", prompt="b", max_tokens=3)
        assert second.choices[0].finish_reason == "length"
        text += "".join(c.choices[0].text for c in first)
        assert text.count("tok") == 100  # the first reply was completed, not cut
        assert [name for name, _ in loads] == ["fake:1b-f16", "other:2b-f16"]
        assert list(d.manager.loaded) == ["other:2b-f16"]


def test_keep_alive_expiry_unloads(home):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory(), keep_alive_s=0.3) as d:
        ollama_client(d).generate(model="fake:1b", prompt="hi")
        assert list(d.manager.loaded) == ["fake:1b-f16"]
        deadline = time.monotonic() + 5
        while d.manager.loaded and time.monotonic() < deadline:
            time.sleep(0.05)
        assert d.manager.loaded == {}


def test_num_ctx_larger_than_loaded_reloads_and_is_capped_at_training(home):
    install_fake_models("fake:1b-f16")
    loads = []
    with serve(fake_factory(loads=loads, n_ctx_train=8192)) as d:
        client = ollama_client(d)
        client.generate(model="fake:1b", prompt="hi")
        client.generate(model="fake:1b", prompt="hi", options={"num_ctx": 4096})
        client.generate(model="fake:1b", prompt="hi", options={"num_ctx": 1024})
        # Beyond what the model was trained for: capped (as Ollama does), not an error.
        client.generate(model="fake:1b", prompt="hi", options={"num_ctx": 1_000_000})
        assert d.manager.loaded["fake:1b-f16"].engine.info.n_ctx == 8192
    assert loads == [("fake:1b-f16", None), ("fake:1b-f16", 4096), ("fake:1b-f16", 8192)]


def test_a_model_whose_engine_crashed_is_loaded_again(home):
    install_fake_models("fake:1b-f16")
    loads = []
    with serve(fake_factory(loads=loads)) as d:
        client = ollama_client(d)
        client.generate(model="fake:1b", prompt="hi")
        engine = d.manager.loaded["fake:1b-f16"].engine

        def broken(params, seed):
            raise TypeError("a bug in the backend")

        engine.backend.new_sampler = broken
        with pytest.raises(ollama.ResponseError, match="stopped unexpectedly"):
            client.generate(model="fake:1b", prompt="hi")
        assert client.generate(model="fake:1b", prompt="hi").done
        assert d.manager.loaded["fake:1b-f16"].engine is not engine
    assert [name for name, _ in loads] == ["fake:1b-f16", "fake:1b-f16"]
