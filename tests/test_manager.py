"""Which models the daemon holds and how requests share them: queueing, batching concurrent
clients, swapping models, keep-alive expiry, reloading for a larger context or after a crash."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import ollama
import openai
import pytest

from daemon_util import fake_factory, install_fake_models, ollama_client, openai_client, serve
from localinfer.daemon.residency import Footprint, MemoryBudget, MemoryPlan
from localinfer.runtime.engine import Engine
from localinfer.runtime.fake import FakeBackend

GIB = 2**30


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
                wait_until_queued(d, 1)
                third = c3.post("/v1/completions", json={"model": "fake:1b", "prompt": "c"})
    assert third.status_code == 503
    assert third.headers["retry-after"]
    assert third.json()["error"]["code"] == "server_busy"


def wait_until_queued(daemon, n: int) -> None:
    """Until ``n`` requests wait in fake:1b's queue (a streamed reply's headers can come
    before its request reaches the engine: on a busy machine a later request overtook it)."""
    engine = daemon.manager.loaded["fake:1b-f16"].engine
    deadline = time.monotonic() + 30
    while engine.stats().queue_depth < n and time.monotonic() < deadline:
        time.sleep(0.01)


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


def test_a_stop_or_keep_alive_0_sent_while_requests_run_unloads_when_they_end(home):
    # The request that finished last set the keep-alive: an older stream ending after the
    # stop (or after a keep_alive 0 request) kept the model loaded for the default 5 min.
    install_fake_models("fake:1b-f16")
    factory = fake_factory(reply="tok " * 300, step_delay_s=0.005, n_slots=2)
    with serve(factory) as d:
        client = openai_client(d)
        olla = ollama_client(d)
        for stop in ("unload", "keep_alive 0"):
            stream = iter(client.completions.create(model="fake:1b", prompt="a", stream=True,
                                                    extra_body={"speculative": False}))
            next(stream)  # it runs
            if stop == "unload":
                with d.uds() as c:
                    assert c.post("/localinfer/unload", json={"model": "fake:1b"}).json() == {
                        "unloaded": ["fake:1b-f16"]}
            else:
                olla.generate(model="fake:1b", prompt="b", keep_alive=0,
                              options={"num_predict": 2})
            assert "fake:1b-f16" in d.manager.loaded  # the stream goes on
            assert "".join(c.choices[0].text for c in stream).count("tok") >= 290
            deadline = time.monotonic() + 5
            while d.manager.loaded and time.monotonic() < deadline:
                time.sleep(0.02)
            assert d.manager.loaded == {}, stop


@pytest.mark.parametrize("memo_s", [5.0, 0.0])
def test_a_loaded_models_family_name_reads_the_store_once_in_a_while(home, monkeypatch,
                                                                     memo_s):
    """``fake`` (the family) names the loaded fake:1b-f16: while the name's memo lasts, a
    request by it neither reads the store nor waits for a worker thread; once it is over, or
    once the daemon has added or removed a model or preset, it reads the store again."""
    monkeypatch.setattr("localinfer.daemon.manager.NAME_MEMO_S", memo_s)
    install_fake_models("fake:1b-f16")
    with serve(fake_factory()) as d:
        client = openai_client(d)
        client.completions.create(model="fake", prompt="a", max_tokens=2)
        reads: list[str] = []
        store_resolve = d.manager.store.resolve
        monkeypatch.setattr(d.manager.store, "resolve",
                            lambda name, **kw: reads.append(name) or store_resolve(name, **kw))
        for _ in range(3):
            client.completions.create(model="fake", prompt="a", max_tokens=2)
        # With the memo, once: the first time the name finds its model loaded. Without it,
        # twice a request (its fields, its lease).
        assert len(reads) == (1 if memo_s else 6)
        assert list(d.manager.loaded) == ["fake:1b-f16"]
        # A preset made through the daemon: names are read again at once, and a preset's
        # name is never remembered (its system prompt may change).
        with d.tcp() as http:
            made = http.post("/api/create", json={"model": "mario", "from": "fake:1b",
                                                  "system": "You are Mario.", "stream": False})
            assert made.status_code == 200, made.text
        reads.clear()
        for model in ("fake", "fake", "mario", "mario"):
            client.completions.create(model=model, prompt="a", max_tokens=2)
        assert reads.count("fake") == (1 if memo_s else 4)
        assert reads.count("mario") == 4


class WhereItTokenizes(FakeBackend):
    """Notes, for each prompt with ``needle`` in it, whether it was tokenized on the event
    loop's thread."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.on_the_loop: list[bool] = []

    def tokenize(self, text: str, *, add_special: bool) -> list[int]:
        if "slowly" in text:
            time.sleep(0.5)  # a template or tokenizer that takes its time
        if "needle" in text:
            try:
                asyncio.get_running_loop()
                self.on_the_loop.append(True)
            except RuntimeError:
                self.on_the_loop.append(False)
        return super().tokenize(text, add_special=add_special)


