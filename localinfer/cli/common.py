"""What several sub-commands share: the loading and sampling flags, merging the loading flags
into the config, and the plain-text table printer."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from ..config import Config
from ..errors import ConfigError
from ..hardware.probe import probe_build
from ..progress import human_bytes
from ..runtime.types import KV_CACHE_TYPES, SamplingParams, kv_cache_types

if TYPE_CHECKING:  # the store loads the catalog: not for building the parser
    from ..store import PartialDownload

LOAD_FLAGS = ("ctx", "gpu_layers", "threads", "kv_type", "flash_attn")
"""The ``add_load_flags`` destinations, each also a ``Config`` field of the same name."""


def kv_type_arg(value: str) -> str:
    """``--kv-type``'s value, checked (argparse prints the message and exits 2)."""
    try:
        kv_cache_types(value)
    except ValueError as exc:
        close = difflib.get_close_matches(value, KV_CACHE_TYPES, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise argparse.ArgumentTypeError(f"{exc}{hint}") from None
    return value


def _in_range(number: int, low: int, high: float, words: str) -> int:
    """``number`` if ``low <= number <= high``, else argparse's error (exit 2) "``words``,
    got N"."""
    if not low <= number <= high:
        raise argparse.ArgumentTypeError(f"{words}, got {number}")
    return number


def positive_int(value: str) -> int:
    """A count of at least 1 (``--ctx``, ``--threads``; argparse prints the message, exit 2)."""
    return _in_range(int(value), 1, float("inf"), "must be at least 1")


def worker_port_arg(value: str) -> int:
    """A worker's RPC port: 1-65534, its description served on the next one."""
    return _in_range(int(value), 1, 65534, "must be a port from 1 to 65534 (the worker's"
                     " description is served on the next port)")


def port_arg(value: str) -> int:
    """A TCP port, 1-65535, or 0 for any free one (``--port``)."""
    return _in_range(int(value), 0, 65535, "must be a port from 1 to 65535 (0: any free one)")


def non_negative_int(value: str) -> int:
    """A count of 0 or more (``--max-queue``)."""
    return _in_range(int(value), 0, float("inf"), "must be 0 or more")


def positive_seconds(value: str) -> float:
    """A duration in seconds above 0 (``--idle-exit``)."""
    number = float(value)
    if not 0 < number < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {value}")
    return number


def gpu_layers_arg(value: str) -> int:
    """``--gpu-layers``: -1 (all, wherever a GPU is found) or a count of 0 or more."""
    return _in_range(int(value), -1, float("inf"), "must be -1 (all) or 0 or more")


def add_load_flags(p: argparse.ArgumentParser, *,
                   ctx_help: str = "context window per sequence, tokens") -> None:
    """--ctx, --gpu-layers, --threads, --kv-type and --flash-attn, for every command that
    loads a model; left out, each keeps the config's value."""
    g = p.add_argument_group("loading")
    g.add_argument("--ctx", type=positive_int, default=None, metavar="N", help=ctx_help)
    g.add_argument("--gpu-layers", type=gpu_layers_arg, default=None, metavar="N",
                   help="layers to offload to the GPU (-1 = all)")
    g.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help="CPU threads")
    g.add_argument("--kv-type", type=kv_type_arg, default=None, metavar="TYPE",
                   help="KV cache type: f16, q8_0 (half the memory) or q4_0 (a quarter), or"
                        " K,V such as q8_0,q4_0; quantized types need flash attention")
    g.add_argument("--flash-attn", choices=["auto", "on", "off"], default=None,
                   help="flash attention (auto: off on the CPU, where speculative greedy"
                        " text is then exact; llama.cpp's choice on a GPU)")


def load_flags_given(args: argparse.Namespace) -> bool:
    """Whether any loading flag was given on the command line."""
    return any(getattr(args, name, None) is not None for name in LOAD_FLAGS)


def load_settings(config: Config, args: argparse.Namespace) -> Config:
    """The config with the loading flags that were given put over it, checked against this
    machine: GPU layers with no GPU llama.cpp can offload to are refused (ConfigError); more
    threads than logical cores are cut to that number, with a warning on stderr."""
    config = config.replace(**{name: getattr(args, name, None) for name in LOAD_FLAGS})
    if config.gpu_layers is not None and config.gpu_layers > 0:
        # The probe loads llama.cpp (~0.1-0.5 s): only when GPU layers are asked for.
        build = probe_build()
        if not build.notes and not any(b != "CPU" for b in build.backends):
            raise ConfigError(
                f"{_setting(args, 'gpu_layers', config.gpu_layers)}: llama.cpp has no GPU to"
                " offload to here (its backends: CPU; `localinfer hw` says why). Leave it out,"
                " or use -1 (all layers wherever a GPU is found).")
    cores = logical_cores()
    if config.threads is not None and config.threads > cores:
        print(f"localinfer: warning: {_setting(args, 'threads', config.threads)} is more than"
              f" the {cores} logical cores here; using {cores}.", file=sys.stderr)
        config = config.replace(threads=cores)
    return config


