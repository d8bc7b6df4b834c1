"""The editor workload's requests and figures (the servers themselves are run by
bench/editor_workload.py, not by the tests)."""

from __future__ import annotations

from localinfer.bench.editor_workload import (
    FIM_DEFAULTS,
    Figures,
    completion_tokens,
    fim_body,
    pct,
    prompt_figures,
    source_file,
    table,
)


def test_a_fim_request_is_llama_vscodes_split_of_the_file_at_the_cursor():
    text = source_file(1, 170)
    assert len(text.splitlines()) == 170
    cursor = text.index("        if value >", len(text) // 2) + len("        if val")
    extra = [{"filename": "other.py", "text": "x = 1\n"}]
    body = fim_body(text, cursor, extra, "coder", 128)
    # The whole file before the line (under 256 lines), the line to the cursor, and after it.
    assert text.startswith(body["input_prefix"] + body["prompt"] + body["input_suffix"])
    assert body["prompt"] == "        if val" and body["n_indent"] == 8
    assert body["input_suffix"].startswith("ue >")
    assert len(body["input_suffix"].splitlines()) == 65  # the line's rest and 64 more
    assert body["input_extra"] == extra and body["model"] == "coder"
    assert body["n_predict"] == 128 and body["stream"] is False
    assert {k: body[k] for k in FIM_DEFAULTS} == FIM_DEFAULTS


def test_percentiles_are_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert (pct(values, 50), pct(values, 95), pct([], 50)) == (50.0, 95.0, None)
    assert pct([7.0], 95) == 7.0


def test_both_servers_reply_figures_are_read():
    llama_server = {"content": "x", "tokens_predicted": 12,
                    "timings": {"prompt_n": 1372, "prompt_ms": 250.5, "predicted_n": 12}}
    localinfer = {"content": "x", "timings": {"completion_tokens": 9, "prompt_tokens": 1370,
                                              "ttft_ms": 120.0}}
    assert completion_tokens(llama_server) == 12 and completion_tokens(localinfer) == 9
    assert prompt_figures(llama_server) == (250.5, 1372)
    assert prompt_figures(localinfer) == (120.0, 1370)
    assert completion_tokens({"usage": {"completion_tokens": 4}}) == 4


def test_the_table_puts_servers_side_by_side():
    a, b = Figures("localinfer", wall_s=10.0), Figures("llama-server", wall_s=20.0)
    a.chat_ttft_ms, a.chat_tokens, a.fim_tokens = [100.0, 300.0], 50, 50
    b.errors.append("infill: HTTP 500")
    text = table([{**a.summary(), "load_before": 1.5, "load_after": 2.25}, b.summary()])
    header, *rows = text.splitlines()
    assert header.split() == ["localinfer", "llama-server"]
    assert "100 / 300" in rows[0] and "– / –" in rows[0]
    assert any(row.startswith("aggregate tok/s") and "10" in row for row in rows)
    assert any(row.startswith("load average") and "1.5 / 2.25" in row for row in rows)
    assert rows[-1] == "llama-server: infill: HTTP 500"


def test_serial_editors_keep_one_request_in_flight_and_abort_none(home):
    """``serial_editors``: each editor has at most one /infill in flight and aborts none (the
    daemon sees no client leave); a keystroke that came while one ran and was followed by
    another is never sent; every burst's last keystroke is answered and timed."""
    import asyncio

    from daemon_util import fake_factory, install_fake_models, serve
    from localinfer.bench.editor_workload import Target, Workload, run_workload

    install_fake_models("coder:1b-f16")
    with serve(fake_factory(reply="x = 1\n", fim=True, step_delay_s=0.02)) as d:
        target = Target("localinfer", d.url, "coder:1b", "coder:1b", "coder:1b")
        w = Workload(editors=2, fim_completed=2, burst=3, completions=1, kinds=("fim",),
                     serial_editors=True, file_lines=40)
        out = asyncio.run(run_workload(target, w))
        state = d.daemon.state
        assert not out.errors
        assert len(out.fim_latency_ms) == 2 * 2  # each burst's last keystroke
        assert out.fim_cancelled > 0  # middle keystrokes that waited and were superseded
        assert sum(state.counters.clients_left.values()) == 0  # nothing aborted
        sent = state.counters.requests[("infill", 200)]
        assert sent == 2 * 2 * 3 - out.fim_cancelled
