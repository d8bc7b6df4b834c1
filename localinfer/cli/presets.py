"""``localinfer create NAME -f Modelfile``: a preset over an installed model (its system
prompt, template, parameters and seed messages, kept as data; store/presets.py), and with
``--quantize`` a new quantized GGUF made by llama.cpp's quantizer first."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..config import Config
from ..errors import InvalidRequest
from ..progress import TerminalProgress


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "create", help="make a preset from a Modelfile (and quantize)",
        description="Make NAME from a Modelfile (Ollama's syntax: FROM, PARAMETER, SYSTEM,"
                    " TEMPLATE, MESSAGE, LICENSE, ADAPTER): a preset over an installed model,"
                    " kept as data (no copy of the weights); `show`, `list` and `rm` know it."
                    " With"
                    " --quantize, the model is first quantized by llama.cpp into a new file.")
    p.add_argument("name", metavar="NAME")
    p.add_argument("-f", "--file", metavar="MODELFILE", default="Modelfile",
                   help="the Modelfile (default: ./Modelfile)")
    p.add_argument("-q", "--quantize", metavar="QUANT",
                   help="quantize the model first (Q4_K_M, Q8_0...)")
    p.add_argument("--allow-requantize", action="store_true",
                   help="quantize a model that is already quantized (loses quality)")
    p.set_defaults(func=cmd_create)


def cmd_create(args: argparse.Namespace, config: Config) -> int:
    # The store: not for building the parser.
    from ..store import ModelStore
    from ..store.create import create_preset
    from ..store.presets import parse_modelfile

    path = Path(args.file).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidRequest(f"cannot read the Modelfile {path}: {exc.strerror or exc}."
                             ) from None
    except UnicodeDecodeError:
        raise InvalidRequest(f"{path} is not a text Modelfile (not UTF-8).") from None
    request = parse_modelfile(text, path.parent, args.name)
    if args.quantize:
        request.quantize = args.quantize
    bar: list[TerminalProgress] = []

    def status(text: str, done: int | None, total: int | None) -> None:
        if total is not None:
            if not bar:
                bar.append(TerminalProgress(text[:1].upper() + text[1:], total=total))
            bar[0].update(done or 0, total)
            return
        if bar:
            bar.pop().finish()
        if text != "success":
            print(text, file=sys.stderr)

    preset = create_preset(ModelStore(offline=config.offline), request, from_api=False,
                           allow_requantize=args.allow_requantize, status=status)
    print(f"created {preset.name} (over {preset.model})")
    return 0