def _setting(args: argparse.Namespace, name: str, value: int) -> str:
    """How the user set a loading setting: the flag, or the config file or environment."""
    if getattr(args, name, None) is not None:
        return f"--{name.replace('_', '-')} {value}"
    return f"{name} = {value} (config.toml or LOCALINFER_{name.upper()})"


def logical_cores() -> int:
    """The CPUs this process may run on (its affinity: a container's or taskset's limit)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def add_sampling_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "sampling", "Left out, each takes the model's default (its catalog card's, its"
        " file's general.sampling.* metadata, its [models.\"NAME\"] table in config.toml:"
        " `localinfer show MODEL` lists them), else llama.cpp's (given here).")
    g.add_argument("-n", "--max-tokens", type=int, default=256, metavar="N",
                   help="most tokens to generate (default 256)")
    # Left out, each is the model's own default (a preset's, config.toml's), else llama.cpp's.
    g.add_argument("-t", "--temperature", type=float, default=None, metavar="T",
                   help="0 = greedy (default: the model's, else 0.8)")
    g.add_argument("--top-p", type=float, default=None, metavar="P", help="(default 0.95)")
    g.add_argument("--top-k", type=int, default=None, metavar="K", help="(default 40)")
    g.add_argument("--min-p", type=float, default=None, metavar="P", help="(default 0.05)")
    g.add_argument("--repeat-penalty", type=float, default=None, metavar="X",
                   help="(default 1.0)")
    g.add_argument("--seed", type=int, default=None, metavar="S")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop before this text (repeatable)")


SAMPLING_FLAGS = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty")


def sampling_params(args: argparse.Namespace,
                    defaults: Mapping[str, float | int] | None = None) -> SamplingParams:
    """The sampling flags as validated ``SamplingParams`` (bad values raise InvalidRequest),
    over the model's ``defaults`` (``sampling_defaults.py``) for the flags left out."""
    values: dict[str, Any] = dict(defaults or {})
    values.update({name: getattr(args, name) for name in SAMPLING_FLAGS
                   if getattr(args, name) is not None})
    values.update(max_tokens=args.max_tokens, seed=args.seed, stop=tuple(args.stop))
    return SamplingParams(**values).validate()


def gpu_layers_text(n_gpu_layers: int, n_layers: int) -> str:
    """``k/N``: layers on the GPU as ``--gpu-layers``, ``plan``, ``ModelInfo`` and llama.cpp's
    own log count them: of the model's ``n_layers`` repeating layers + 1, the output layer
    counting as one."""
    return f"{n_gpu_layers}/{n_layers + 1}"


def split_text(split: Sequence[Sequence[object]]) -> str:
    """A model's layers across machines (``ModelInfo.split``): "CPU 6, 10.0.0.2:50052 #0 13"."""
    return ", ".join(f"{device} {layers}" for device, layers in split)


def print_table(rows: Sequence[Sequence[str]], stream: TextIO | None = None) -> None:
    """Left-aligned columns two spaces apart; the first row is the header."""
    stream = stream or sys.stdout
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [str(c).ljust(w) for c, w in zip(row, widths, strict=True)]
        stream.write("  ".join(cells).rstrip() + "\n")


def duration(seconds: float) -> str:
    """``45 seconds``, ``1 minute``, ``90 minutes``, ``3 hours``, ``2 days``."""
    for unit, size, below in (("second", 1, 60), ("minute", 60, 120), ("hour", 3600, 48)):
        if round(seconds / size) < below:
            return _count(round(seconds / size), unit)
    return _count(round(seconds / 86400), "day")


def _count(n: int, unit: str) -> str:
    return f"{n} {unit}" + ("" if n == 1 else "s")


def kept_text(partial: PartialDownload | None) -> str:
    """What an interrupted pull kept (or None): ": 136.3 MB of
    253.1 MB is kept in PATH", or "" when nothing was."""
    if partial is None or not partial.size_bytes:
        return ""
    of = f" of {human_bytes(partial.total_bytes)}" if partial.total_bytes else ""
    return f": {human_bytes(partial.size_bytes)}{of} is kept in {partial.path}"
