"""Presets: the Modelfile parser, ``localinfer create`` and ``/api/create`` (with the real
ollama client, as Open WebUI's model editor sends it), a preset's system prompt, seed turns and
parameters reaching /api/chat and /v1/chat/completions, show/list/rm/copy/push, and quantizing
through llama.cpp's quantizer on a GGUF the tests write."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import httpx
import ollama
import pytest

import ggufgen
from daemon_util import fake_factory, install_fake_models, ollama_client, openai_client, serve
from localinfer.cli import main
from localinfer.cli.common import add_sampling_flags, sampling_params
from localinfer.config import ModelSettings
from localinfer.errors import InvalidModelFile, InvalidRequest, StoreError
from localinfer.runtime.types import Message, SamplingParams
from localinfer.store import ModelStore
from localinfer.store.create import create_preset
from localinfer.store.presets import CreateRequest, Preset, parse_modelfile

MODELFILE = '''# Mario, over the fake model
FROM fake:1b
PARAMETER temperature 0.2
PARAMETER top_k 7
PARAMETER stop "<eot>"
PARAMETER stop END
SYSTEM """You are Mario
from Super Mario Bros."""
MESSAGE user Who are you?
MESSAGE assistant "It's-a me, Mario!"
LICENSE MIT
'''


# --- the Modelfile ------------------------------------------------------------------------
def test_a_modelfile_reads_every_instruction(tmp_path):
    ask = parse_modelfile(MODELFILE, tmp_path, "Mario")
    assert ask.name == "mario" and ask.source == "fake:1b"
    assert ask.parameters == {"temperature": 0.2, "top_k": 7, "stop": ["<eot>", "END"]}
    assert ask.system == "You are Mario\nfrom Super Mario Bros."
    assert ask.messages == [("user", "Who are you?"), ("assistant", "It's-a me, Mario!")]
    assert ask.license == ["MIT"]


def test_a_preset_over_a_hub_model_names_it_as_ollama_does(home, tmp_path):
    # FROM hf.co/user/repo[:quant] (and /api/create's from) name the installed Hub model;
    # they were read as a path ("no such file") and refused over the API.
    store = ModelStore()
    path = store.root / "hf.co--t--single" / "q4_k_m.gguf"
    path.parent.mkdir(parents=True)
    path.write_bytes(ggufgen.tiny_model())
    store.register(name="hf.co/t/single:q4_k_m", model="hf.co/t/single", quant="Q4_K_M",
                   path=path, sha256=None, source="hf:t/single/single-Q4_K_M.gguf")
    for ref in ("hf.co/t/single", "hf.co/t/single:Q4_K_M"):
        ask = parse_modelfile(f"FROM {ref}\nSYSTEM Be brief.\n", tmp_path, "brief")
        assert ask.source == ref
        assert create_preset(store, ask, from_api=False).model == "hf.co/t/single:q4_k_m"
        store.presets.remove("brief")
    # A file of that name beside the Modelfile is still the file.
    (tmp_path / "hf.co" / "t").mkdir(parents=True)
    (tmp_path / "hf.co" / "t" / "single").write_bytes(b"")
    assert parse_modelfile("FROM hf.co/t/single\n", tmp_path, "x").source == str(
        tmp_path / "hf.co" / "t" / "single")
    with serve(fake_factory()) as d, d.uds() as c:
        made = c.post("/api/create", json={"model": "terse", "from": "hf.co/t/single"})
        assert made.status_code == 200, made.text
        refused = c.post("/api/create", json={"model": "p", "from": "../hf.co/t/single"})
        assert refused.status_code == 400 and "paths are not" in refused.text
    assert store.presets.get("terse").model == "hf.co/t/single:q4_k_m"


@pytest.mark.parametrize("text, match", [
    ("FROM fake:1b\nPARAMS temperature 1\n", r"line 2 .*unknown instruction 'PARAMS'"),
    ("FROM fake:1b\nMESSAGE tool hi\n", r"line 2 .*role must be one of"),
    ('FROM fake:1b\nSYSTEM """never closed\n', r'line 2 .*never closed'),
    ("FROM fake:1b\nPARAMETER temperature hot\n", r"must be a number"),
    ("FROM fake:1b\nPARAMETER seed 42\n", r"seed.*not supported in a preset"),
    ("FROM fake:1b\nPARAMETER nonsense 1\n", r"not a parameter a preset knows"),
    ("SYSTEM hi\n", r"no FROM line"),
    ("FROM ../../etc/model.gguf\n", r"leaves the Modelfile's folder"),
])
def test_a_bad_modelfile_names_its_line(tmp_path, text, match):
    with pytest.raises(InvalidRequest, match=match):
        parse_modelfile(text, tmp_path, "bad")


