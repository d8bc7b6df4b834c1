"""Fill-in-the-middle and autocomplete: the FIM prompt (repo-level context, SPM order, what is
cut when it does not fit), llama-server's t_max_predict_ms and n_indent, a newer request from
the same client cancelling the older one, and every route that takes a suffix (/infill,
/v1/completions, /api/generate) with the requests editors send, through the real openai and
ollama clients, on the fake backend."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from daemon_util import fake_factory, install_fake_models, ollama_client, openai_client, serve
from localinfer.errors import InvalidRequest
from localinfer.runtime.engine import REREAD_TAIL
from localinfer.runtime.fim import FimFile
from localinfer.runtime.text import TextAssembler
from localinfer.runtime.types import Priority, SamplingParams, Token


def echo(prompt: str) -> str:
    """A reply that shows the prompt the model read (FIM marks spelled out)."""
    return "|" + prompt.replace("<", "[").replace(">", "]") + "|"


def test_fim_prompt_in_prefix_suffix_middle_order(fake_engine):
    engine = fake_engine(fim=True)
    text = engine.backend.detokenize(engine.infill_tokens("def f(", "):", prompt="x"))
    assert text == "<bos><fim_prefix>def f(x<fim_suffix>):<fim_middle>"


def test_fim_prompt_suffix_first_for_spm_families(fake_engine):
    engine = fake_engine(fim=True, fim_spm=True)
    text = engine.backend.detokenize(engine.infill_tokens("def f(", "):"))
    assert text == "<bos><fim_suffix>):<fim_prefix>def f(<fim_middle>"


def test_fim_prompt_with_repo_level_context(fake_engine):
    engine = fake_engine(fim=True, fim_repo=True)
    files = [FimFile("util.py", "def g(): pass"), FimFile("", "x = 1")]
    text = engine.backend.detokenize(engine.infill_tokens("a", "b", extra=files))
    assert text == ("<bos><repo_name>myproject\n<file_sep>util.py\ndef g(): pass"
                    "<file_sep>tmp\nx = 1<file_sep>filename\n<fim_prefix>a<fim_suffix>b"
                    "<fim_middle>")
    plain = fake_engine(fim=True)  # no file tokens: llama-server's snippet separator
    text = plain.backend.detokenize(plain.infill_tokens("a", "b", extra=files[:1]))
    assert text == "<bos>\n\n--- snippet ---\n\ndef g(): pass<fim_prefix>a<fim_suffix>b<fim_middle>"


def test_fim_prompt_cut_to_the_context_keeps_the_cursor_and_whole_files(fake_engine):
    engine = fake_engine(fim=True, n_ctx=1024)
    prefix = " ".join(f"p{i}" for i in range(900))  # 1,799 tokens: words and spaces
    suffix = " ".join(f"s{i}" for i in range(300))
    files = [FimFile("far.py", "far " * 10), FimFile("near.py", "near")]
    tokens = engine.infill_tokens(prefix, suffix, extra=files, n_predict=64)
    text = engine.backend.detokenize(tokens)
    assert len(tokens) <= 1024 - 64
    assert "p899<fim_suffix>s0 s1" in text  # the cursor's neighbourhood stays
    assert "p0 " not in text and "s299" not in text
    assert "far" not in text or "near" in text  # files go whole, the farthest first
    # Typing on moves neither cut: the next keystroke's prompt starts with this one's prefix.
    longer = engine.infill_tokens(prefix + " q", suffix, extra=files, n_predict=64)
    head = tokens[:tokens.index(engine.backend._id("<fim_suffix>"))]
    assert longer[:len(head)] == head


def test_fim_needs_a_model_with_fim_tokens(fake_engine):
    with pytest.raises(InvalidRequest, match="fill-in-the-middle"):
        fake_engine().infill_tokens("a", "b")


def test_n_indent_ends_at_a_line_indented_less():
    text = TextAssembler(min_indent=4)
    pieces = ["    x = 1\n", "\n", "    ", "y = 2\n", "  ", "z = 3\n", "after"]
    shown = "".join(text.push(p.encode()) for p in pieces) + text.flush()
    # As llama-server cuts it: the line's text goes, its leading whitespace stays.
    assert shown == text.text == "    x = 1\n\n    y = 2\n  "
    assert text.stopped and text.indent_stopped


def test_t_max_predict_ms_stops_at_the_first_line_end_after_the_time(fake_engine):
    """llama-server's rule (tools/server/server-context.cpp in the vendored llama.cpp): "if we
    have seen a new line, we stop after a certain time limit, but only upon another new line":
    the completion ends with a whole line, never a cut one; a line that does not end runs on."""
    lines = "first\n" + "word word word\n" * 60
    engine = fake_engine(reply=lines, step_delay_s=0.005)
    done = engine.complete("x", SamplingParams(max_tokens=500, t_max_predict_ms=30)).result()
    assert done.finish_reason == "length"
    assert done.text.endswith("word\n") and 1 <= done.text.count("\n") < 40
    whole = engine.complete("x", SamplingParams(max_tokens=500)).result()
    assert whole.text == lines
    # A line that runs on past the time is not cut: it ends where its line ends.
    long_line = fake_engine(reply="first\n" + "word " * 60 + "\nnext\n", step_delay_s=0.005)
    done = long_line.complete("x", SamplingParams(max_tokens=500, t_max_predict_ms=30)).result()
    assert done.text == "first\n" + "word " * 60 + "\n"
    # One line: no limit (llama-server's too), the whole line comes.
    one_line = fake_engine(reply="word " * 60, step_delay_s=0.005)
    done = one_line.complete("x", SamplingParams(max_tokens=500, t_max_predict_ms=30)).result()
    assert done.finish_reason == "stop" and done.text.count("word") == 60


def test_a_newer_request_with_the_same_key_cancels_the_older(fake_engine):
    engine = fake_engine(fim=True, reply="tok " * 200, step_delay_s=0.005, n_slots=1)
    params = SamplingParams(max_tokens=200, supersede="editor-1")
    prefix = "import os\n\n\ndef main():\n    return os.getcwd()\n\n\ndef f("
    first = engine.submit(engine.infill_tokens(prefix, "):"), params,
                          priority=Priority.INTERACTIVE)
    events = iter(first)
    next(events)  # running
    second = engine.submit(engine.infill_tokens(prefix + "x", "):"), params,
                           priority=Priority.INTERACTIVE)
    assert first.result().finish_reason == "cancelled"
    done = second.result()
    assert done.finish_reason == "length"
    # The newer request reused the older one's KV cache up to where they part.
    assert done.usage.cached_tokens >= 10
    other = engine.submit(engine.infill_tokens("a", "b"),
                          SamplingParams(max_tokens=3, supersede="editor-2"))
    assert other.result().finish_reason == "length"


# --- over HTTP -------------------------------------------------------------------------------
@pytest.fixture
def coder(home):
    install_fake_models("coder:1b-f16", "chat:1b-f16")
    with serve(fake_factory(reply=echo, fim=True, fim_repo=True)) as d:
        yield d


def test_openai_completions_with_suffix_as_minuet_and_continue_send_it(coder):
    client = openai_client(coder)
    # minuet-ai.nvim's openai_fim_compatible provider
    chunks = list(client.completions.create(model="coder:1b", prompt="def f(", suffix="):",
                                            max_tokens=56, top_p=0.9, stream=True))
    text = "".join(c.choices[0].text for c in chunks)
    assert text == "|[bos][repo_name]myproject\n[file_sep]filename\n[fim_prefix]def f(" \
                   "[fim_suffix]):[fim_middle]|"
    # Continue's OpenAI provider (_streamFim), not streamed here
    out = client.completions.create(model="coder:1b", prompt="x = ", suffix="\n", max_tokens=8,
                                    temperature=0.01, top_p=0.95, frequency_penalty=0,
                                    presence_penalty=0, stop=["\n\n"])
    assert out.choices[0].text.startswith("|[bos]")


def test_ollama_generate_with_suffix_as_continue_sends_it(coder):
    client = ollama_client(coder)
    parts = list(client.generate(model="coder:1b", prompt="def f(", suffix="):", raw=True,
                                 stream=True, keep_alive=1800,
                                 options={"temperature": 0.01, "num_predict": 256,
                                          "stop": ["<|endoftext|>"], "num_ctx": 1024}))
    assert "".join(p.response for p in parts).endswith("[fim_suffix]):[fim_middle]|")


def test_ollama_generate_reads_fim_tokens_without_raw(coder):
    # llm.nvim's Ollama backend: the FIM prompt spelled out, no raw
    out = ollama_client(coder).generate(
        model="coder:1b", prompt="<fim_prefix>def f(<fim_suffix>):<fim_middle>")
    assert out.response == "|[bos][fim_prefix]def f([fim_suffix]):[fim_middle]|"


def test_ollama_generate_raw_fim_prompt_as_zed_sends_it(coder):
    # Zed's Ollama edit prediction: its own FIM prompt, raw, not streamed
    out = ollama_client(coder).generate(
        model="coder:1b", prompt="<fim_prefix>x = <fim_suffix>\n<fim_middle>", raw=True,
        stream=False, options={"num_predict": 128, "temperature": 0.2,
                               "stop": ["<fim_pad>", "\n\n"]})
    assert out.response == "|[bos][fim_prefix]x = [fim_suffix]\n[fim_middle]|"


def test_ollama_generate_does_not_chat_wrap_base_models(home):
    install_fake_models("base:1b-f16")
    with serve(fake_factory(reply=echo, base_model=True)) as d:
        out = ollama_client(d).generate(model="base:1b", prompt="Once upon a time")
        assert out.response == "|[bos]Once upon a time|"


LLAMA_VSCODE = {  # llama.vscode's request (src/llama-server.ts createRequestPayload), with
    # its setting max_parallel_completions at 1 (n_cmpl: 3 by default, below)
    "id_slot": 0, "input_prefix": "import os\n\ndef main():\n", "input_suffix": "\n    return 0\n",
    "input_extra": [{"filename": "util.py", "text": "def helper(): pass\n"}],
    "prompt": "    ", "n_predict": 128, "n_cmpl": 1, "top_k": 40, "top_p": 0.99, "stream": False,
    "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "n_indent": 4,
    "t_max_prompt_ms": 500, "t_max_predict_ms": 500,
}
LLAMA_VSCODE_PREP = {  # its request that reads new context chunks ahead (noPredict)
    "id_slot": 0, "input_prefix": "", "input_suffix": "",
    "input_extra": LLAMA_VSCODE["input_extra"], "prompt": "", "n_predict": 0, "samplers": [],
    "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1,
}


def three_completions(engine, prompt, *, seeds=(1, 2, 3), **params):
    """A prompt's completions as llama.vscode asks them (n_cmpl): the first and the others
    that follow it, each with its own seed."""
    first = engine.submit(prompt, SamplingParams(seed=seeds[0], **params))
    return [first] + [engine.submit(prompt, SamplingParams(seed=seed, **params), follows=first)
                      for seed in seeds[1:]]


def first_leaves_at_its_third_token(engine, prompt):
    """Two completions of ``prompt``, the first's client leaving at its third token: the
    second's reply."""
    first, second = three_completions(engine, prompt, seeds=(1, 2), max_tokens=100)
    for event in first:
        if isinstance(event, Token) and event.live.n_tokens == 3:
            first.cancel()
    assert first.result().finish_reason == "cancelled"
    return second.result()


