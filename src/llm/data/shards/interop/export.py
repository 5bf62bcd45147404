"""`llm-data convert DATASET --output PREFIX --format megatron|olmo`: any token dataset we read, written for a peer.

Megatron: `PREFIX.bin` (every document's tokens, in order) and `PREFIX.idx` with one sequence
per document (how Megatron's `preprocess_data.py` writes them), in the narrowest Megatron
dtype that holds the ids. OLMo: one raw token file per shard (`DIR/part-00000.npy`, ...),
uint16 or uint32, each document followed by EOS unless it already ends with it. Files are
written under temporary names and renamed when complete (the `.idx` last), so a failed
convert leaves nothing that looks finished; existing outputs are refused unless `overwrite`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from llm.data.shards.interop.megatron import index_bytes, megatron_code

FORMATS = ("megatron", "olmo")


def _local_output(where: str | Path, what: str) -> Path:
    from llm.data.storage.paths import parse_location

    if parse_location(str(where)).is_remote:
        raise ValueError(f"--format {what} writes local files, not {where}; write them here and upload the files")
    return Path(where)


def _open(src: str | Path, storage_options: dict | None) -> object:
    from llm.data.shards.format.loaders import TokensLoader
    from llm.data.shards.read.dataset import StreamingDataset

    ds = StreamingDataset(src, item_loader=TokensLoader(block_size=1), storage_options=storage_options)
    return ds


def _shards(ds: object) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(tokens, document ends) of each stored shard, every token (block size 1 keeps every tail)."""
    reader = ds.reader  # type: ignore[attr-defined]
    for i in range(len(reader.starts) - 1):
        tokens, ends = reader._shard(i)
        yield np.asarray(tokens), np.asarray(ends, dtype=np.int64)
        release = getattr(reader.files, "release", None)
        if release is not None:
            release()


def _refuse_existing(paths: list[Path], overwrite: bool) -> None:
    for p in paths:
        if p.exists() and not overwrite:
            raise FileExistsError(f"{p} already exists; pass --mode overwrite (overwrite=True) to replace it")


def _largest(ds: object) -> int:
    manifest = ds.manifest  # type: ignore[attr-defined]
    vocab = manifest.vocab_size or (manifest.tokenizer or {}).get("vocab_size")
    if isinstance(vocab, int) and vocab > 0:
        return vocab - 1
    return max((int(t.max()) for t, _ in _shards(ds) if len(t)), default=0)


def to_megatron(src: str | Path, prefix: str | Path, *, overwrite: bool = False,
                storage_options: dict | None = None) -> dict:
    """Write `src` as `prefix.bin` / `prefix.idx`; returns {'documents', 'tokens', 'dtype', 'bin', 'idx'}."""
    prefix = _local_output(prefix, "megatron")
    ds = _open(src, storage_options)
    bin_path, idx_path = Path(f"{prefix}.bin"), Path(f"{prefix}.idx")
    _refuse_existing([bin_path, idx_path], overwrite)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    code, dtype = megatron_code(np.dtype(ds.manifest.dtype), _largest(ds))  # type: ignore[attr-defined]
    lengths: list[np.ndarray] = []
    part_bin, part_idx = bin_path.with_name(bin_path.name + ".part"), idx_path.with_name(idx_path.name + ".part")
    try:
        with open(part_bin, "wb") as f:
            for tokens, ends in _shards(ds):
                if len(tokens) and int(tokens.max()) > np.iinfo(dtype).max:
                    raise ValueError(f"{src}: a token id {int(tokens.max())} does not fit {dtype.name}, the dtype "
                                     "its vocabulary size asks for")
                f.write(tokens.astype(dtype.newbyteorder("<"), copy=False).tobytes())
                lengths.append(np.diff(np.concatenate([[0], ends])))
            f.flush()
            os.fsync(f.fileno())
        all_lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        with open(part_idx, "wb") as f:
            f.write(index_bytes(code, all_lengths, dtype))
            f.flush()
            os.fsync(f.fileno())
        os.replace(part_bin, bin_path)
        os.replace(part_idx, idx_path)  # last: a prefix with an .idx is complete
    finally:
        for p in (part_bin, part_idx):
            p.unlink(missing_ok=True)
    return {"documents": len(all_lengths), "tokens": int(all_lengths.sum()), "dtype": dtype.name,
            "bin": str(bin_path), "idx": str(idx_path)}


def to_olmo(src: str | Path, folder: str | Path, *, eos_id: int | None = None, overwrite: bool = False,
            storage_options: dict | None = None) -> dict:
    """Write `src` as OLMo token files `folder/part-NNNNN.npy`; returns {'spec', 'files', 'documents', 'tokens', 'dtype'}."""
    from llm.data.shards.interop.olmo import spec

    ds = _open(src, storage_options)
    eos = eos_id if eos_id is not None else ds.manifest.eos_id  # type: ignore[attr-defined]
    if eos is None:
        raise ValueError(f"{src} records no EOS id and OLMo separates documents by EOS: pass --eos-id")
    largest = max(_largest(ds), eos)
    dtype = np.dtype("uint16" if largest <= np.iinfo(np.uint16).max else "uint32")
    folder = _local_output(folder, "olmo")
    if folder.exists() and any(folder.glob("part-*.npy")) and not overwrite:
        raise FileExistsError(f"{folder} already holds part-*.npy files; pass --mode overwrite (overwrite=True) to replace them")
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("part-*.npy"):
        old.unlink()
    paths, documents, total = [], 0, 0
    for k, (tokens, ends) in enumerate(_shards(ds)):
        parts, start = [], 0
        for end in ends.tolist():
            doc = tokens[start:end]
            parts.append(doc)
            if not len(doc) or int(doc[-1]) != eos:
                parts.append(np.array([eos]))
            start = end
        out = np.concatenate(parts).astype(dtype.newbyteorder("<")) if parts else np.zeros(0, dtype)
        path = folder / f"part-{k:05d}.npy"
        part = path.with_name(path.name + ".part")
        out.tofile(part)
        os.replace(part, path)
        paths.append(path)
        documents += len(ends)
        total += len(out)
    return {"spec": spec(paths, dtype.name, eos), "files": len(paths), "documents": documents, "tokens": total,
            "dtype": dtype.name}