def test_a_preset_puts_its_system_and_seed_turns_first():
    preset = Preset(name="p", model="m:1b-f16", system="S",
                    messages=(("user", "u0"), ("assistant", "a0")))
    asked = [Message("user", "q")]
    assert [(m.role, m.content) for m in preset.apply(asked)] == [
        ("system", "S"), ("user", "u0"), ("assistant", "a0"), ("user", "q")]
    own_system = [Message("system", "mine"), Message("user", "q")]
    assert [m.content for m in preset.apply(own_system)] == ["mine", "u0", "a0", "q"]


def test_run_flags_left_out_take_the_presets_defaults():
    parser = argparse.ArgumentParser()
    add_sampling_flags(parser)
    own = ModelSettings(temperature=0.2, top_k=7).sampling()
    params = sampling_params(parser.parse_args([]), own)
    assert (params.temperature, params.top_k, params.top_p) == (0.2, 7, 0.95)
    given = sampling_params(parser.parse_args(["-t", "0.9"]), own)
    assert (given.temperature, given.top_k) == (0.9, 7)
    assert sampling_params(parser.parse_args([])).temperature == 0.8


# --- the daemon: Open WebUI's model editor --------------------------------------------------
def _recording_factory(seen: list):
    """The fake daemon factory, recording each chat's messages and sampling."""
    def factory(model, num_ctx, progress=None):
        engine = fake_factory()(model, num_ctx, progress)
        render, sampler = engine.render_chat, engine.backend.new_sampler

        def rendering(messages, **kwargs):
            seen.append(("messages", [(m.role, m.content) for m in messages]))
            return render(messages, **kwargs)

        def recording(params, seed):
            seen.append(("params", params.temperature, params.top_k, params.stop))
            return sampler(params, seed)

        engine.render_chat = rendering
        engine.backend.new_sampler = recording
        return engine
    return factory


def test_open_webuis_create_makes_a_preset_that_api_chat_uses(home):
    install_fake_models("fake:1b-f16")
    seen: list = []
    with serve(_recording_factory(seen)) as d:
        client = ollama_client(d)
        # What Open WebUI's model editor sends: from, system, parameters.
        steps = list(client.create(model="mario", from_="fake:1b", system="You are Mario.",
                                   parameters={"temperature": 0.2, "stop": ["<eot>"]},
                                   stream=True))
        assert steps[0].status == "reading model metadata" and steps[-1].status == "success"
        client.chat(model="mario", messages=[{"role": "user", "content": "hi"}],
                    options={"num_predict": 2})
        # The request's own temperature wins; the system prompt is still the preset's.
        openai_client(d).chat.completions.create(
            model="mario", messages=[{"role": "user", "content": "hi"}], temperature=0.9,
            max_tokens=2)
        # The model it is over keeps its own defaults and no system prompt.
        client.chat(model="fake:1b", messages=[{"role": "user", "content": "hi"}],
                    options={"num_predict": 2})
        show = client.show("mario")
        tags = [m.model for m in client.list().models]
        v1_models = [m.id for m in openai_client(d).models.list()]
        loaded = [m.model for m in client.ps().models]
    mario = [("system", "You are Mario."), ("user", "hi")]
    assert seen == [("messages", mario), ("params", 0.2, 40, ("<eot>",)),
                    ("messages", mario), ("params", 0.9, 40, ("<eot>",)),
                    ("messages", [("user", "hi")]), ("params", 0.8, 40, ())]
    assert re.search(r"^temperature +0.2$", show.parameters, re.M)
    assert 'PARAMETER temperature 0.2' in show.modelfile and "FROM fake:1b-f16" in show.modelfile
    assert show.details.parent_model == "fake:1b-f16"
    assert "mario" in tags and "fake:1b-f16" in tags
    assert "mario" in v1_models and "fake:1b-f16" in v1_models
    assert loaded == ["fake:1b-f16"]  # the preset shares its model's engine