def test_completions_that_write_alike_ride_on_one_row(fake_engine):
    """n_cmpl: the other completions wait until the first has read the prompt and sample
    their first tokens from its logits; while they write what it writes they decode no row
    of their own (one row a step for three completions), copy no cache and take no slot
    (three completions on two slots, the other holding another editor's file)."""
    engine = fake_engine(fim=True, reply="abc def ghi", prompt_delay_s=0.002, n_slots=2)
    other = engine.completion_tokens("another editor's file " * 20)
    engine.submit(other, SamplingParams(max_tokens=2)).result()
    prompt = engine.infill_tokens(" ".join(f"w{i}" for i in range(200)), "end")
    rows_before = sum(engine.backend.decode_calls)
    done = [g.result() for g in three_completions(engine, prompt, max_tokens=20)]
    assert [d.text for d in done] == ["abc def ghi"] * 3
    assert [d.timings.cached_tokens for d in done] == [0, len(prompt), len(prompt)]
    assert done[1].timings.setup_ms == done[1].timings.prefill_ms == 0  # no read, no wait
    assert engine.backend.loaded == []  # nothing copied
    # The prompt, then one row for each token the first sampled but the last (the end of
    # generation, never decoded).
    decoded = len(prompt) + done[0].usage.completion_tokens - 1
    assert sum(engine.backend.decode_calls) - rows_before == decoded
    again = engine.submit(other, SamplingParams(max_tokens=2)).result()
    assert again.usage.cached_tokens == len(other) - REREAD_TAIL


