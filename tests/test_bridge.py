"""A client that goes away cancels its generation, streaming or not, and frees its slot."""

from __future__ import annotations

import time

import httpx
import pytest

from daemon_util import fake_factory, install_fake_models, serve


def test_client_disconnect_cancels_and_frees_the_slot(home):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory(reply="tok " * 2000, step_delay_s=0.005, n_slots=1)) as d:
        with d.uds() as c:
            with c.stream("POST", "/api/generate", json={"model": "fake:1b", "prompt": "x"}
                          ) as response:
                lines = response.iter_lines()
                for _ in range(3):
                    next(lines)
            engine = d.manager.loaded["fake:1b-f16"].engine
            deadline = time.monotonic() + 5
            while engine.stats().active and time.monotonic() < deadline:
                time.sleep(0.01)
            assert engine.stats().active == 0
            generated = engine.stats().generated_tokens_total
            assert generated < 200  # stopped long before the 4000-token reply ended
            # The only slot is free again: the next request runs at once.
            quick = c.post("/api/generate", json={"model": "fake:1b", "prompt": "y",
                                                  "stream": False,
                                                  "options": {"num_predict": 2}})
            assert quick.json()["done_reason"] == "length"


def test_a_client_leaving_a_non_streaming_request_is_not_a_server_error(home):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory(reply="tok " * 5000, step_delay_s=0.005)) as d:
        with d.uds() as c:
            with pytest.raises(httpx.ReadTimeout):
                c.post("/v1/completions", json={"model": "fake:1b", "prompt": "x"},
                       timeout=httpx.Timeout(5, read=0.5))
            engine = d.manager.loaded["fake:1b-f16"].engine
            deadline = time.monotonic() + 10
            while engine.stats().active and time.monotonic() < deadline:
                time.sleep(0.02)
            assert engine.stats().active == 0  # the generation was cancelled
            assert 'status="500"' not in c.get("/metrics").text


def test_a_client_leaving_an_infill_of_several_completions_frees_every_slot(home):
    """n_cmpl 3 (llama.vscode's default): the editor aborts the fetch; the three completions
    stop and their slots are free."""
    install_fake_models("coder:1b-f16")
    with serve(fake_factory(reply="tok " * 5000, step_delay_s=0.005, fim=True)) as d:
        with d.uds() as c:
            with pytest.raises(httpx.ReadTimeout):
                c.post("/infill", json={"model": "coder:1b", "input_prefix": "x = 1\n" * 30,
                                        "input_suffix": "", "n_cmpl": 3, "id_slot": 0},
                       timeout=httpx.Timeout(5, read=0.5))
            engine = d.manager.loaded["coder:1b-f16"].engine
            assert engine.stats().requests_total == 3
            deadline = time.monotonic() + 10
            while engine.stats().active and time.monotonic() < deadline:
                time.sleep(0.02)
            assert engine.stats().active == 0
            assert engine.stats().generated_tokens_total < 3000
            # counted as a client that left, as for one completion (once its handler has
            # seen the cancellation, which may come after the engine's)
            while 'route="infill",status="499"' not in (metrics := c.get("/metrics").text) \
                    and time.monotonic() < deadline:
                time.sleep(0.02)
            assert 'route="infill",status="499"' in metrics