@pytest.mark.parametrize("here", [True, False])
def test_a_small_requests_prompt_is_tokenized_without_a_thread_hop(home, monkeypatch, here):
    """A body of at most 4 KiB is tokenized on the event loop (a worker thread's hand-over
    costs more) when the model's last small one was quick (its first goes to a thread); a
    larger one on a worker thread, and so is a stored conversation's (``previous_response_id``)
    and every prompt of a model whose tokenizer is in another process, behind its step
    (``tokenizes_here`` False)."""
    monkeypatch.setattr("localinfer.daemon.bridge.QUICK_ENCODE_S", 0.25)  # a busy CI too
    install_fake_models("fake:1b-f16")
    backend = WhereItTokenizes(name="fake:1b-f16")
    backend.tokenizes_here = here
    with serve(lambda model, num_ctx, progress=None: Engine(backend, load_ms=5.0)) as d:
        client = openai_client(d)
        for prompt in ("a needle", "a needle", "a needle " + "haystack" * 600):
            client.completions.create(model="fake:1b", prompt=prompt, max_tokens=2)
        for content in ("a needle", "a needle, slowly", "a needle"):
            client.chat.completions.create(model="fake:1b", max_tokens=2,
                                           messages=[{"role": "user", "content": content}])
        # A small body whose prompt is a stored conversation: a thread, as for a large one.
        first = client.responses.create(model="fake:1b", input="a needle", max_output_tokens=2)
        client.responses.create(model="fake:1b", input="a needle", max_output_tokens=2,
                                previous_response_id=first.id)
    assert backend.on_the_loop == [False, here, False, here, here, False, here, False]


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


def test_a_prompt_longer_than_the_loaded_context_reloads_with_more(home):
    # Loaded with 512 tokens, trained for 16384, the memory plan fits up to 8192: a prompt of
    # ~600 tokens on /v1/chat/completions (no num_ctx: an OpenAI client cannot say it) reloads
    # the model with the next power of two holding the prompt and REPLY_ROOM (4096 + 600 ->
    # 8192), and is answered; later short requests keep the larger context (no reload).
    install_fake_models("fake:1b-f16")
    loads: list = []
    memory = MemoryPlan.fixed(MemoryBudget(ram_bytes=8 * GIB),
                              lambda model, num_ctx: Footprint(ram_bytes=GIB),
                              largest_context=lambda model: 8192)
    long_prompt = "word " * 600
    with serve(fake_factory(loads=loads, n_ctx=512, n_ctx_train=16384), memory=memory) as d:
        client = openai_client(d)
        short = client.chat.completions.create(
            model="fake:1b", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert short.choices[0].message.content
        out = client.chat.completions.create(
            model="fake:1b", messages=[{"role": "user", "content": long_prompt}], max_tokens=2)
        assert out.usage.prompt_tokens > 512 and out.choices[0].message.content
        assert d.manager.loaded["fake:1b-f16"].engine.info.n_ctx == 8192
        client.chat.completions.create(
            model="fake:1b", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert loads == [("fake:1b-f16", None), ("fake:1b-f16", 8192)]


def test_a_prompt_longer_than_the_model_can_have_is_a_400_with_the_figures(home):
    # The memory plan fits 1024 at most: a ~3000-token prompt can never be served here. The
    # 400 names the prompt's tokens, the largest context this machine gives the model, why,
    # and the trained length; the model is not reloaded for it.
    install_fake_models("fake:1b-f16")
    loads: list = []
    memory = MemoryPlan.fixed(MemoryBudget(ram_bytes=8 * GIB),
                              lambda model, num_ctx: Footprint(ram_bytes=GIB),
                              largest_context=lambda model: 1024)
    with serve(fake_factory(loads=loads, n_ctx=512, n_ctx_train=16384), memory=memory) as d:
        client = openai_client(d)
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model="fake:1b", messages=[{"role": "user", "content": "word " * 1500}],
                max_tokens=2)
        message = caught.value.body["message"]
        assert caught.value.body["code"] == "context_length_exceeded"
        assert re.search(r"the prompt is 30\d\d tokens but the largest context fake:1b-f16 can"
                         r" have here is 1024 tokens \(what fits this machine's memory,"
                         r" trained for 16384", message), message
    assert loads == [("fake:1b-f16", None)]


def test_the_trained_length_bounds_the_reload_without_a_memory_plan(home):
    # No memory plan (max_loaded only): the trained length is the limit. A ~3000-token prompt
    # on a model trained for 4096 reloads it with 4096 (not 8192: never past training); one of
    # ~5000 is refused, naming the trained length.
    install_fake_models("fake:1b-f16")
    loads: list = []
    with serve(fake_factory(loads=loads, n_ctx=512, n_ctx_train=4096)) as d:
        client = ollama_client(d)
        out = client.generate(model="fake:1b", prompt="word " * 1500, options={"num_predict": 2})
        assert out.done and out.prompt_eval_count > 512
        with pytest.raises(ollama.ResponseError, match="largest context fake:1b-f16 can have"
                           " here is 4096 tokens .what it was trained for: 4096"):
            client.generate(model="fake:1b", prompt="word " * 2500, options={"num_predict": 2})
    assert loads == [("fake:1b-f16", None), ("fake:1b-f16", 4096)]


def test_a_models_own_ctx_setting_is_never_grown(home):
    # [models."fake:1b"] ctx = 512: the user fixed this model's context; a longer prompt is
    # refused with that reason instead of reloading.
    install_fake_models("fake:1b-f16")
    (home / "config").mkdir(parents=True, exist_ok=True)
    (home / "config" / "config.toml").write_text('[models."fake:1b"]\nctx = 512\n')
    loads: list = []
    with serve(fake_factory(loads=loads, n_ctx=512, n_ctx_train=16384)) as d:
        with pytest.raises(openai.BadRequestError, match="its own ctx in config.toml"):
            openai_client(d).completions.create(model="fake:1b", prompt="word " * 700,
                                                max_tokens=2)
    assert loads == [("fake:1b-f16", None)]


def test_a_models_default_sampling_fills_what_a_request_leaves_out(home):
    # [models."fake:1b"]: temperature 0.1, top_k 7. A request's own temperature wins; the
    # fields it leaves out take the model's defaults, on the OpenAI and the Ollama routes;
    # another model keeps llama.cpp's defaults. /api/show and the status show the settings.
    install_fake_models("fake:1b-f16", "other:2b-f16")
    (home / "config").mkdir(parents=True, exist_ok=True)
    (home / "config" / "config.toml").write_text(
        '[models."fake:1b"]\ntemperature = 0.1\ntop_k = 7\n')
    seen: list = []

    def factory(model, num_ctx, progress=None):
        engine = fake_factory()(model, num_ctx, progress)
        sampler = engine.backend.new_sampler

        def recording(params, seed):
            seen.append((model.name, params.temperature, params.top_k, params.top_p))
            return sampler(params, seed)

        engine.backend.new_sampler = recording
        return engine

    with serve(factory, max_loaded=2) as d:
        openai_client(d).chat.completions.create(
            model="fake:1b", messages=[{"role": "user", "content": "hi"}], temperature=0.9,
            max_tokens=2)
        ollama_client(d).generate(model="fake:1b", prompt="hi", options={"num_predict": 2})
        ollama_client(d).generate(model="other:2b", prompt="hi", options={"num_predict": 2})
        show = ollama_client(d).show("fake:1b")
        with d.uds() as c:
            status = c.get("/localinfer/status").json()
    assert seen == [("fake:1b-f16", 0.9, 7, 0.95), ("fake:1b-f16", 0.1, 7, 0.95),
                    ("other:2b-f16", 0.8, 40, 0.95)]
    assert re.search(r"^temperature +0.1$", show.parameters, re.M)
    assert re.search(r"^top_k +7$", show.parameters, re.M)
    settings = {e["info"]["name"]: e["settings"] for e in status["loaded"]}
    assert settings == {"fake:1b-f16": {"temperature": 0.1, "top_k": 7}, "other:2b-f16": None}