def test_a_completion_that_writes_otherwise_parts_with_a_copy(fake_engine):
    """A completion whose token is not its leader's parts: it copies the cache they shared
    (the prompt and the tokens before that one) and decodes on in its own slot."""
    engine = fake_engine(fim=True, reply="abc def ghi", seeded={2: "abc xyz"},
                         prompt_delay_s=0.002)
    prompt = engine.infill_tokens(" ".join(f"w{i}" for i in range(200)), "end")
    done = [g.result() for g in three_completions(engine, prompt, max_tokens=20)]
    assert [d.text for d in done] == ["abc def ghi", "abc xyz", "abc def ghi"]
    assert engine.backend.loaded == [len(prompt) + 2]  # the prompt, "abc" and " "


def test_a_completion_that_parts_with_no_slot_free_waits_and_reads_back(fake_engine):
    """Three completions ride in the one slot another request leaves free; the one that
    writes otherwise finds no slot to part into, waits for one and reads the cache it shared
    back (or copies it, if its leader's slot still holds it then)."""
    engine = fake_engine(fim=True, reply="abc def ghi", seeded={2: "abc xyz", 9: "tok " * 40},
                         n_slots=2, step_delay_s=0.002)
    busy = engine.submit(engine.completion_tokens("another editor"),
                         SamplingParams(seed=9, max_tokens=100))
    prompt = engine.infill_tokens(" ".join(f"w{i}" for i in range(200)), "end")
    done = [g.result() for g in three_completions(engine, prompt, max_tokens=20)]
    assert [d.text for d in done] == ["abc def ghi", "abc xyz", "abc def ghi"]
    assert busy.result().text == "tok " * 40


