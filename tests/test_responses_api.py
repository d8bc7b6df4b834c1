"""/v1/responses, OpenAI's Responses API (Codex's), on the fake backend through the real
openai SDK: the response's shape, the streamed events in their documented order, tools
(function and custom) and reasoning, stored responses (GET, DELETE, 404,
previous_response_id across a restart, a corrupt file skipped), and a request shaped as
Codex sends it."""

from __future__ import annotations

import json
import logging
import os
import time

import openai
import pytest

from daemon_util import REPLY, fake_factory, install_fake_models, openai_client, serve
from localinfer.daemon.response_store import ResponseStore
from localinfer.paths import get_paths
from template_fixtures import QWEN3_TOOLS

pytest_plugins = ["daemon_fixtures"]

REASONING = "The user wants Paris's weather; I have a tool for that."
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


def _call(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def _agent(prompt: str) -> str:
    """A Qwen3-like agent: reasons, calls get_weather (or the tool the user names), and
    answers once the tool's output is in the prompt."""
    if "<tool_response>" in prompt:
        return f"<think>\nI have the answer.\n</think>\n\nIt is {prompt.count('12 C')} x 12 C."
    if "patch" in prompt.split("<|im_start|>user")[-1]:
        return f"<think>\n{REASONING}\n</think>\n\n" + _call("apply_patch", {
            "input": "*** Begin Patch\n*** End Patch"})
    if "shell" in prompt.split("<|im_start|>user")[-1]:
        return f"<think>\n{REASONING}\n</think>\n\n" + _call("exec_command", {"cmd": "ls"})
    if "agent" in prompt.split("<|im_start|>user")[-1]:
        return _call("spawn_agent", {"message": "go"})
    return f"<think>\n{REASONING}\n</think>\n\n" + _call("get_weather", {"city": "Paris"})


@pytest.fixture
def qwen3(home):
    install_fake_models("qwen3:1b-f16")
    with serve(fake_factory(reply=_agent, chat_template=QWEN3_TOOLS)) as d:
        yield d


def test_a_response_has_the_shape_the_sdk_reads(daemon):
    client = openai_client(daemon)
    r = client.responses.create(model="fake:1b", input="hi", instructions="Be brief.",
                                max_output_tokens=64, temperature=0.5, top_p=0.9,
                                metadata={"k": "v"}, store=False)
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert r.output_text == REPLY and r.model == "fake:1b-f16"
    [message] = r.output
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.content[0].type == "output_text"
    assert (r.instructions, r.temperature, r.top_p, r.max_output_tokens, r.metadata) == (
        "Be brief.", 0.5, 0.9, 64, {"k": "v"})
    assert (r.store, r.tool_choice, r.tools, r.parallel_tool_calls) == (False, "auto", [], True)
    u = r.usage
    assert u.input_tokens > 0 and u.output_tokens > 0
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert u.output_tokens_details.reasoning_tokens == 0
    assert u.input_tokens_details.cached_tokens == 0
    # The same prompt again reuses its KV cache: cached_tokens counts what was reused.
    again = client.responses.create(model="fake:1b", input="hi", instructions="Be brief.",
                                    store=False)
    assert 0 < again.usage.input_tokens_details.cached_tokens < again.usage.input_tokens


def test_max_output_tokens_makes_an_incomplete_response(daemon):
    client = openai_client(daemon)
    r = client.responses.create(model="fake:1b", input="hi", max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[-1].status == "incomplete"  # the message cut off, as OpenAI marks it
    assert r.usage.output_tokens == 3
    with client.responses.stream(model="fake:1b", input="hi", max_output_tokens=3) as s:
        types = [e.type for e in s]
    assert types[-1] == "response.incomplete"


def test_streamed_text_in_the_documented_order(daemon):
    client = openai_client(daemon)
    with client.responses.stream(model="fake:1b", input=[
            {"role": "user", "content": "hi"}]) as s:
        events = list(s)
        final = s.get_final_response()
    types = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert types == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"]
                     * len(deltas), "response.output_text.done", "response.content_part.done",
                     "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(d.delta for d in deltas) == REPLY == final.output_text
    assert events[0].response.status == "in_progress"
    assert final.usage.output_tokens > 0


def test_reasoning_then_a_call_whole_and_streamed(qwen3):
    client = openai_client(qwen3)
    ask = {"model": "qwen3:1b", "input": "Weather in Paris?", "tools": [WEATHER],
           "reasoning": {"effort": "high"}, "store": False}
    r = client.responses.create(**ask)
    reasoning, call = r.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == REASONING
    assert reasoning.summary == [] and reasoning.id.startswith("rs_")
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"} and call.call_id.startswith("call_")
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens

    with client.responses.stream(**ask) as s:
        events = list(s)
        final = s.get_final_response()
    types = [e.type for e in events]
    n = types.count("response.reasoning_text.delta")
    m = types.count("response.function_call_arguments.delta")
    assert n > 0 and types == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        *["response.reasoning_text.delta"] * n, "response.reasoning_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", *["response.function_call_arguments.delta"] * m,
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [i.type for i in final.output] == ["reasoning", "function_call"]
    done = [e for e in events if e.type == "response.function_call_arguments.done"][0]
    assert json.loads(done.arguments) == {"city": "Paris"}
    # The arguments stream as the model writes them, several pieces adding up to them.
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert m >= 3 and "".join(deltas) == done.arguments == final.output[1].arguments
    assert final.output[1].call_id == events[-2].item.call_id
    assert [e.output_index for e in events if e.type == "response.output_item.added"] == [0, 1]


def test_a_function_call_round_trip(qwen3):
    """call -> function_call_output -> answer, the second turn carrying the first's items
    (reasoning included, as Codex sends them back)."""
    client = openai_client(qwen3)
    first = client.responses.create(model="qwen3:1b", input="Weather in Paris?",
                                    tools=[WEATHER], store=False)
    call = first.output[-1]
    items = [{"role": "user", "content": "Weather in Paris?"},
             *[item.model_dump(exclude_none=True) for item in first.output],
             {"type": "function_call_output", "call_id": call.call_id, "output": "12 C"}]
    final = client.responses.create(model="qwen3:1b", input=items, tools=[WEATHER],
                                    store=False)
    assert final.output_text == "It is 1 x 12 C."
    assert [i.type for i in final.output] == ["reasoning", "message"]


def test_the_previous_response_carries_the_conversation(qwen3):
    client = openai_client(qwen3)
    first = client.responses.create(model="qwen3:1b", input="Weather in Paris?",
                                    tools=[WEATHER], instructions="Use tools.")
    call = first.output[-1]
    output = [{"type": "function_call_output", "call_id": call.call_id, "output": "12 C"}]
    final = client.responses.create(model="qwen3:1b", previous_response_id=first.id,
                                    tools=[WEATHER], instructions="Use tools.", input=output)
    assert final.previous_response_id == first.id and final.instructions == "Use tools."
    assert final.output_text == "It is 1 x 12 C."
    assert final.usage.input_tokens_details.cached_tokens > 0  # the first turn's prefix
    # Instructions are not carried over (as OpenAI's): without them the prompt has none.
    bare = client.responses.create(model="qwen3:1b", previous_response_id=first.id,
                                   tools=[WEATHER], input=output)
    assert bare.instructions is None and bare.output_text == "It is 1 x 12 C."


def test_custom_tools_free_text_and_regex(qwen3):
    client = openai_client(qwen3)
    for fmt in ({"type": "text"}, {"type": "grammar", "syntax": "regex",
                                   "definition": r"\*\*\* Begin Patch[\s\S]*"}):
        tool = {"type": "custom", "name": "apply_patch", "description": "Edit files",
                "format": fmt}
        r = client.responses.create(model="qwen3:1b", input="Apply the patch.",
                                    tools=[tool], store=False)
        call = r.output[-1]
        assert call.type == "custom_tool_call" and call.name == "apply_patch"
        assert call.input == "*** Begin Patch\n*** End Patch"
    with client.responses.stream(model="qwen3:1b", input="Apply the patch.", tools=[tool],
                                 store=False) as s:
        types = [e.type for e in s]
    assert "response.custom_tool_call_input.delta" in types
    assert "response.custom_tool_call_input.done" in types
    # Its output goes back in as a custom_tool_call_output.
    final = client.responses.create(model="qwen3:1b", tools=[tool], store=False, input=[
        {"role": "user", "content": "Apply the patch."},
        {"type": "custom_tool_call", "call_id": call.call_id, "name": "apply_patch",
         "input": call.input},
        {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "12 C"}])
    assert final.output_text == "It is 1 x 12 C."


REFUSED = [
    ({"tools": [{"type": "web_search"}]}, "web_search"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "file_search"),
    ({"tools": [{"type": "computer_use_preview", "display_width": 1, "display_height": 1,
                 "environment": "linux"}]}, "computer_use_preview"),
    ({"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]},
     "code_interpreter"),
    ({"tools": [{"type": "image_generation"}]}, "image_generation"),
    ({"tools": [{"type": "mcp", "server_label": "x"}]}, "mcp"),
    ({"tools": [{"type": "local_shell"}]}, "local_shell"),
    ({"tools": [{"type": "tool_search"}]}, "tool_search"),
    ({"tools": [{"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}]},
     "tools[0].tools[0]"),
    ({"tools": [{"type": "custom", "name": "apply_patch", "format": {
        "type": "grammar", "syntax": "lark", "definition": "start: \"x\""}}]}, "apply_patch"),
    ({"tool_choice": {"type": "web_search_preview"}}, "web_search_preview"),
    ({"include": ["file_search_call.results"]}, "file_search_call.results"),
    ({"truncation": "auto"}, "truncation"),
    ({"background": True}, "background"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input_image"),
    ({"input": [{"type": "message", "role": [1], "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": {}, "text": "x"}]}]}, "input[0]"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference"),
    ({"input": [{"role": "critic", "content": "x"}]}, "input[0].role"),
    ({"metadata": {"k": 1}}, "metadata"),
    ({"tools": [WEATHER], "text": {"format": {"type": "json_object"}}}, "text.format"),
    ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]}, "nope"),
    ({"frobnicate": 1}, "frobnicate"),
    # Nested as at the top: a text part's and a tool's unknown fields are named.
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "x", "foo": 1}]}]},
     "input[0].content[0].foo"),
    ({"tools": [{**WEATHER, "foo": 1}]}, "tools[0].foo"),
    # A call's output answers a call sent before it, and each call is answered.
    ({"input": [{"type": "function_call_output", "call_id": "call_9", "output": "x"}]},
     "call_id call_9"),
    ({"input": [{"role": "user", "content": "hi"},
                {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
                {"role": "user", "content": "and?"}]}, "function call call_1"),
    # OpenAI's ranges.
    ({"temperature": 3}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
]


@pytest.mark.parametrize(("extra", "name"), REFUSED, ids=[n for _, n in REFUSED])
def test_refused_fields_are_400s_naming_them(daemon, extra, name):
    with daemon.uds() as http:
        r = http.post("/v1/responses", json={"model": "fake:1b", "input": "hi", **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and name in error["message"], error


def test_structured_output_and_accepted_fields(daemon):
    client = openai_client(daemon)
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    for fmt in ({"type": "json_schema", "name": "x", "schema": schema, "strict": True},
                {"type": "json_object"}, {"type": "text"}):
        r = client.responses.create(model="fake:1b", input="hi", text={"format": fmt},
                                    store=False, truncation="disabled", user="u",
                                    prompt_cache_key="k", service_tier="auto",
                                    safety_identifier="s", max_tool_calls=3,
                                    parallel_tool_calls=False, background=False,
                                    top_logprobs=2, include=["message.output_text.logprobs"])
        assert r.status == "completed" and r.text.format.type == fmt["type"]
        logprobs = r.output[0].content[0].logprobs
        assert "".join(t.token for t in logprobs) == r.output_text
        assert all(len(t.top_logprobs) == 2 for t in logprobs)


def test_stored_responses_get_delete_and_404(daemon):
    client = openai_client(daemon)
    r = client.responses.create(model="fake:1b", input="hi", metadata={"task": "t1"})
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == REPLY and got.metadata == {"task": "t1"}
    deleted = client.responses.delete(r.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    for call in (lambda: client.responses.retrieve(r.id),
                 lambda: client.responses.delete(r.id),
                 lambda: client.responses.create(model="fake:1b", input="x",
                                                 previous_response_id=r.id),
                 lambda: client.responses.retrieve("resp_nope"),
                 lambda: client.responses.retrieve("resp_..%2F..%2Fpasswd")):
        with pytest.raises(openai.NotFoundError) as caught:
            call()
        body = caught.value.body
        assert body["type"] == "invalid_request_error" and "no stored response" in \
            body["message"]
    unstored = client.responses.create(model="fake:1b", input="hi", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    assert not list((get_paths().data_dir / "responses").glob(f"{unstored.id}*"))


def test_input_items_lists_what_a_response_was_made_from(daemon):
    client = openai_client(daemon)
    first = client.responses.create(model="fake:1b", input=[
        {"role": "user", "content": "one"}, {"role": "assistant", "content": "two"},
        {"role": "user", "content": "three", "id": "msg_mine"}])
    second = client.responses.create(model="fake:1b", input="four",
                                     previous_response_id=first.id)
    page = client.responses.input_items.list(second.id, order="asc")
    assert [item.content[0].text for item in page.data] == ["one", "two", "three", REPLY,
                                                             "four"]
    # As OpenAI lists them: parts, not strings, and a status.
    raw = page.model_dump()["data"]
    assert [i["content"][0]["type"] for i in raw] == ["input_text", "output_text",
                                                       "input_text", "output_text", "input_text"]
    assert all(i["status"] == "completed" for i in raw)
    assert page.data[2].id == "msg_mine" and all(item.id for item in page.data)
    newest = client.responses.input_items.list(second.id, limit=2)
    assert [i.id for i in newest.data] == [page.data[4].id, page.data[3].id]
    assert newest.has_more and newest.first_id == page.data[4].id
    after = client.responses.input_items.list(second.id, order="asc", after="msg_mine")
    assert [i.id for i in after.data] == [page.data[3].id, page.data[4].id]
    with pytest.raises(openai.BadRequestError, match="limit"):
        client.responses.input_items.list(second.id, limit=0)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_nope")


def test_a_corrupt_stored_file_is_skipped_with_a_warning(daemon, caplog):
    client = openai_client(daemon)
    good = client.responses.create(model="fake:1b", input="hi")
    folder = get_paths().data_dir / "responses"
    whole = (folder / f"{good.id}.json").read_text()
    torn, garbage, wrong, nested = "resp_torn", "resp_garbage", "resp_wrong", "resp_nested"
    (folder / f"{torn}.json").write_text(whole[: len(whole) // 2])
    (folder / f"{garbage}.json").write_bytes(b"\xff\xfe\x00garbage")
    (folder / f"{wrong}.json").write_text('{"response": 1}')
    (folder / f"{nested}.json").write_text("[" * 100_000)  # deeper than json recurses
    with caplog.at_level(logging.WARNING, logger="localinfer"):
        for ident in (torn, garbage, wrong, nested):
            with pytest.raises(openai.NotFoundError):
                client.responses.retrieve(ident)
            with pytest.raises(openai.NotFoundError):
                client.responses.create(model="fake:1b", input="x", previous_response_id=ident)
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert all(ident in warned for ident in (torn, garbage, wrong, nested)), warned
    assert client.responses.retrieve(good.id).output_text == REPLY  # the others still serve
    assert client.responses.create(model="fake:1b", input="again",
                                   previous_response_id=good.id).status == "completed"


def test_previous_response_id_continues_after_a_restart(home):
    install_fake_models("fake:1b-f16")
    seen: list[str] = []

    def reply(prompt: str) -> str:
        seen.append(prompt)
        return f"answer {len(seen)}"

    with serve(fake_factory(reply=reply)) as d:
        first = openai_client(d).responses.create(model="fake:1b", input="The code is 4711.")
    with serve(fake_factory(reply=reply)) as d:  # a new daemon, the same data dir
        client = openai_client(d)
        second = client.responses.create(model="fake:1b", input="What is the code?",
                                         previous_response_id=first.id)
        third = client.responses.create(model="fake:1b", input="And now?",
                                        previous_response_id=second.id)
    assert second.output_text == "answer 2" and third.output_text == "answer 3"
    assert "The code is 4711." in seen[1] and "answer 1" in seen[1]
    assert all(s in seen[2] for s in ("4711", "answer 1", "What is the code?", "answer 2"))


def test_the_store_is_bounded(tmp_path):
    store = ResponseStore(tmp_path, max_count=3)
    for i in range(5):
        store.put(f"resp_{i}", {"response": {"id": i}, "conversation": []})
    assert sorted(p.stem for p in tmp_path.glob("resp_*.json")) == [
        "resp_2", "resp_3", "resp_4"]
    with pytest.raises(ValueError):
        store.put("../x", {"response": {}, "conversation": []})
    small = ResponseStore(tmp_path / "small", max_bytes=100)
    small.put("resp_a", {"response": {"x": "a" * 80}, "conversation": []})
    small.put("resp_b", {"response": {"x": "b" * 80}, "conversation": []})
    assert [p.stem for p in (tmp_path / "small").glob("resp_*.json")] == ["resp_b"]



def test_a_write_cut_off_by_a_crash_is_cleaned_up(tmp_path):
    store = ResponseStore(tmp_path)
    torn = tmp_path / ".resp_x.json.abc123.tmp"
    fresh = tmp_path / ".resp_y.json.def456.tmp"
    torn.write_text("{")
    fresh.write_text("{")  # another writer's, under way
    os.utime(torn, (time.time() - 600, time.time() - 600))
    store.put("resp_a", {"response": {"id": "resp_a"}, "conversation": []})
    assert not torn.exists() and fresh.exists()


# Codex 0.171.0's request, as recorded from `codex exec` against a stub server (texts and
# tool schemas abridged): no instructions (developer messages instead), function tools, a
# namespace of sub-agent tools, reasoning with a summary but no effort, store false,
# streamed, reasoning.encrypted_content included, prompt_cache_key and client_metadata.
CODEX_TOOLS = [
    {"type": "function", "name": "exec_command", "strict": False,
     "description": "Runs a command in a PTY, returning output or a session ID for ongoing"
                    " interaction.",
     "parameters": {"type": "object", "additionalProperties": False, "required": ["cmd"],
                    "properties": {"cmd": {"type": "string"}, "workdir": {"type": "string"},
                                   "tty": {"type": "boolean"},
                                   "yield_time_ms": {"type": "number"},
                                   "sandbox_permissions": {
                                       "type": "string",
                                       "enum": ["use_default", "require_escalated"]}}}},
    {"type": "function", "name": "view_image", "strict": False,
     "description": "View a local image file from the filesystem.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                    "required": ["path"], "additionalProperties": False}},
    {"type": "namespace", "name": "multi_agent_v1",
     "description": "Tools for spawning and managing sub-agents.", "tools": [
         {"type": "function", "name": "spawn_agent", "strict": False,
          "description": "Spawn a sub-agent.",
          "parameters": {"type": "object", "properties": {"message": {"type": "string"}},
                         "required": ["message"], "additionalProperties": False}}]},
    {"type": "function", "name": "get_goal", "strict": False,
     "description": "Get the current goal for this thread.",
     "parameters": {"type": "object", "properties": {}, "required": [],
                    "additionalProperties": False}},
]
CODEX_METADATA = {"x-codex-turn-metadata": json.dumps({"turn_id": "01a2", "sandbox":
                                                        "seccomp"}),
                  "session_id": "01a2493f", "turn_id": "01a2493f-9719"}


def _codex_body(input_items: list) -> dict:
    return {"model": "qwen3:1b", "stream": True, "input": input_items, "tools": CODEX_TOOLS,
            "tool_choice": "auto", "parallel_tool_calls": True,
            "reasoning": {"summary": "auto"}, "store": False,
            "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "01a2493f-9707-7822-aba7-1d76b9b17ca7",
            "client_metadata": CODEX_METADATA}


def _sse_events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def test_a_codex_shaped_turn(qwen3):
    user = [
        {"type": "message", "id": "msg_5d306b72", "role": "developer", "content": [
            {"type": "input_text", "text": "You are a coding agent running in the Codex"
                                           " CLI."}]},
        {"type": "message", "id": "msg_01a2493f-9762", "role": "developer", "content": [
            {"type": "input_text", "text": "<skills_instructions>none</skills_instructions>"}]},
        {"type": "message", "id": "msg_01a2493f-9763", "role": "user", "content": [
            {"type": "input_text", "text": "<environment_context><cwd>/w</cwd>"
                                           "</environment_context>"}]},
        {"type": "message", "id": "msg_01a2493f-977e", "role": "user", "content": [
            {"type": "input_text", "text": "Run shell: list the files."}]}]
    with qwen3.uds() as http:
        r = http.post("/v1/responses", json=_codex_body(user))
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/event-stream")
        events = _sse_events(r.text)
        assert all(f"event: {e['type']}" in r.text for e in events)
        done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
        assert [i["type"] for i in done] == ["reasoning", "function_call"]
        reasoning, call = done
        assert reasoning["encrypted_content"] is None and reasoning["summary"] == []
        assert call["name"] == "exec_command" and json.loads(call["arguments"]) == {
            "cmd": "ls"}
        assert events[-1]["type"] == "response.completed"
        # Codex sends the whole history back, the reasoning item and the call included.
        history = [*user, *done, {"type": "function_call_output", "call_id": call["call_id"],
                                  "output": "12 C"}]
        r = http.post("/v1/responses", json=_codex_body(history))
        assert r.status_code == 200, r.text
        final = _sse_events(r.text)[-1]["response"]
        assert final["status"] == "completed" and final["store"] is False
        assert final["output"][-1]["content"][0]["text"] == "It is 1 x 12 C."
        assert not list((get_paths().data_dir / "responses").glob("*.json"))  # store: false


def test_a_call_to_a_namespaced_tool_names_its_namespace(qwen3):
    client = openai_client(qwen3)
    r = client.responses.create(model="qwen3:1b", input="Spawn an agent.", store=False,
                                tools=[CODEX_TOOLS[2]])
    call = r.output[-1]
    assert (call.type, call.name, call.namespace) == ("function_call", "spawn_agent",
                                                      "multi_agent_v1")
    assert json.loads(call.arguments) == {"message": "go"}


def test_input_tokens_counts_what_the_response_reads(qwen3):
    """client.responses.input_tokens.count: the same tokens as the response's
    usage.input_tokens, with tools, reasoning and a stored previous response."""
    client = openai_client(qwen3)
    ask = {"model": "qwen3:1b", "input": "Weather in Paris?", "tools": [WEATHER],
           "instructions": "Use tools.", "reasoning": {"effort": "high"}}
    first = client.responses.create(**ask)
    counted = client.responses.input_tokens.count(**ask)
    assert counted.object == "response.input_tokens"
    assert counted.input_tokens == first.usage.input_tokens
    assert client.responses.input_tokens.count(model="qwen3:1b", input="Weather in Paris?"
                                               ).input_tokens < counted.input_tokens
    output = [{"type": "function_call_output", "call_id": first.output[-1].call_id,
               "output": "12 C"}]
    follow = {"model": "qwen3:1b", "previous_response_id": first.id, "tools": [WEATHER],
              "input": output}
    final = client.responses.create(**follow)
    assert client.responses.input_tokens.count(**follow).input_tokens == \
        final.usage.input_tokens
    with pytest.raises(openai.NotFoundError):
        client.responses.input_tokens.count(**{**follow, "previous_response_id": "resp_no"})
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.input_tokens.count(**ask, truncation="auto")
    assert "'truncation'" in caught.value.body["message"]


def test_cancel_and_compact_are_400s_that_say_why(daemon):
    """No background responses run here: cancelling a stored response is a 400 naming that
    (an unknown one a 404), and 'background: true' is refused by name; compaction is a
    400 naming it."""
    client = openai_client(daemon)
    stored = client.responses.create(model="fake:1b", input="hi")
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.cancel(stored.id)
    body = caught.value.body
    assert body["type"] == "invalid_request_error" and "background" in body["message"]
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_nope")
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="fake:1b", input="hi", background=True)
    assert "'background'" in caught.value.body["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.compact(model="fake:1b", input="hi")
    assert "compaction is not supported" in caught.value.body["message"]
    assert client.responses.retrieve(stored.id).status == "completed"
