"""Prompt reading at agent lengths: localinfer's daemon beside llama-server and llama-bench on
the same file and the same llama.cpp.

    python bench/prefill_lengths.py --llama-server PATH [--llama-bench PATH] [--model F.gguf]
        [--lengths 1024,4096,16384,32000]

For each length, a prompt of that many tokens (this project's own source, cut to length with
the model's tokenizer, a unique first line so that no server finds it cached) is sent once to
``localinfer serve`` and once to ``llama-server``, each at its own defaults, through
``/v1/completions`` with ``max_tokens`` 1 and one ``httpx.Client``: the TTFT the client saw and
the server's own prefill figure (localinfer's ``timings``, llama-server's ``prompt_ms``).
``llama-bench -p N -n 0 -r 1`` reads the same lengths with flash attention off and on: the
library's rate with no server around it. ``localinfer bench --prefill`` measures the engine
alone, for each attention set-up.

A 32k-token prompt takes a minute or more on a 2-core CPU: each server reads every length once
(about 5 minutes in all for the starter there, and as long again for llama-bench).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from llama_cpp import Llama

from localinfer import gguf
from localinfer.bench.editor_workload import start_llama_server_process, start_localinfer, stop
from localinfer.hardware.probe import probe_cpu
from localinfer.loading import fallback_template
from localinfer.store import ModelStore
from streaming import stream

LENGTHS = (1024, 4096, 16384, 32000)
"""32,000 rather than 32,768: the prompt and the token it generates fit a 32k-trained model."""


def source_text() -> str:
    root = Path(__file__).resolve().parent.parent / "localinfer"
    return "".join(f"### {p.relative_to(root.parent)}\n{p.read_text()}\n"
                   for p in sorted(root.rglob("*.py")))


def prompts(model: Path, lengths: list[int]) -> dict[int, str]:
    """Text of about ``n`` tokens for each length (the servers' own tokenizing may differ by a
    token or two: their reported counts are printed)."""
    vocab = Llama(str(model), vocab_only=True, verbose=False)
    text = source_text()
    tokens = vocab.tokenize(text.encode(), add_bos=False)
    while len(tokens) < max(lengths):
        tokens += tokens
    out = {}
    for n in lengths:
        head = f"Request {n} at {time.time_ns()}.\n"
        body = vocab.detokenize(tokens[: n - len(vocab.tokenize(head.encode())) - 1])
        out[n] = head + body.decode("utf-8", "replace")
    return out


def server_rows(url: str, model_name: str, texts: dict[int, str], http: httpx.Client,
                ) -> list[dict]:
    rows = []
    for n, text in texts.items():
        reply = stream(http, f"{url}/v1/completions",
                       {"model": model_name, "prompt": text, "max_tokens": 1, "temperature": 0})
        timings = reply["server"]
        server_ms = float(timings.get("ttft_ms", timings.get("prompt_ms", 0.0)))
        tokens = (reply["usage"] or {}).get("prompt_tokens") or timings.get("prompt_n") or n
        rows.append({"length": n, "prompt_tokens": tokens, "ttft_ms": reply["ttft_ms"],
                     "server_ms": server_ms, "tok_s": tokens / (server_ms / 1000)
                     if server_ms else 0.0})
        print(f"  {n}: {json.dumps(rows[-1])}", flush=True)
    return rows


def llama_bench(binary: Path, model: Path, lengths: list[int]) -> dict[tuple[int, int], float]:
    out = {}
    for fa in (0, 1):
        run = subprocess.run([str(binary), "-m", str(model), "-p", ",".join(map(str, lengths)),
                              "-n", "0", "-r", "1", "-fa", str(fa), "-o", "json"],
                             capture_output=True, text=True, timeout=7200)
        if run.returncode != 0:
            print(f"llama-bench -fa {fa} failed: {run.stderr[-500:]}", file=sys.stderr)
            continue
        for row in json.loads(run.stdout):
            out[(fa, int(row["n_prompt"]))] = float(row["avg_ts"])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-server", type=Path, required=True, metavar="PATH")
    parser.add_argument("--llama-bench", type=Path, default=None, metavar="PATH")
    parser.add_argument("--model", type=Path, default=None,
                        help="GGUF all three read (default: the starter)")
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)), metavar="N,N,...")
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    for binary in (args.llama_server, args.llama_bench):
        if binary is not None and not shutil.which(str(binary)):
            print(f"no such program: {binary}", file=sys.stderr)
            return 2
    model = (args.model or ModelStore().resolve("gemma3:270m").path).resolve()
    logs = Path(tempfile.mkdtemp(prefix="prefill-lengths-"))
    cpu = probe_cpu()
    print(f"model {model}\nCPU {cpu.model}, {cpu.physical_cores} cores, AVX-512:"
          f" {'avx512f' in cpu.flags}; logs in {logs}", flush=True)
    texts = prompts(model, lengths)
    server_args: list[str] = []
    template = fallback_template(gguf.read_header(model), None)
    if template is not None:  # the same template as localinfer's (only chats use it here)
        (logs / "chat-template.jinja").write_text(template)
        server_args += ["--jinja", "--chat-template-file", str(logs / "chat-template.jinja")]
    results: dict[str, list[dict]] = {}
    with httpx.Client(timeout=3600, limits=httpx.Limits(max_keepalive_connections=0)) as http:
        print("localinfer serve (defaults):", flush=True)
        (logs / "home").mkdir()
        procs, target = start_localinfer(model, model, logs / "home", logs / "localinfer.log")
        try:
            results["localinfer"] = server_rows(target.url, target.chat_model, texts, http)
        finally:
            stop(procs)
        print(f"llama-server {' '.join(server_args)} (defaults):", flush=True)
        proc, url = start_llama_server_process(args.llama_server, model, server_args,
                                               logs / "llama-server.log")
        try:
            results["llama-server"] = server_rows(url, "bench", texts, http)
        finally:
            stop([proc])
    bench = llama_bench(args.llama_bench, model, lengths) if args.llama_bench else {}

    print("\n| prompt | localinfer tok/s (TTFT s) | llama-server tok/s (TTFT s) | TTFT ratio |"
          + (" llama-bench -fa 0 / 1 tok/s |" if bench else ""))
    print("|---|---|---|---|" + ("---|" if bench else ""))
    for ours, theirs in zip(results["localinfer"], results["llama-server"], strict=True):
        n = ours["length"]
        line = (f"| {n:,} | {ours['tok_s']:.0f} ({ours['ttft_ms'] / 1000:.1f}) |"
                f" {theirs['tok_s']:.0f} ({theirs['ttft_ms'] / 1000:.1f}) |"
                f" {ours['ttft_ms'] / theirs['ttft_ms']:.2f}x |")
        if bench:
            line += f" {bench.get((0, n), 0):.0f} / {bench.get((1, n), 0):.0f} |"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