def test_a_completion_whose_leader_leaves_the_only_slot_reads_back(fake_engine, caplog):
    """One slot: the first's client leaves while the other rides; no other slot to part into,
    it waits for the one the first leaves and reads the cache they shared back there."""
    engine = fake_engine(fim=True, reply="t " * 30, step_delay_s=0.005, n_slots=1)
    prompt = engine.infill_tokens(" ".join(f"w{i}" for i in range(50)), "end")
    assert first_leaves_at_its_third_token(engine, prompt).text == "t " * 30
    assert "decode failed" not in caplog.text  # no step with nothing to decode


def test_a_completion_goes_on_alone_when_its_leader_ends(fake_engine):
    """The first completion ends (its end of generation, or its client left): the others
    copy the cache they shared and go on."""
    engine = fake_engine(fim=True, reply="abc def ghi", seeded={1: "abc"},
                         prompt_delay_s=0.002)
    prompt = engine.infill_tokens(" ".join(f"w{i}" for i in range(200)), "end")
    done = [g.result() for g in three_completions(engine, prompt, seeds=(1, 2),
                                                  max_tokens=20)]
    assert [d.text for d in done] == ["abc", "abc def ghi"]
    assert engine.backend.loaded == [len(prompt) + 1]

    engine = fake_engine(fim=True, reply="t " * 30, step_delay_s=0.005)
    assert first_leaves_at_its_third_token(engine, prompt).text == "t " * 30
    assert len(engine.backend.loaded) == 1 and engine.backend.loaded[0] > len(prompt)


def test_another_completion_reads_the_prompt_when_its_leader_is_cancelled(fake_engine):
    engine = fake_engine(fim=True, reply="abc", step_delay_s=0.05)
    prompt = engine.infill_tokens("x " * 50, "y")
    busy = [engine.submit(prompt[:5] + [7] * i, SamplingParams(max_tokens=40))
            for i in range(1, 5)]  # every slot taken: the first waits in the queue
    first = engine.submit(prompt, SamplingParams(max_tokens=3))
    second = engine.submit(prompt, SamplingParams(max_tokens=3), follows=first)
    first.cancel()
    for generation in busy:
        generation.cancel()
    assert second.result().text == "abc"
    assert first.result().finish_reason == "cancelled"
    assert engine.backend.loaded == []  # nothing to copy: it read the prompt itself


