"""Autocomplete on a file being typed: how much of each keystroke's FIM prompt the KV cache of
the previous keystroke's request saves, in prefix-suffix-middle (PSM) and suffix-first (SPM)
order, against a cold cache.

A ~1,500-token Python file is "typed" at a cursor in its middle, one character per request, as
an editor sends one FIM request per keystroke; each request generates a few greedy tokens. It
prints, for each mode, the median time to first token and the median prompt tokens found in the
cache. The starter model has no FIM tokens, so its control tokens stand in for them (the prompt's
shape and the cache's behaviour are those of a code model; the completions mean nothing).

Measured on the starter (2-core x86, busy: load average 9), a 1,486-token prompt, 12 keystrokes:
TTFT p50 cold 30.0 s; PSM 26.5 s with 0 tokens reused; SPM 0.28 s with 1,480 reused. The
starter's sliding-window layers keep only the last 512 positions, so once a request has read
the suffix after the cursor the window before the cursor is gone and its prefix cannot be
reused; a model without a sliding window (Qwen2.5-Coder) keeps it (the engine tests show the
prefix reused), and suffix-first order keeps everything before the typed characters.

    python bench/fim_keystrokes.py [--model gemma3:270m] [--keystrokes 12] [--tokens 8]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

from localinfer.loading import load_engine
from localinfer.runtime.backend import LoadOptions
from localinfer.runtime.types import SamplingParams
from localinfer.store import ModelStore

STAND_IN_FIM = ("<start_of_turn>", "<end_of_turn>", "<start_of_image>")


def source_file(n_functions: int = 20) -> str:
    return "".join(
        f"def handler_{i}(request, retries={i % 4}):\n"
        f"    \"\"\"Handle request kind {i}.\"\"\"\n"
        f"    for attempt in range(retries + 1):\n"
        f"        result = dispatch(request, kind={i}, attempt=attempt)\n"
        f"        if result.ok:\n"
        f"            return result\n"
        f"    raise RuntimeError('kind {i} failed')\n\n"
        for i in range(n_functions))


def run(engine, prefix: str, suffix: str, typed: str, *, cold: bool, tokens: int
        ) -> tuple[list[float], list[int]]:
    ttft, cached = [], []
    params = SamplingParams(max_tokens=tokens, temperature=0.0, supersede="bench")
    engine.clear_cache()
    engine.submit(engine.infill_tokens(prefix, suffix), params).result()  # the file opened
    for n in range(1, len(typed) + 1):
        if cold:
            engine.clear_cache()
        done = engine.submit(engine.infill_tokens(prefix + typed[:n], suffix), params).result()
        ttft.append(done.timings.ttft_ms)
        cached.append(done.usage.cached_tokens)
    return ttft, cached


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3:270m")
    ap.add_argument("--keystrokes", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=8)
    args = ap.parse_args()
    model = ModelStore().resolve(args.model)
    engine = load_engine(model.path, LoadOptions(n_ctx=4096, n_slots=1), name=model.name,
                         family=model.family).wait_ready()
    try:
        if engine.info.fim is None:
            engine.info = dataclasses.replace(engine.info, fim=STAND_IN_FIM)
        text = source_file()
        cursor = len(text) // 2
        prefix, suffix = text[:cursor], text[cursor:]
        typed = "value = compute(x)"[:args.keystrokes]
        n_prompt = len(engine.infill_tokens(prefix, suffix))
        print(f"{model.name}: FIM prompt of {n_prompt} tokens, {len(typed)} keystrokes,"
              f" {args.tokens} tokens generated each")
        print(f"{'mode':<28}{'TTFT p50 ms':>12}{'cached p50':>12}")
        for label, spm, cold in [("cold cache (no reuse)", False, True),
                                 ("PSM, previous keystroke's", False, False),
                                 ("SPM, previous keystroke's", True, False)]:
            engine.backend.fim_spm = spm
            ttft, cached = run(engine, prefix, suffix, typed, cold=cold, tokens=args.tokens)
            print(f"{label:<28}{statistics.median(ttft):>12.1f}"
                  f"{statistics.median(cached):>12.0f}")
    finally:
        engine.close()


if __name__ == "__main__":
    main()