def test_copy_delete_and_push(home):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory()) as d:
        client = ollama_client(d)
        client.create(model="mario", from_="fake:1b", system="You are Mario.")
        client.copy("mario", "luigi")
        assert client.show("luigi").modelfile.count("You are Mario.") == 1
        client.delete("mario")
        names = [m.model for m in client.list().models]
        with pytest.raises(ollama.ResponseError) as push:
            client.push("luigi")
    assert "mario" not in names and "luigi" in names and "fake:1b-f16" in names
    assert push.value.status_code == 400 and "no registry" in str(push.value)
    assert ModelStore().get("fake:1b-f16") is not None  # the file the presets were over


@pytest.mark.parametrize("body, status, match", [
    ({"model": "p", "from": "/etc/passwd"}, 400, "paths are not accepted"),
    ({"model": "p", "from": "../fake:1b"}, 400, "paths are not accepted"),
    ({"model": "p", "from": "nosuch:1b"}, 404, "unknown model"),
    ({"model": "p", "files": {"x.gguf": "sha256:" + "0" * 64}}, 404, "no installed model"),
    ({"model": "p", "from": "fake:1b", "parameters": {"num_gpu": 9}}, 400, "num_gpu"),
    ({"model": "p", "from": "fake:1b", "adapters": {"l.gguf": "sha256:" + "0" * 64}}, 400,
     "adapters"),
    ({"model": "p", "from": "fake:1b", "template": "{{ .System }} {{ .Prompt }}"}, 400,
     "Go template"),
    ({"model": "p", "from": "fake:1b", "template": "{% for m in messages %}{{ m.content }"},
     400, "TEMPLATE does not compile as a Jinja chat template: unexpected '}'"),
    ({"model": "p", "from": "fake:1b", "parameters": {"num_ctx": 99999999999}}, 400,
     "num_ctx 99999999999 is beyond what fake:1b-f16 was trained for \\(256 tokens\\)"),
    ({"model": "fake:1b", "from": "fake:1b"}, 400, "installed model"),
    ({"model": "gemma3:270m", "from": "fake:1b"}, 400, "a model of the catalog"),
    ({"model": "p/../x", "from": "fake:1b"}, 400, "invalid preset name"),
    ({"model": "p", "from": "fake:1b", "modelfile": "FROM fake:1b\nBOGUS x\n"}, 400,
     "line 2"),
])
def test_a_create_that_cannot_be_made_is_refused_before_anything_is_written(
        home, body, status, match):
    install_fake_models("fake:1b-f16")
    with serve(fake_factory()) as d, d.uds() as c:
        reply = c.post("/api/create", json=body)
    assert reply.status_code == status, reply.text
    assert re.search(match, reply.json()["error"]), reply.json()
    assert ModelStore().presets.all() == []


