"""The wire format of localinfer's own routes, with no daemon: every event, the model info and
every error class survive a trip through JSON text; and the protocol (with the client) loads
neither the engine nor the web stack."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import pytest

from localinfer import errors
from localinfer.errors import LocalInferError
from localinfer.protocol import (
    ERROR_CODES,
    ModelInfo,
    Start,
    error_from,
    error_json,
    event_from,
    event_json,
    generate_request_json,
    health_json,
    json_line,
    live_from,
    live_json,
    load_fraction_from,
    model_info_from,
    model_info_json,
    timings_from,
    timings_json,
)
from localinfer.runtime.types import (
    Done,
    LiveStats,
    Message,
    Priority,
    SamplingParams,
    Timings,
    Token,
    Usage,
)

INFO = ModelInfo(name="coder:1b-q4_k_m", path="/models/coder.gguf", architecture="qwen2",
                 quant="Q4_K_M", size_bytes=986_000_000, n_params=1_540_000_000, n_layers=28,
                 n_gpu_layers=12, n_ctx_train=32768, n_ctx=4096, n_slots=2, n_vocab=151936,
                 gpu_backend="CUDA", flash_attn=None, chat_template="{{ messages }}",
                 bos_text="", eos_text="<|endoftext|>", add_bos=False,
                 fim=("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"))
TIMINGS = Timings(load_ms=812.5, queue_ms=3.25, prompt_tokens=40, cached_tokens=32,
                  prefill_tokens=8, prefill_ms=21.0, ttft_ms=24.25, completion_tokens=17,
                  decode_tokens=16, decode_ms=400.0, total_ms=424.5, drafted_tokens=9,
                  accepted_tokens=6)
ERROR_CLASSES = sorted((cls for _, cls in inspect.getmembers(errors, inspect.isclass)
                        if issubclass(cls, LocalInferError)), key=lambda cls: cls.__name__)


def over_the_wire(obj: dict) -> dict:
    """What the other process reads: the JSON text, parsed again."""
    return json.loads(json_line(obj))


@pytest.mark.parametrize("event", [
    Start(id="gen-7", model="coder:1b-q4_k_m", prompt_tokens=40, info=INFO),
    Token("héllo ✓", LiveStats(n_tokens=3, ttft_ms=24.25, prefill_tps=380.5, decode_tps=41.0)),
    Done("the whole reply", "length", Usage(40, 17, cached_tokens=32), TIMINGS),
    Done("", "cancelled", Usage(5, 0)),
], ids=["start", "token", "done", "done-cancelled"])
def test_every_event_survives_the_wire(event):
    back = event_from(over_the_wire(event_json(event)))
    if isinstance(event, Start):  # the stream's first line leaves the long template out
        assert back == Start(event.id, event.model, event.prompt_tokens,
                             model_info_from(model_info_json(INFO, with_template=False)))
        assert back.info.chat_template is None and back.info.fim == INFO.fim
    else:
        assert back == event


def test_model_info_survives_the_wire_with_its_template():
    assert model_info_from(over_the_wire(model_info_json(INFO))) == INFO
    assert model_info_from({"name": "only a name"}) is None
    # Fields this client does not know (a newer daemon) are ignored.
    assert model_info_from(model_info_json(INFO) | {"future_field": 1}) == INFO


def test_timings_carry_their_rates_and_come_back():
    data = over_the_wire(timings_json(TIMINGS))
    assert data["decode_tps"] == TIMINGS.decode_tps == 40.0
    assert data["prefill_tps"] == TIMINGS.prefill_tps
    assert timings_from(data) == TIMINGS
    live = LiveStats(n_tokens=9, ttft_ms=30.0, prefill_tps=200.0, decode_tps=35.5)
    assert live_from(over_the_wire(live_json(live))) == live


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_each_error_class_comes_back_as_itself(cls):
    original = cls.__new__(cls)
    LocalInferError.__init__(original, f"what went wrong with {cls.__name__}, and what to do")
    body = over_the_wire({"error": error_json(original)})
    back = error_from(body, status=original.http_status)
    assert type(back) is cls
    assert back.message == original.message and back.title == original.title
    assert back.exit_code == original.exit_code
    event = event_from(over_the_wire(event_json(original)))
    assert type(event) is cls and event.message == original.message


def test_an_error_with_its_own_title_keeps_it():
    original = errors.DaemonError("port 11480 is taken.", title="port in use")
    back = error_from(over_the_wire({"error": error_json(original)}))
    assert type(back) is errors.DaemonError and back.one_line() == original.one_line()


@pytest.mark.parametrize("payload, status, cls, message", [
    ({"error": {"message": "no such model", "code": "model_not_found"}}, 404,
     errors.ModelNotFound, "no such model"),
    ({"error": {"message": "too long", "code": "context_length_exceeded"}}, 400,
     errors.ContextOverflow, "too long"),
    ({"error": {"message": "queue full"}}, 503, errors.Busy, "queue full"),
    ({"error": "Host 'evil' is not allowed"}, 403, errors.DaemonError,
     "Host 'evil' is not allowed"),
    ({"error": {"message": "x", "class": "SystemExit"}}, 400, errors.InvalidRequest, "x"),
    ("<html>bad gateway</html>", 502, errors.DaemonError, "HTTP 502"),
])
def test_an_error_without_a_known_class_follows_its_code_or_status(payload, status, cls,
                                                                   message):
    back = error_from(payload, status)
    assert type(back) is cls and back.message == message


def test_error_codes_name_classes_of_the_error_tree():
    assert set(ERROR_CODES) <= set(ERROR_CLASSES)
    for cls, code in ERROR_CODES.items():
        assert type(error_from({"error": {"message": "m", "code": code}})) is cls


def test_an_unknown_line_is_skipped():
    assert event_from({"type": "progress", "fraction": 0.5}) is None


def test_generate_request_names_every_sampling_parameter():
    params = SamplingParams(max_tokens=None, temperature=0.0, stop=("\n\n",), seed=3)
    body = over_the_wire(generate_request_json(
        "coder:1b", messages=[Message("user", "hi")], prompt=None, params=params,
        priority=Priority.INTERACTIVE, keep_alive=0.0))
    assert body["messages"] == [{"role": "user", "content": "hi"}] and "prompt" not in body
    assert body["priority"] == "interactive" and body["keep_alive"] == 0.0
    assert SamplingParams(**{**body["params"], "stop": tuple(body["params"]["stop"])}) == params
    assert "speculative" not in body["params"]  # None: the daemon's engine decides
    completion = generate_request_json("coder:1b", messages=None, prompt="def f(",
                                       params=SamplingParams(speculative=False),
                                       priority=Priority.BACKGROUND, keep_alive=None)
    assert completion["prompt"] == "def f(" and "keep_alive" not in completion
    assert completion["params"]["speculative"] is False


def test_health_says_how_far_a_load_is():
    loading, status = health_json(version="1", loading="coder:1b", load_fraction=0.4567,
                                  loaded=[])
    assert status == 503 and load_fraction_from(over_the_wire(loading)) == 0.457
    ready, status = health_json(version="1", loading=None, load_fraction=0.0,
                                loaded=["b", "a"])
    assert status == 200 and ready["loaded"] == ["a", "b"]
    assert load_fraction_from(over_the_wire(ready)) is None


@pytest.mark.parametrize("module", ["localinfer.protocol", "localinfer.client"])
def test_the_wire_loads_no_engine_and_no_web_stack(module):
    heavy = ["localinfer.runtime.engine", "localinfer.runtime.backend", "jinja2", "numpy",
             "llama_cpp", "starlette", "uvicorn"]
    code = (f"import sys, json, {module}\n"
            f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == []
