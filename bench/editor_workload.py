"""The editor workload (localinfer/bench/editor_workload.py) against localinfer and
llama-server, side by side in one run: one chat client, three editor clients sending
llama.vscode's /infill requests on a ~1,500-token file with superseded keystrokes cancelled,
and an indexing client embedding chunks.
Each server runs alone (one after the other) with its documented editor settings: localinfer's
defaults; llama-server with llama.vscode's CPU-only FIM flags and a second llama-server with
``--embeddings`` for the indexing client.

    python bench/editor_workload.py --fim-file F.gguf [--embed-file E.gguf]
        [--llama-server PATH] [--only localinfer|llama-server] [--kinds chat,fim,embed]
        [--quick] [--rounds N] [--completions N] [--serial-editors] [--json OUT.json]

``--serial-editors``: the editors send as llama.vscode and llama.vim do (one request in flight
each, never aborted; a keystroke that comes meanwhile waits and is dropped for a newer one),
where by default every keystroke is sent and aborts the one before.

FIM needs a model with FIM tokens. Without a code model at hand, a copy of the starter whose
header names three unused tokens as FIM tokens serves to measure the servers (not the
completions' quality; both servers get the same file), made with llama.cpp's gguf-py:

    PYTHONPATH=<llama.cpp>/gguf-py python <llama.cpp>/gguf-py/gguf/scripts/gguf_new_metadata.py \\
        STARTER.gguf starter-fim.gguf --special-token-by-id fim_pre 6 \\
        --special-token-by-id fim_suf 7 --special-token-by-id fim_mid 8

llama-server is built from the llama.cpp sources vendored in the llama-cpp-python sdist
(cmake -DLLAMA_BUILD_SERVER=ON, target llama-server); never built by the tests.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from localinfer.bench.editor_workload import (
    COMPLETIONS,
    LLAMA_SERVER_EMBED_ARGS,
    LLAMA_SERVER_FIM_ARGS,
    Workload,
    measure,
    start_llama_server,
    start_localinfer,
    table,
)
from localinfer.errors import LocalInferError
from localinfer.store import ModelStore


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fim-file", type=Path, default=None,
                        help="GGUF for chat and FIM (default: the starter)")
    parser.add_argument("--embed-file", type=Path, default=None,
                        help="GGUF for embeddings (default: the starter)")
    parser.add_argument("--llama-server", type=Path, default=None, metavar="PATH",
                        help="the llama-server binary to compare with")
    parser.add_argument("--only", choices=("localinfer", "llama-server"), default=None)
    parser.add_argument("--kinds", default="chat,fim,embed",
                        help="client kinds to run, comma-separated (default all)")
    parser.add_argument("--quick", action="store_true", help="fewer requests per client")
    parser.add_argument("--completions", type=int, default=COMPLETIONS, metavar="N",
                        help="completions of each FIM prompt (llama.vscode's"
                             f" max_parallel_completions, sent as n_cmpl; {COMPLETIONS})")
    parser.add_argument("--serial-editors", action="store_true",
                        help="editors as llama.vscode and llama.vim send: one request in flight"
                             " each, never aborted, the newest keystroke sent when it ends"
                             " (default: every keystroke sent, aborting the one before)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run both servers this many times, alternating which goes first")
    parser.add_argument("--json", type=Path, default=None, metavar="OUT",
                        help="also write the figures as JSON")
    args = parser.parse_args()
    starter = None
    if args.fim_file is None or args.embed_file is None:
        starter = ModelStore().resolve("gemma3:270m").path
    fim_file = (args.fim_file or starter).resolve()
    embed_file = (args.embed_file or starter).resolve()
    workload = Workload(kinds=tuple(k.strip() for k in args.kinds.split(",") if k.strip()),
                        completions=args.completions, serial_editors=args.serial_editors)
    if args.quick:
        workload = replace(workload, chat_turns=3, fim_completed=3, embed_chunks=16)
    logs = Path(tempfile.mkdtemp(prefix="editor-workload-"))
    print(f"workload: {workload}\nfiles: FIM/chat {fim_file}, embeddings {embed_file}\n"
          f"server logs in {logs}", flush=True)

    servers = [s for s in ("localinfer", "llama-server") if args.only in (None, s)]
    if "llama-server" in servers:
        if args.llama_server is None or not shutil.which(str(args.llama_server)):
            print("no llama-server: give its path with --llama-server", file=sys.stderr)
            return 2
        print(f"llama-server: {args.llama_server} {' '.join(LLAMA_SERVER_FIM_ARGS)};"
              f" embeddings: {' '.join(LLAMA_SERVER_EMBED_ARGS)}", flush=True)

    def run(server: str, round_: int) -> dict:
        if server == "localinfer":
            home = logs / f"localinfer-home-{round_}"
            home.mkdir()
            return measure(lambda: start_localinfer(fim_file, embed_file, home,
                                                    logs / "localinfer.log"), workload)
        assert args.llama_server is not None
        return measure(lambda: start_llama_server(args.llama_server, fim_file, embed_file,
                                                  logs / "llama-server.log"), workload)

    rounds = []
    for round_ in range(max(1, args.rounds)):
        # Alternate which server goes first: the load from other work drifts.
        order = servers if round_ % 2 == 0 else servers[::-1]
        results = {}
        for server in order:
            results[server] = run(server, round_)
            print(f"round {round_ + 1}, {server}: done in {results[server]['wall_s']} s",
                  flush=True)
        rounds.append([results[s] for s in servers])
        print(f"\nround {round_ + 1} ({' then '.join(order)}):\n{table(rounds[-1])}\n",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps({"workload": workload.__dict__, "rounds": rounds},
                                        indent=2))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except LocalInferError as exc:
        print(f"editor_workload: {exc.one_line()}", file=sys.stderr)
        sys.exit(exc.exit_code)
