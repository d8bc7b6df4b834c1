"""Several models loaded at once: side by side while the memory plan fits them, the least
recently used idle one evicted when a new one does not fit, a busy one never cut, a model too
large for the machine refused with its sizes; and what a fresh install lists (the starter,
before any request names it), with OpenAI's /v1/models/{id}."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import ollama
import openai
import pytest

import ggufgen
from daemon_util import (
    STARTER,
    fake_factory,
    install_fake_models,
    ollama_client,
    openai_client,
    serve,
)
from localinfer import gguf, planner
from localinfer.config import Config
from localinfer.daemon.residency import Footprint, MemoryBudget, MemoryPlan
from localinfer.hardware import load_profile
from localinfer.loading import engine_factory
from localinfer.planner import Candidate
from localinfer.progress import human_bytes
from localinfer.selection import plan_prefs
from localinfer.store import ModelStore, ResolvedModel

GIB = 2**30
PROFILES = Path(__file__).parent / "profiles"
MODELS = ("chat:1b-f16", "coder:1b-f16", "embed:1b-f16")


def sized_plan(budget_gib: float, **sizes_gib: float) -> MemoryPlan:
    """A memory plan with a RAM budget and a footprint per model family, in GiB."""

    def estimate(model, num_ctx):
        return Footprint(ram_bytes=int(sizes_gib[model.name.split(":")[0]] * GIB))

    return MemoryPlan.fixed(MemoryBudget(ram_bytes=int(budget_gib * GIB)), estimate)


def ask(d, model: str) -> None:
    out = ollama_client(d).generate(model=model, prompt="hi", options={"num_predict": 2})
    assert out.done


def test_three_models_stay_loaded_together_when_they_fit(home):
    install_fake_models(*MODELS)
    loads: list = []
    plan = sized_plan(4, chat=2, coder=1, embed=0.5)
    with serve(fake_factory(loads=loads), max_loaded=None, memory=plan) as d:
        for _ in range(2):
            for name in ("chat:1b", "coder:1b", "embed:1b"):
                ask(d, name)
        assert sorted(d.manager.loaded) == sorted(MODELS)
        assert [name for name, _ in loads] == list(MODELS)  # each loaded once, none swapped
        running = {m.model: m for m in ollama_client(d).ps().models}
        assert running["chat:1b-f16"].size == 2 * GIB and running["chat:1b-f16"].size_vram == 0
        with d.uds() as c:
            status = c.get("/localinfer/status").json()
        assert status["memory"]["used"]["ram_bytes"] == int(3.5 * GIB)
        assert status["memory"]["budget"]["ram_bytes"] == 4 * GIB
        assert status["memory"]["max_loaded"] is None
        memory = {m["info"]["name"]: m["memory"] for m in status["loaded"]}
        assert memory["embed:1b-f16"]["ram_bytes"] == GIB // 2
        assert memory["embed:1b-f16"]["processor"] == "100% CPU"


def test_the_least_recently_used_model_is_evicted_when_a_new_one_does_not_fit(home):
    install_fake_models(*MODELS)
    loads: list = []
    plan = sized_plan(3, chat=2, coder=1, embed=0.5)
    with serve(fake_factory(loads=loads), max_loaded=None, memory=plan) as d:
        ask(d, "coder:1b")
        ask(d, "chat:1b")
        ask(d, "coder:1b")  # chat is now the least recently used
        ask(d, "embed:1b")  # 3.5 GiB with all three: one must go
        assert sorted(d.manager.loaded) == ["coder:1b-f16", "embed:1b-f16"]
        ask(d, "coder:1b")
        ask(d, "chat:1b")  # 3.5 GiB again: embed is the least recently used now
        assert sorted(d.manager.loaded) == ["chat:1b-f16", "coder:1b-f16"]
    assert [name for name, _ in loads] == ["coder:1b-f16", "chat:1b-f16", "embed:1b-f16",
                                           "chat:1b-f16"]


def test_a_model_answering_a_request_is_never_evicted(home):
    install_fake_models(*MODELS)
    plan = sized_plan(3, chat=2, coder=1, embed=0.5)
    factory = fake_factory(reply="tok " * 100, step_delay_s=0.003)
    with serve(factory, max_loaded=None, memory=plan) as d:
        client = openai_client(d)
        stream = iter(client.completions.create(model="chat:1b", prompt="a", stream=True))
        text = next(stream).choices[0].text  # chat is answering, and used before coder
        client.completions.create(model="coder:1b", prompt="b", max_tokens=2)
        client.completions.create(model="embed:1b", prompt="c", max_tokens=2)
        # chat was the least recently used, but busy: the idle coder made room.
        assert sorted(d.manager.loaded) == ["chat:1b-f16", "embed:1b-f16"]
        text += "".join(c.choices[0].text for c in stream)
    assert text.count("tok") == 100  # the reply went on to its end


def test_a_loaded_model_answers_while_another_loads(home):
    install_fake_models("chat:1b-f16", "coder:1b-f16")
    started, release = threading.Event(), threading.Event()
    fake = fake_factory()

    def factory(model, num_ctx, progress=None):
        if model.name.startswith("coder"):
            started.set()
            assert release.wait(30), "the test never let the load finish"
        return fake(model, num_ctx, progress)

    plan = sized_plan(4, chat=2, coder=1)
    with serve(factory, max_loaded=None, memory=plan) as d:
        ask(d, "chat:1b")
        loading = threading.Thread(target=ask, args=(d, "coder:1b"))
        loading.start()
        try:
            assert started.wait(30)
            ask(d, "chat:1b")  # would wait for the coder's load (here: forever) if it queued
            assert d.manager.loading == "coder:1b-f16"
        finally:
            release.set()
            loading.join(30)
        assert sorted(d.manager.loaded) == ["chat:1b-f16", "coder:1b-f16"]


def test_a_model_that_can_never_fit_is_refused_with_its_sizes(home):
    install_fake_models("chat:1b-f16", "huge:1b-f16")
    plan = sized_plan(2, chat=1, huge=3)
    with serve(fake_factory(), max_loaded=None, memory=plan) as d:
        ask(d, "chat:1b")
        with pytest.raises(openai.BadRequestError) as caught:
            openai_client(d).chat.completions.create(
                model="huge:1b", messages=[{"role": "user", "content": "hi"}])
        error = caught.value.body
        assert error["code"] == "model_too_large"
        assert "huge:1b-f16 needs 3.2 GB of RAM" in error["message"]
        assert "can give models 2.1 GB" in error["message"]
        with pytest.raises(ollama.ResponseError) as olla:
            ollama_client(d).generate(model="huge:1b", prompt="hi")
        assert olla.value.status_code == 400 and "3.2 GB" in olla.value.error
        assert list(d.manager.loaded) == ["chat:1b-f16"]  # nothing was evicted for it


def test_max_loaded_caps_the_count_even_when_memory_would_fit(home):
    install_fake_models(*MODELS)
    with serve(fake_factory(), max_loaded=2, memory=sized_plan(8, chat=1, coder=1, embed=1)
               ) as d:
        for name in ("chat:1b", "coder:1b", "embed:1b"):
            ask(d, name)
        assert sorted(d.manager.loaded) == ["coder:1b-f16", "embed:1b-f16"]


def test_ps_prints_each_models_memory_and_the_budget(home):
    install_fake_models("chat:1b-f16", "coder:1b-f16")

    def estimate(model, num_ctx):
        return Footprint(ram_bytes=GIB, vram_bytes=2 * GIB, n_gpu_layers=3, n_layers_total=5)

    plan = MemoryPlan.fixed(MemoryBudget(ram_bytes=8 * GIB, vram_bytes=6 * GIB), estimate)
    with serve(fake_factory(), max_loaded=None, memory=plan) as d:
        ask(d, "chat:1b")
        ask(d, "coder:1b")
        out = subprocess.run([sys.executable, "-m", "localinfer", "ps"], capture_output=True,
                             text=True, env={k: v for k, v in os.environ.items()
                                             if k != "LOCALINFER_HOST"}, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1] == "memory: 2.1 GB of 8.6 GB RAM, 4.3 GB of 6.4 GB VRAM for loaded models"
    rows = [line for line in lines if line.startswith(("chat:", "coder:"))]
    assert len(rows) == 2
    assert all("1.1 GB RAM + 2.1 GB VRAM" in row for row in rows), rows


def test_a_fresh_install_lists_the_starter_and_retrieves_models_by_id(home):
    with serve(fake_factory()) as d:
        with d.uds() as c:
            [tag] = c.get("/api/tags").json()["models"]
        assert tag["name"] == STARTER and tag["size"] > 200_000_000
        assert len(tag["digest"]) == 64 and tag["details"]["quantization_level"] == "Q4_K_M"
        client = openai_client(d)
        assert [m.id for m in client.models.list()] == [STARTER]
        assert client.models.retrieve(STARTER).id == STARTER
        assert client.models.retrieve("gemma3:270m").id == STARTER  # without the quant
        with pytest.raises(openai.NotFoundError) as caught:
            client.models.retrieve("nothing:1b")
        assert caught.value.body["code"] == "model_not_found"
        assert "nothing:1b" in caught.value.body["message"]
        with d.uds() as c:
            r = c.get("/v1/models/no/such")
        assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
    assert ModelStore().installed() == []  # listed, not yet assembled: the first use does it


@pytest.mark.model
def test_the_real_starter_loaded_under_two_names_side_by_side(home, starter_path):
    store = ModelStore()
    store.add(starter_path, name="chat", link=True)
    store.add(starter_path, name="coder", link=True)
    config = Config(ctx=2048)
    with serve(engine_factory(config, n_slots=1), max_loaded=None,
               memory=MemoryPlan.for_machine(config.replace(slots=1))) as d:
        client = ollama_client(d)
        for name in ("chat", "coder", "chat"):
            out = client.generate(model=name, prompt="The capital of France is", raw=True,
                                  options={"num_predict": 4, "temperature": 0})
            assert out.eval_count == 4
        running = {m.model: m for m in client.ps().models}
        assert sorted(running) == ["chat:270m-q4_k_m", "coder:270m-q4_k_m"]
        file_bytes = starter_path.stat().st_size
        for model in running.values():  # weights, a KV cache and compute buffers
            assert model.size > file_bytes
        with httpx.Client(base_url=d.url) as c:
            memory = c.get("/localinfer/status").json()["memory"]
        assert memory["used"]["ram_bytes"] + memory["used"]["vram_bytes"] == sum(
            m.size for m in running.values())
        assert memory["budget"]["ram_bytes"] > memory["used"]["ram_bytes"]


@pytest.mark.parametrize("profile, processor, unified", [
    ("desktop-rtx3060-32gb", "100% GPU", False),
    ("laptop-8gb-cpu", "100% CPU", False),
    ("macbook-air-m2-8gb", "100% GPU", True),
])
def test_the_memory_plan_counts_a_model_as_the_planner_places_it(tmp_path, profile, processor,
                                                                 unified):
    path = tmp_path / "tiny.gguf"
    path.write_bytes(ggufgen.tiny_model())
    hardware = load_profile(PROFILES / f"{profile}.json")
    config = Config(ctx=256)
    plan = MemoryPlan.for_machine(config, hardware)
    footprint = plan.estimate(ResolvedModel("tiny:1m-f32", path), None)
    # The daemon's placement: the settings' slots, else as many as the plan fits.
    prefs = plan_prefs(config, n_slots=None)
    placed = planner.plan(hardware, [Candidate.from_header(gguf.read_header(path),
                                                           name="tiny")], prefs).evaluations[0]
    assert footprint.ram_bytes == placed.host.total_bytes
    assert footprint.vram_bytes == (placed.gpu.total_bytes if placed.gpu else 0)
    assert footprint.processor == processor
    # The largest context a longer request may reload it with: its trained 256, which fits.
    assert plan.largest_context(ResolvedModel("tiny:1m-f32", path)) == 256
    budget = plan.budget
    assert (budget.ram_bytes, budget.vram_bytes, budget.unified) == planner.memory_budget(
        hardware, prefs)
    assert budget.unified is unified
    assert budget.fits([footprint] * 3)
    # Twice the budget's worth can never fit: said with both sizes.
    huge = Footprint(ram_bytes=2 * budget.ram_bytes)
    error = budget.too_large("huge:1b", huge)
    assert error is not None and error.http_status == 400
    assert f"can give models {human_bytes(budget.ram_bytes)}" in error.message