def test_infill_with_llama_vscode_request(coder):
    with coder.tcp() as http:
        reply = http.post("/infill", json={**LLAMA_VSCODE, "model": "coder:1b"})
        assert reply.status_code == 200, reply.text
        # n_indent 4: the reply's second line starts at column 0, which ends it
        assert reply.json()["content"] == "|[bos][repo_name]myproject\n"
        assert reply.json()["stop_type"] == "limit"
        # A stop string met: llama-server's "word", and which one.
        worded = http.post("/infill", json={**LLAMA_VSCODE, "model": "coder:1b",
                                            "stop": ["myproject"]}).json()
        assert worded["content"] == "|[bos][repo_name]"
        assert (worded["stop_type"], worded["stopping_word"]) == ("word", "myproject")
        body = http.post("/infill", json={**LLAMA_VSCODE, "model": "coder:1b",
                                          "n_indent": 0}).json()
    assert body["content"].startswith("|[bos][repo_name]myproject\n[file_sep]util.py\n")
    assert "[fim_prefix]import os\n\ndef main():\n    [fim_suffix]" in body["content"]
    assert body["stop"] is True and body["stop_type"] in ("eos", "limit")
    assert body["tokens_evaluated"] > 10 and body["timings"]["predicted_n"] > 0
    assert {"prompt_n", "prompt_ms", "prompt_per_second", "predicted_per_second"} <= set(
        body["timings"])
    # Its status line (src/statusbar.ts, show_info on by default) reads
    # generation_settings.n_ctx: without the object it throws, and the cached next
    # suggestions that callback then makes are never made.
    n_ctx = coder.manager.loaded["coder:1b-f16"].engine.info.n_ctx
    assert body["generation_settings"]["n_ctx"] == n_ctx > 0
    assert body["generation_settings"]["top_k"] == LLAMA_VSCODE["top_k"]


def test_infill_with_llama_vscode_parallel_completions(coder):
    """llama.vscode's default request asks three completions (n_cmpl: 3) of slot 0: an array
    of three replies, the two others copying the prompt the first read."""
    with coder.tcp() as http:
        reply = http.post("/infill", json={**LLAMA_VSCODE, "model": "coder:1b", "n_cmpl": 3,
                                           "input_prefix": "import os\n" * 40})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert [r["index"] for r in body] == [0, 1, 2]
        assert all(r["content"] == "|[bos][repo_name]myproject\n" for r in body)
        evaluated = body[0]["tokens_evaluated"]
        assert [r["timings"]["cache_n"] for r in body] == [0] + [evaluated] * 2
        # llama-server's tokens_cached: what the slot holds after the reply.
        assert all(r["tokens_cached"] == evaluated + r["tokens_predicted"] - 1 for r in body)
        alias = {**LLAMA_VSCODE, "model": "coder:1b", "n": 2}
        del alias["n_cmpl"]
        assert http.post("/infill", json=alias).json()[1]["index"] == 1  # llama-server's
        too_many = http.post("/infill", json={**LLAMA_VSCODE, "model": "coder:1b",
                                              "n_cmpl": 7})
        assert too_many.status_code == 400
        # llama-server's words: llama.vscode recognises them and names its setting
        assert too_many.json()["error"]["message"].startswith(
            "Field 'n_cmpl': Value must be between 1 <= value <= 4, but got 7")
        streamed = http.post("/infill", json={**LLAMA_VSCODE, "model": "coder:1b",
                                              "n_cmpl": 3, "stream": True})
        assert streamed.status_code == 200, streamed.text
        events = [json.loads(line[6:]) for line in streamed.text.splitlines()
                  if line.startswith("data: ")]
        finals = sorted((e["index"], e["content"]) for e in events if e["stop"])
        assert finals == [(0, ""), (1, ""), (2, "")]  # the text came in the events before
        assert all("".join(e["content"] for e in events if e["index"] == i) ==
                   "|[bos][repo_name]myproject\n" for i in range(3))


