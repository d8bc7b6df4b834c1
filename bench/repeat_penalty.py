"""Does a repeat penalty keep a small model from looping? Replies to the same prompts, with
and without llama.cpp's repeat penalty (Ollama's documented default: 1.1 over the last 64
tokens), at the model's default sampling (``sampling_defaults.py``) and at llama.cpp's
(temperature 0.8), a few seeds each. For each reply it counts the share of its word 4-grams
that repeat an earlier one (0: none repeats; a reply stuck in a loop nears 1) and whether it
looped (one 8-word run seen three times or more); it prints the means per setting.

    python bench/repeat_penalty.py [--model gemma3:270m] [--seeds 3] [--tokens 160]
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter

from localinfer.config import load_config
from localinfer.loading import open_engine
from localinfer.runtime.types import Message, SamplingParams
from localinfer.session import EngineSession, model_sampling
from localinfer.store import ModelStore

PROMPTS = [
    "Tell me about the sea at night.",
    "Describe a city where the light is lost.",
    "Write a short story about a lighthouse keeper.",
    "Explain why the sky is blue.",
    "List some things to do on a rainy day.",
    "What is a good way to learn to cook?",
]


def repeated_share(text: str, n: int = 4) -> float:
    words = text.split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    if not grams:
        return 0.0
    seen: set[tuple[str, ...]] = set()
    repeats = 0
    for g in grams:
        repeats += g in seen
        seen.add(g)
    return repeats / len(grams)


def looped(text: str, n: int = 8, times: int = 3) -> bool:
    words = text.split()
    counts = Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
    return bool(counts) and max(counts.values()) >= times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma3:270m")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=160)
    args = parser.parse_args()
    config = load_config()
    engine = open_engine(args.model, config)
    engine.wait_ready()
    session = EngineSession(engine)
    defaults = model_sampling(ModelStore(), config, engine.info, args.model).values
    base = {"max_tokens": args.tokens}
    settings = {
        "model default": {**base, **defaults},
        "model default + penalty 1.1/64": {**base, **defaults, "repeat_penalty": 1.1,
                                           "repeat_last_n": 64},
        "llama.cpp default (t 0.8)": dict(base),
        "llama.cpp default + penalty 1.1/64": {**base, "repeat_penalty": 1.1,
                                               "repeat_last_n": 64},
    }
    chat = not engine.info.base_model
    print(f"{engine.info.name} ({'instruct' if chat else 'base: prompts continued as text'});"
          f" {len(PROMPTS)} prompts x {args.seeds} seeds, {args.tokens} tokens; model"
          f" defaults {defaults}")
    for label, values in settings.items():
        shares, loops = [], 0
        for seed in range(args.seeds):
            params = SamplingParams(**values, seed=seed)
            gens = [session.chat([Message("user", p)], params) if chat
                    else session.complete(p, params) for p in PROMPTS]
            for gen in gens:
                text = "".join(e.text for e in gen if hasattr(e, "live"))
                shares.append(repeated_share(text))
                loops += looped(text)
        print(f"  {label:<36} repeated 4-grams {statistics.mean(shares):.3f}"
              f"  looped {loops}/{len(shares)}")
    engine.close()


if __name__ == "__main__":
    main()