def test_files_name_an_installed_model_by_its_digest(home):
    install_fake_models("fake:1b-f16")
    store = ModelStore()
    installed = store.get("fake:1b-f16")
    sha = "ab" * 32
    store.register(name=installed.name, model=installed.model, quant=installed.quant,
                   path=Path(installed.path),
                   sha256=sha, source="test")
    with serve(fake_factory()) as d, d.uds() as c:
        reply = c.post("/api/create", json={"model": "byfile", "stream": False,
                                            "files": {"model.gguf": f"sha256:{sha}"}})
    assert reply.status_code == 200 and reply.json() == {"status": "success"}
    assert ModelStore().presets.get("byfile").model == "fake:1b-f16"


# --- the command line -----------------------------------------------------------------------
def test_localinfer_create_show_list_rm(home, tmp_path, capsys):
    install_fake_models("fake:1b-f16")
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text(MODELFILE)
    assert main(["create", "mario", "-f", str(modelfile)]) == 0
    assert "created mario (over fake:1b-f16)" in capsys.readouterr().out
    assert main(["show", "mario"]) == 0
    out = capsys.readouterr().out
    assert "mario: a preset over fake:1b-f16" in out
    assert "temperature 0.2, top_k 7" in out and "You are Mario" in out
    assert re.search(r"^  license +MIT$", out, re.M)  # the preset's own, not only in --json
    assert main(["list"]) == 0
    assert re.search(r"^mario +fake:1b-f16 +system, messages, license", capsys.readouterr().out,
                     re.M)
    assert main(["rm", "mario", "--yes"]) == 0
    assert "fake:1b-f16 is kept" in capsys.readouterr().out
    assert ModelStore().get("fake:1b-f16") is not None and ModelStore().presets.all() == []


def test_create_from_a_file_that_is_no_gguf_is_an_error(home, tmp_path, capsys):
    (tmp_path / "notes.gguf").write_text("not a model")
    (tmp_path / "Modelfile").write_text("FROM ./notes.gguf\n")
    assert main(["create", "x", "-f", str(tmp_path / "Modelfile")]) == InvalidModelFile.exit_code
    assert "not a GGUF model file" in capsys.readouterr().err
    assert ModelStore().presets.all() == [] and ModelStore().installed() == []


def test_an_unknown_modelfile_line_fails_the_command(home, tmp_path, capsys):
    (tmp_path / "Modelfile").write_text("FROM fake:1b\nTEMPERATURE 0.2\n")
    assert main(["create", "x", "-f", str(tmp_path / "Modelfile")]) == InvalidRequest.exit_code
    assert "line 2" in capsys.readouterr().err


# --- quantizing (llama.cpp's quantizer on a small F32 model the tests write) ---------------
@pytest.fixture
def f32_model(home, tmp_path):
    path = tmp_path / "tiny-reranker-f32.gguf"
    path.write_bytes(ggufgen.reranker_model(embd=64))
    return ModelStore().add(path, name="tinyrank:1m")


def test_create_quantizes_with_llama_cpp(f32_model):
    store = ModelStore()
    statuses: list = []
    preset = create_preset(
        store, CreateRequest(name="tinyq", source=f32_model.name, quantize="q8_0"),
        from_api=False, status=lambda *s: statuses.append(s))
    quantized = store.get(preset.model)
    assert quantized is not None and quantized.quant == "Q8_0"
    assert quantized.size_bytes < f32_model.size_bytes and quantized.source.startswith("quantize:")
    assert any(s[0] == "quantizing F32 model to Q8_0" and s[2] for s in statuses)
    assert not list(store.root.glob("*/.quantize-*"))
    # Quantizing the quantized file again is refused unless asked for.
    with pytest.raises(InvalidRequest, match="already quantized.*--allow-requantize"):
        create_preset(store, CreateRequest(name="again", source=preset.model,
                                           quantize="Q4_0"), from_api=False)
    again = create_preset(store, CreateRequest(name="again", source=preset.model,
                                               quantize="Q4_0"),
                          from_api=False, allow_requantize=True)
    assert store.get(again.model).quant == "Q4_0"


