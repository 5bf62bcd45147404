"""`llm-data cache`: the shard cache folders listed or cleared; only folders marked as caches are touched."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from llm.cli.inspect import plural
from llm.data.storage import cache_admin
from llm.data.storage.sizes import format_size


def run_cache(args: argparse.Namespace) -> None:
    """`llm-data cache ls | clear`: list or remove shard cache folders (never a shard in use)."""
    root = cache_admin.check_root(args.cache_dir)
    folders = cache_admin.list_caches(root)
    if args.action == "ls":
        for f in folders:
            used = time.strftime("%Y-%m-%d %H:%M", time.localtime(f.last_used)) if f.last_used else "never"
            print(f"{f.fingerprint}  {f.url or '(url unknown)'}  {f.shards:,} shards  {format_size(f.bytes)}  last used {used}")
        print(f"cache: {len(folders)} folder(s), {format_size(sum(f.bytes for f in folders))} under {root}", file=sys.stderr)
        _others(root)
        return
    if args.all == bool(args.targets):
        raise ValueError("cache clear needs either FINGERPRINT or URL arguments (as `llm-data cache ls` shows them) "
                         "or --all, not both" if args.all else
                         "cache clear needs what to remove: FINGERPRINT or URL arguments (as `llm-data cache ls` "
                         "shows them), or --all for every cache folder")
    chosen = folders if args.all else cache_admin.select(folders, args.targets, root)
    freed = kept = 0
    for f in chosen:
        done = cache_admin.clear(f)
        freed += done.freed
        what = f"{f.fingerprint} ({f.url or 'url unknown'})"
        if done.gone:
            print(f"removed {what}: {done.removed:,} shards, {format_size(done.freed)}")
            continue
        kept += 1
        why = f"{len(done.kept)} file(s) in use ({', '.join(done.kept[:3])})" if done.kept else "open by a running reader"
        print(f"kept {what}: {why}; removed {done.removed:,} shards, {format_size(done.freed)}")
    print(f"cache clear: freed {format_size(freed)} in {len(chosen)} folder(s)"
          + (f"; {kept} kept because a running reader uses them" if kept else ""), file=sys.stderr)
    _others(root)


def _others(root: Path) -> None:
    others = cache_admin.not_caches(root)
    if others:
        what = plural(len(others), "folder") + (" that is not a shard cache" if len(others) == 1 else " that are not shard caches")
        print(f"cache: left alone {what}: {', '.join(others)}", file=sys.stderr)
