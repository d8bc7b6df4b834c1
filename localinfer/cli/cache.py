"""``localinfer cache``: the prefix cache on disk (saved KV states of long prompt prefixes,
runtime/disk_cache.py): what it holds, and clearing it."""

from __future__ import annotations

import argparse
import json
import time

from ..config import Config
from ..paths import get_paths
from ..progress import human_bytes
from .common import duration, print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cache", help="list or clear the prefix cache (long prompts' KV state, kept on disk)",
        description="The prefix cache keeps the KV cache of long prompt prefixes (a system"
                    " prompt and tools, a conversation's turns) on disk, so that a request"
                    " that starts alike, even after a restart, reads only the rest. Bounded by"
                    " prefix_cache_gb in config.toml (0 turns it off).")
    p.add_argument("action", nargs="?", choices=("list", "clear"), default="list",
                   help="list (default) or clear the saved prefixes")
    p.add_argument("--json", action="store_true", help="print JSON (list)")
    p.set_defaults(func=cmd_cache)


def cmd_cache(args: argparse.Namespace, config: Config) -> int:
    from ..runtime.disk_cache import PrefixStore  # numpy: not for building the parser

    limit = int(config.prefix_cache_gb * 1e9)
    store = PrefixStore(get_paths().prefix_cache_dir, limit)
    if args.action == "clear":
        count, size = store.clear()
        print(f"removed {count} saved prefix{'es' if count != 1 else ''}"
              f" ({human_bytes(size)}) from {store.directory}")
        return 0
    entries = store.entries()
    total = sum(e.size for e in entries)
    if args.json:
        print(json.dumps({
            "directory": str(store.directory), "max_bytes": limit, "bytes": total,
            "entries": [{"model": store.label(e), "tokens": e.n_tokens, "bytes": e.size,
                         "last_used": e.mtime, "file": e.path.name} for e in entries]},
            indent=2))
        return 0
    bound = f"of {human_bytes(limit)}" if limit else "(off: prefix_cache_gb = 0)"
    print(f"prefix cache: {human_bytes(total)} {bound} in {len(entries)} saved"
          f" prefix{'es' if len(entries) != 1 else ''} ({store.directory})")
    if entries:
        now = time.time()
        rows = [("MODEL", "TOKENS", "SIZE", "LAST USED")]
        for entry in reversed(entries):  # the most recently used first
            rows.append((store.label(entry), f"{entry.n_tokens:,}", human_bytes(entry.size),
                         f"{duration(max(0.0, now - entry.mtime))} ago"))
        print_table(rows)
    return 0