def test_quantize_with_no_disk_space_writes_nothing(f32_model):
    store = ModelStore(disk_free=lambda path: 1000)
    with pytest.raises(StoreError, match="not enough disk space"):
        create_preset(store, CreateRequest(name="tinyq", source=f32_model.name,
                                           quantize="Q8_0"), from_api=False)
    assert [m.name for m in store.installed()] == [f32_model.name]
    assert not [p for p in store.root.rglob("*") if p.name.startswith(".quantize-")]
    assert store.presets.all() == []


def test_api_create_streams_the_quantizers_progress(f32_model):
    with serve(fake_factory()) as d, d.uds() as c:
        with c.stream("POST", "/api/create", json={
                "model": "tinyq", "from": f32_model.name, "quantize": "q8_0"},
                timeout=120) as reply:
            lines = [httpx.Response(200, content=line).json() for line in reply.iter_lines()]
    assert lines[-1] == {"status": "success"}
    progress = [item for item in lines if "total" in item]
    assert progress and progress[-1]["completed"] == progress[-1]["total"]
    assert ModelStore().presets.get("tinyq").model == "tinyrank:1m-q8_0"


def test_a_presets_system_and_seed_turns_reach_generate_and_messages(home):
    install_fake_models("fake:1b-f16")
    seen: list = []
    with serve(_recording_factory(seen)) as d:
        client = ollama_client(d)
        client.create(model="mario", from_="fake:1b", system="S",
                      messages=[{"role": "user", "content": "u0"},
                                {"role": "assistant", "content": "a0"}])
        client.generate(model="mario", prompt="q", options={"num_predict": 2})
        with d.uds() as c:
            reply = c.post("/v1/messages", json={
                "model": "mario", "max_tokens": 2,
                "messages": [{"role": "user", "content": "q"}]})
            assert reply.status_code == 200, reply.text
            own = c.post("/v1/messages", json={
                "model": "mario", "max_tokens": 2, "system": "mine",
                "messages": [{"role": "user", "content": "q"}]})
            assert own.status_code == 200, own.text
            # Counting reads the prompt as the request does: with the preset's turns.
            counted = c.post("/v1/messages/count_tokens", json={
                "model": "mario", "messages": [{"role": "user", "content": "q"}]})
            usage = reply.json()["usage"]  # the tokens read, and those found cached
            assert counted.json()["input_tokens"] == \
                usage["input_tokens"] + usage["cache_read_input_tokens"]
            answered = c.post("/v1/responses", json={"model": "mario", "input": "q",
                                                     "max_output_tokens": 2})
            assert answered.status_code == 200, answered.text
            input_tokens = c.post("/v1/responses/input_tokens",
                                  json={"model": "mario", "input": "q"})
            assert input_tokens.json()["input_tokens"] == \
                answered.json()["usage"]["input_tokens"]
    chats = [item[1] for item in seen if item[0] == "messages"]
    seeded = [("system", "S"), ("user", "u0"), ("assistant", "a0"), ("user", "q")]
    assert chats[:3] == [seeded, seeded, [("system", "mine"), ("user", "u0"),
                                          ("assistant", "a0"), ("user", "q")]]


def test_show_prints_a_modelfile_that_makes_the_preset_again(home, tmp_path, capsys):
    install_fake_models("fake:1b-f16")
    (tmp_path / "Modelfile").write_text(MODELFILE)
    assert main(["create", "mario", "-f", str(tmp_path / "Modelfile")]) == 0
    capsys.readouterr()
    assert main(["show", "mario", "--modelfile"]) == 0
    printed = capsys.readouterr().out
    again = parse_modelfile(printed, tmp_path, "mario2")
    first = parse_modelfile(MODELFILE, tmp_path, "mario")
    assert again.source == "fake:1b-f16"
    assert (again.system, again.parameters, again.messages, again.license) == (
        first.system, first.parameters, first.messages, first.license)