def test_infill_with_llama_vscode_context_ahead(coder):
    """Its n_predict 0 request reads the context chunks into the cache and predicts nothing;
    the completion after it finds them there."""
    with coder.tcp() as http:
        ahead = http.post("/infill", json={**LLAMA_VSCODE_PREP, "model": "coder:1b"})
        assert ahead.status_code == 200, ahead.text
        body = ahead.json()
        assert body["content"] == "" and body["tokens_predicted"] == 0
        assert body["timings"]["predicted_n"] == 0 and body["tokens_evaluated"] > 5
        after = http.post("/infill", json={**LLAMA_VSCODE, "model": "coder:1b"}).json()
    # the prompt's start: <bos><repo_name>myproject\n<file_sep>util.py\n ... the file
    assert after["timings"]["cache_n"] >= body["tokens_evaluated"] - REREAD_TAIL - 3


def test_infill_with_llama_vim_requests(coder):
    """llama.vim (autoload/llama.vim): its ring-buffer update (n_predict 0, no samplers, only
    the field "" asked back) and its completion (slot 0, the fields it shows)."""
    extra = [{"filename": "util.py", "text": "def helper(): pass\n" * 20}]
    with coder.tcp() as http:
        ahead = http.post("/infill", json={
            "id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": extra,
            "prompt": "", "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": False,
            "cache_prompt": True, "t_max_prompt_ms": 1, "t_max_predict_ms": 1,
            "response_fields": [""], "model": "coder:1b"})
        assert ahead.status_code == 200 and ahead.json() == {}, ahead.text
        fields = ["content", "timings/prompt_n", "timings/predicted_n", "truncated",
                  "tokens_cached"]
        reply = http.post("/infill", json={
            "id_slot": 0, "input_prefix": "def main():\n", "input_suffix": "\n",
            "input_extra": extra, "prompt": "    ", "n_predict": 128, "stop": [],
            "n_indent": 4, "top_k": 40, "top_p": 0.90, "samplers": ["top_k", "top_p", "infill"],
            "stream": False, "cache_prompt": True, "t_max_prompt_ms": 500,
            "t_max_predict_ms": 250, "response_fields": fields, "model": "coder:1b"})
        assert reply.status_code == 200, reply.text
        body = reply.json()
    assert set(body) == set(fields) and body["content"].startswith("|[bos][repo_name]")
    assert body["tokens_cached"] > 100  # the context the update read


def test_infill_with_a_bad_stream_value_holds_no_model(coder):
    """The 400 comes before the generation starts: no lease left held, nothing running."""
    with coder.tcp() as http:
        reply = http.post("/infill", json={**LLAMA_VSCODE, "model": "coder:1b",
                                           "typical_p": 0.9, "mirostat": 0, "stream": "true"})
        assert reply.status_code == 400 and "stream" in reply.text, reply.text
    loaded = coder.manager.loaded.get("coder:1b-f16")
    assert loaded is None or loaded.in_flight == 0


def test_infill_with_llama_vim_response_fields(coder):
    fields = ["content", "timings/prompt_n", "timings/predicted_per_second", "truncated",
              "tokens_cached", "timings/nonexistent"]
    with coder.tcp() as http:
        body = http.post("/infill", json={**LLAMA_VSCODE, "model": "coder:1b", "n_indent": 0,
                                          "response_fields": fields}).json()
    assert set(body) == set(fields) - {"timings/nonexistent"}
    assert body["timings/prompt_n"] > 0 and body["content"].startswith("|[bos]")


def test_infill_streams_and_picks_the_loaded_fim_model(coder):
    ollama_client(coder).generate(model="coder:1b", prompt="warm", raw=True)  # loads it
    with coder.tcp() as http, http.stream("POST", "/infill", json={
            "input_prefix": "a", "input_suffix": "b", "stream": True}) as reply:
        assert reply.status_code == 200
        events = [line for line in reply.iter_lines() if line.startswith("data: ")]
    import json
    objects = [json.loads(e[6:]) for e in events]
    assert objects[-1]["stop"] is True and not any(o["stop"] for o in objects[:-1])
    assert "".join(o["content"] for o in objects).endswith("[fim_middle]|")


