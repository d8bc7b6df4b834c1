"""What several sub-commands share: the loading and sampling flags, merging the loading flags
into the config, and the plain-text table printer."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from ..config import Config

LOAD_FLAGS = ("ctx", "gpu_layers", "threads", "kv_type", "flash_attn")
"""The ``add_load_flags`` destinations, each also a ``Config`` field of the same name."""


def add_load_flags(p: argparse.ArgumentParser, *,
                   ctx_help: str = "context window per sequence, tokens") -> None:
    """--ctx, --gpu-layers, --threads, --kv-type and --flash-attn, for every command that
    loads a model; left out, each keeps the config's value."""
    g = p.add_argument_group("loading")
    g.add_argument("--ctx", type=int, default=None, metavar="N", help=ctx_help)
    g.add_argument("--gpu-layers", type=int, default=None, metavar="N",
                   help="layers to offload to the GPU (-1 = all)")
    g.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads")
    g.add_argument("--kv-type", choices=["f16", "q8_0"], default=None,
                   help="KV cache type (q8_0 halves its memory; needs flash attention)")
    g.add_argument("--flash-attn", choices=["auto", "on", "off"], default=None,
                   help="flash attention (auto: off on the CPU, where speculative greedy"
                        " text is then exact; llama.cpp's choice on a GPU)")


def load_flags_given(args: argparse.Namespace) -> bool:
    """Whether any loading flag was given on the command line."""
    return any(getattr(args, name) is not None for name in LOAD_FLAGS)


def config_with_flags(config: Config, args: argparse.Namespace) -> Config:
    """The config with the loading flags that were given put over it."""
    return config.replace(**{name: getattr(args, name) for name in LOAD_FLAGS})


def add_sampling_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("-n", "--max-tokens", type=int, default=256, metavar="N",
                   help="most tokens to generate (default 256)")
    g.add_argument("-t", "--temperature", type=float, default=0.8, metavar="T",
                   help="0 = greedy (default 0.8)")
    g.add_argument("--top-p", type=float, default=0.95, metavar="P")
    g.add_argument("--top-k", type=int, default=40, metavar="K")
    g.add_argument("--min-p", type=float, default=0.05, metavar="P")
    g.add_argument("--repeat-penalty", type=float, default=1.0, metavar="X")
    g.add_argument("--seed", type=int, default=None, metavar="S")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop before this text (repeatable)")


def sampling_params(args: argparse.Namespace):
    """The sampling flags as validated ``SamplingParams`` (bad values raise InvalidRequest)."""
    # runtime/__init__ loads the engine: not for building the parser.
    from ..runtime.types import SamplingParams

    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
        seed=args.seed,
        stop=tuple(args.stop),
    ).validate()


def print_table(rows: Sequence[Sequence[str]], stream: TextIO | None = None) -> None:
    """Left-aligned columns two spaces apart; the first row is the header."""
    stream = stream or sys.stdout
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [str(c).ljust(w) for c, w in zip(row, widths, strict=True)]
        stream.write("  ".join(cells).rstrip() + "\n")
