"""`llm-data convert SRC DST`: a LitData, MDS or Megatron folder or an OLMo spec rewritten in our format.

Token folders keep their documents (LitData TokensLoader items) and every token, including
the chunk tails LitData's own reader never serves. Item folders keep every item as the
peer's reader returns it. Leaf formats we do not decode directly (LitData `json`, media
types, ...) are read through `litdata` itself when it is installed.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from llm.data.shards.interop import open_foreign, open_in_place, open_remote_peer
from llm.data.storage.paths import parse_location


def _plain(value: Any) -> Any:
    """LitData hands back `bytes` leaves as memoryviews: picklable bytes instead."""
    if isinstance(value, memoryview):
        return value.tobytes()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


def _identity(folder: str) -> tuple:
    """(name, mtime, size) of the files that say what `folder` holds: a rewritten one is opened (checked) again."""
    from llm.data.shards.interop.olmo import is_olmo_spec, parse_spec

    if is_olmo_spec(folder):
        candidates = [Path(p) for p in parse_spec(folder).paths]
    else:
        path = Path(folder)
        candidates = [path / "index.json", Path(f"{folder}.idx")] + (sorted(path.glob("*.idx")) if path.is_dir() else [])
    out = []
    for p in candidates:
        if p.exists():
            st = os.stat(p)
            out.append((str(p), st.st_mtime_ns, st.st_size))
    return tuple(out)


def _opened(folder: str) -> Any:
    """The source opened (its index checked against every file) once per worker process, not once per shard."""
    return _open_cached(folder, _identity(folder))


@functools.lru_cache(maxsize=4)
def _open_cached(folder: str, identity: tuple) -> Any:
    return open_in_place(folder) or open_foreign(folder)


def _documents(job: tuple[str, int]) -> Iterator[np.ndarray]:
    folder, shard = job
    source = _opened(folder)
    tokens, ends = source.token_layout(source.shard_files(False).raw(shard), shard)  # type: ignore[union-attr]
    start = 0
    for end in ends.astype(np.int64).tolist():
        yield np.array(tokens[start:end], dtype=np.int64)
        start = end


def _items(job: tuple[str, int, bool]) -> Iterator[Any]:
    folder, shard, through_litdata = job
    source = _opened(folder)
    first = sum(s.items for s in source.manifest.shards[:shard])  # type: ignore[union-attr]
    count = source.manifest.shards[shard].items  # type: ignore[union-attr]
    if through_litdata:
        import litdata

        theirs = litdata.StreamingDataset(folder)
        for i in range(first, first + count):
            yield _plain(theirs[i])
        return
    reader = source.item_reader(verify=True)  # type: ignore[union-attr]
    for i in range(first, first + count):
        yield reader.get(i)


def convert(src: str | Path, dst: str | Path, *, num_workers: int | None = None, chunk_bytes: str | int = "64MB",
            compression: str | None = None, mode: str | None = None, progress: bool = True) -> Any:
    """Rewrite the LitData / MDS folder `src` as our dataset at `dst` (a folder or s3://); returns the summary."""
    from llm.data.shards.format.loaders import TokensLoader
    from llm.data.shards.prepare.optimize import optimize

    folder = str(src)
    source = open_in_place(folder)
    if source is None and parse_location(folder).is_remote:  # a Megatron prefix or folder in a bucket
        source = open_remote_peer(parse_location(folder))
        folder = str(source.folder) if source is not None else folder  # its local copy, what the workers open
    elif source is None:
        source = open_foreign(Path(folder))
    if source is None:
        raise ValueError(f"{src} is not a LitData or MosaicML MDS folder (no index.json with 'chunks' or 'shards'), "
                         "a Megatron prefix (PREFIX.bin + PREFIX.idx) or an olmo: spec")
    shards = range(len(source.manifest.shards))
    if source.manifest.kind == "tokens":
        jobs: list = [(str(folder), i) for i in shards]
        return optimize(_documents, jobs, dst, num_workers=num_workers, chunk_bytes=chunk_bytes, item_loader=TokensLoader(),
                        compression=compression, mode=mode, progress=progress,
                        sources=[{"path": str(folder), "format": source.manifest.foreign_format}])
    through_litdata = False
    try:
        source.item_reader(verify=False)
    except ValueError:
        try:
            import litdata  # noqa: F401
        except ImportError:
            raise ValueError(f"{src} uses a LitData format read only by litdata itself; "
                             "`pip install --no-deps litdata` and run convert again") from None
        through_litdata = True
    jobs = [(str(folder), i, through_litdata) for i in shards]
    return optimize(_items, jobs, dst, num_workers=num_workers, chunk_bytes=chunk_bytes, compression=compression,
                    mode=mode, progress=progress, sources=[{"path": str(folder), "format": source.manifest.foreign_format}])