def test_infill_refuses_what_it_cannot_honour(coder):
    with coder.tcp() as http:
        for body, word in [({"n_probs": 3}, "n_probs"), ({"return_tokens": True}, "return_tokens"),
                           ({"n_cmpl": 0}, "n_cmpl"), ({"grammar": 7}, "grammar"),
                           ({"cache_prompt": False}, "cache_prompt"),
                           ({"samplers": ["mirostat"]}, "mirostat"),
                           ({"samplers": ["top_k", "infill"],
                             "json_schema": {"type": "object"}}, "infill"),
                           ({"input_extra": "x"}, "input_extra"),
                           ({"n_indent": -1}, "n_indent")]:
            reply = http.post("/infill", json={"model": "coder:1b", "input_prefix": "a",
                                               **body})
            assert reply.status_code == 400 and word in reply.text, (body, reply.text)


def test_infill_needs_a_model_when_none_is_loaded(home):
    install_fake_models("coder:1b-f16")
    with serve(fake_factory(fim=True)) as d, d.tcp() as http:
        reply = http.post("/infill", json={"input_prefix": "a"})
        assert reply.status_code == 400 and "'model'" in reply.text


def test_a_keystroke_cancels_the_previous_completion_over_http(home):
    install_fake_models("coder:1b-f16")
    with serve(fake_factory(reply="tok " * 400, fim=True, step_delay_s=0.01, n_slots=1)) as d:
        results: dict[str, dict] = {}

        def send(key: str, prefix: str) -> None:
            with d.tcp() as http:
                results[key] = http.post("/infill", json={
                    "model": "coder:1b", "input_prefix": "import os\n" * 8 + prefix,
                    "input_suffix": "",
                    "n_predict": 400}).json()

        first = threading.Thread(target=send, args=("first", "def f(x"))
        first.start()
        time.sleep(0.5)  # it is generating
        send("second", "def f(xy")
        first.join(10)
    assert results["first"]["superseded"] is True and results["first"]["stop_type"] == "none"
    assert results["second"]["superseded"] is False
    assert results["second"]["tokens_predicted"] == 400
    assert results["second"]["timings"]["cache_n"] >= 10  # the older request's cache


def test_a_different_file_is_not_cancelled(home):
    install_fake_models("coder:1b-f16")
    with serve(fake_factory(reply="tok " * 100, fim=True, step_delay_s=0.005, n_slots=2)) as d:
        with httpx.Client(base_url=d.url, timeout=30) as a, \
                httpx.Client(base_url=d.url, timeout=30) as b:
            out: list = []
            t = threading.Thread(target=lambda: out.append(a.post("/infill", json={
                "model": "coder:1b", "input_prefix": "# one.py\n", "n_predict": 100}).json()))
            t.start()
            time.sleep(0.2)
            b.post("/infill", json={"model": "coder:1b", "input_prefix": "# two.py\n",
                                    "n_predict": 5})
            t.join(10)
    assert out[0]["superseded"] is False and out[0]["tokens_predicted"] == 100


def test_files_that_begin_alike_do_not_cancel_each_other(home):
    # Two files with the same licence header: keyed on their start alone, the second's
    # completion cancelled the first's (on /v1/completions it looked like an empty reply).
    header = "# Licensed under the Apache License, Version 2.0 (the \"License\").\n" * 6
    install_fake_models("coder:1b-f16")
    with serve(fake_factory(reply="tok " * 100, fim=True, step_delay_s=0.005, n_slots=2)) as d:
        client = openai_client(d)
        out: list = []
        t = threading.Thread(target=lambda: out.append(client.completions.create(
            model="coder:1b", prompt=header + "def load_config(", suffix="):\n    pass\n",
            max_tokens=100, extra_body={"speculative": False})))
        t.start()
        time.sleep(0.2)
        client.completions.create(model="coder:1b", prompt=header + "class Circle(",
                                  suffix="):\n    radius = 1\n", max_tokens=5)
        t.join(10)
    assert out[0].choices[0].finish_reason == "length"  # all 100 tokens, not cut short