def test_a_session_on_a_preset_puts_its_turns_first(fake_engine):
    from localinfer.session import EngineSession, PresetSession

    engine = fake_engine()
    session = PresetSession(EngineSession(engine), Preset(
        name="p", model="fake:1b-f16", system="S", parameters={"stop": ["<x>"]}))
    with_system = session.count_tokens([Message("user", "q")])
    without = EngineSession(engine).count_tokens([Message("user", "q")])
    assert with_system > without
    assert session._params(SamplingParams()).stop == ("<x>",)


# --- LoRA adapters (llama.cpp's adapter API, on the tiny reranker the tests write) -----------
def test_an_adapter_changes_the_models_output_and_a_wrong_one_is_refused(home, tmp_path,
                                                                          capsys):
    from localinfer.config import Config
    from localinfer.loading import engine_factory

    model = tmp_path / "tiny-reranker.gguf"
    model.write_bytes(ggufgen.reranker_model())
    ModelStore().add(model, name="tinyrank:1m")
    (tmp_path / "lora.gguf").write_bytes(ggufgen.lora_adapter())
    (tmp_path / "llama-lora.gguf").write_bytes(ggufgen.lora_adapter(architecture="llama"))
    (tmp_path / "Modelfile").write_text("FROM tinyrank:1m\nADAPTER ./lora.gguf\n")
    assert main(["create", "tuned", "-f", str(tmp_path / "Modelfile")]) == 0
    assert ModelStore().presets.get("tuned").adapters == (str(tmp_path / "lora.gguf"),)
    (tmp_path / "Wrong").write_text("FROM tinyrank:1m\nADAPTER ./llama-lora.gguf\n")
    assert main(["create", "wrong", "-f", str(tmp_path / "Wrong")]) == InvalidRequest.exit_code
    assert "for 'llama' models, and the model is 'bert'" in capsys.readouterr().err
    (tmp_path / "NotLora").write_text("FROM tinyrank:1m\nADAPTER ./tiny-reranker.gguf\n")
    assert main(["create", "notlora", "-f", str(tmp_path / "NotLora")]) == \
        InvalidModelFile.exit_code
    assert "is not a LoRA adapter" in capsys.readouterr().err
    body = {"query": "where is the cat", "documents": ["the cat sat", "the dog ran"]}
    with serve(engine_factory(Config()), max_loaded=2) as d, d.uds() as c:
        base = c.post("/v1/rerank", json={"model": "tinyrank:1m", **body}).json()
        tuned = c.post("/v1/rerank", json={"model": "tuned", **body}).json()
        loaded = sorted(c.get("/api/ps").json()["models"], key=lambda m: m["name"])
    scores = {name: {r["index"]: r["relevance_score"] for r in reply["results"]}
              for name, reply in (("base", base), ("tuned", tuned))}
    assert all(abs(scores["base"][i] - scores["tuned"][i]) > 1e-3 for i in (0, 1))
    assert [m["name"] for m in loaded] == ["tinyrank:1m-f32", "tuned"]  # it loads apart


def test_the_chat_ui_keeps_its_temperature_and_takes_the_presets_other_sampling(fake_engine):
    from localinfer.session import EngineSession, PresetSession

    session = PresetSession(EngineSession(fake_engine()), Preset(
        name="p", model="m", parameters={"temperature": 0.2, "top_k": 7}))
    params = session.with_defaults(SamplingParams(temperature=0.9, max_tokens=9),
                                   ("temperature", "max_tokens"))
    assert (params.temperature, params.top_k, params.max_tokens) == (0.9, 7, 9)


def test_a_model_presets_are_over_is_not_removed_under_them(home):
    install_fake_models("fake:1b-f16")
    store = ModelStore()
    create_preset(store, CreateRequest(name="mario", source="fake:1b"), from_api=False)
    with pytest.raises(InvalidRequest, match="presets mario are over"):
        store.remove("fake:1b-f16")
    store.presets.remove("mario")
    store.remove("fake:1b-f16")
    assert store.installed() == []
