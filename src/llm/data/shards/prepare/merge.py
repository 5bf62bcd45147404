"""`merge_datasets`: several optimized datasets as one, LitData's call, written like `optimize`'s outputs.

The merged dataset holds copies of the inputs' shards, renamed, and one manifest listing them
in input order. Copies, as LitData makes, not references: a dataset stays one self-contained
folder or prefix (moving, deleting or re-optimizing an input cannot break it; our manifests
name files inside their own folder only). On one local filesystem a copy is a hard link, so
it costs no space or time: shards are never rewritten in place (`optimize` writes new files
and deletes old ones), so the link can never see another content. Every copy is checked
against its input's size and checksum before the manifest names it.

The output is held by the same lock as `optimize`'s and committed the same way (the manifest
last, atomically; on an error the copies are removed and the output is unchanged), local or
s3://. Datasets of different kinds, tokenizers, token dtypes, item layouts or keys are refused, and
so is an append to a dataset that differs from the inputs (`output.py`'s one append check, before
anything is copied). Encrypted inputs need their key: shards are copied as ciphertext, so one key
must open one shard of every input (and of the dataset appended to), or the merge could not be read.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

from llm.data.shards.format.checksum import checksum_bytes, checksum_file
from llm.data.shards.format.encryption import (
    Encryption,
    EncryptionError,
    for_reading,
    key_opens,
    record,
)
from llm.data.shards.format.manifest import Manifest, ShardInfo, merge_backends
from llm.data.shards.format.pread import ShardError
from llm.data.shards.prepare.output import (
    SHARD_PREFIX,
    Incoming,
    Output,
    first_mismatch,
    open_output,
)
from llm.data.storage.paths import Location, parse_location


class _Input:
    """One input dataset: its manifest and a way to fetch its shard files."""

    def __init__(self, location: Location, storage_options: dict | None):
        self.location, self.display = location, location.url() if location.is_remote else str(location.local_path())
        if location.is_remote:
            from llm.data.shards.format.remote import load_manifest

            self.manifest, self.objects = load_manifest(location, storage_options)
        else:
            self.manifest, self.objects = Manifest.load(location.local_path()), None

    def fetch(self, info: ShardInfo, target: Path) -> None:
        """The shard's file at `target` (a hard link when both are local on one filesystem, else a copy)."""
        if self.objects is not None:
            target.write_bytes(self.objects.get(info.file))
            return
        source = self.location.local_path() / info.file
        try:
            os.link(source, target)
        except OSError:  # another filesystem, or links not allowed: a plain copy
            shutil.copyfile(source, target)

    def where(self, info: ShardInfo) -> str:
        return self.objects.url(info.file) if self.objects is not None else str(self.location.local_path() / info.file)

    def read(self, info: ShardInfo) -> bytes:
        if self.objects is not None:
            return self.objects.get(info.file)
        return (self.location.local_path() / info.file).read_bytes()


def _check_same(inputs: list[_Input]) -> None:
    """Every input agrees with the first on what the reader needs to be one; else one sentence naming both."""
    first = inputs[0]
    for other in inputs[1:]:
        found = first_mismatch(first.manifest, other.manifest)
        if found is not None:
            name, a, b = found
            raise ValueError(f"cannot merge {first.display} and {other.display}: their {name} differs "
                             f"({a} vs {b}); merge datasets made the same way")


def _check_key(inputs: list[_Input], encryption: Encryption | None) -> Encryption | None:
    """Encrypted inputs: the key given opens the smallest shard of each (they share one record, not surely one key)."""
    recorded = inputs[0].manifest.encryption
    if recorded is None:
        if encryption is not None:
            raise EncryptionError(f"merge_datasets: {inputs[0].display} is not encrypted; drop encryption=")
        return None
    if encryption is None:
        raise EncryptionError(f"merge_datasets: {inputs[0].display} is encrypted; pass encryption= with its key, "
                              "which must open every input (the merge copies their ciphertext)")
    key = for_reading(recorded, encryption, inputs[0].display)
    for source in inputs:
        manifest = source.manifest
        if not manifest.num_shards:
            continue
        info = manifest.entries[int(manifest.column("bytes").argmin())]
        stored = source.read(info)
        if len(stored) != info.bytes or checksum_bytes(stored) != info.checksum:
            raise ShardError(f"shard {source.where(info)} fails its size or checksum: the input is corrupt; nothing was merged")
        if not key_opens(key, stored, info, manifest.kind):  # type: ignore[arg-type]
            raise EncryptionError(f"merge_datasets: the {key.algorithm} key given does not open the shards of "  # type: ignore[union-attr]
                                  f"{source.display} ({info.file} does not decrypt); merge datasets made with one key")
    return key


def _same_place(a: Location, b: Location) -> bool:
    if a.kind == b.kind == "file":
        return a.local_path().resolve() == b.local_path().resolve()
    return a.url().rstrip("/") == b.url().rstrip("/")


def merge_datasets(
    input_dirs: list[str | Path],
    output_dir: str | Path,
    *,
    mode: str | None = None,
    storage_options: dict | None = None,
    wait: bool = False,
    encryption: Encryption | None = None,
) -> Manifest:
    """Merge optimized datasets (folders or s3:// prefixes) into `output_dir`, in the order given.

    `mode` is `optimize`'s: None (the output must be empty), 'append' or 'overwrite'; an append
    is refused unless the inputs were made as the dataset there was (one sentence naming the field).
    `encryption`: the key of encrypted inputs (e.g. `FernetEncryption(password)`), required for them.
    Returns the manifest written. The inputs are read, never changed.
    """
    if isinstance(input_dirs, (str, Path)) or len(input_dirs) < 2:
        raise ValueError(f"merge_datasets needs a list of at least two input_dirs, got {input_dirs!r}")
    locations = [parse_location(d) for d in input_dirs]
    out = parse_location(output_dir)
    for loc in locations:
        if _same_place(loc, out):
            raise ValueError(f"merge_datasets: output_dir {output_dir} is also an input; write the merge elsewhere")
    record(encryption)  # the type, before anything is read
    inputs = [_Input(loc, storage_options if loc.is_remote else None) for loc in locations]
    _check_same(inputs)
    key = _check_key(inputs, encryption)
    first = inputs[0].manifest
    output = open_output(output_dir, mode, Incoming(first, key, copies=True, whose="the inputs'"), wait=wait,
                         storage_options=storage_options if out.is_remote else None)
    run_id = time.strftime("%Y%m%d%H%M%S") + "-merge-" + uuid.uuid4().hex[:6]
    try:
        shards = []
        for k, source in enumerate(inputs):
            copied = [_copy(source, info, output, f"{SHARD_PREFIX}{run_id}-{k:05d}-{j:05d}.bin")
                      for j, info in enumerate(source.manifest.shards)]
            output.upload(copied)  # s3:// output: staged here, sent (and checked again) by the output
            shards += copied
        backend = None
        for source in inputs:
            backend = merge_backends(backend, source.manifest.tokenizer_backend)
        manifest = Manifest(kind=first.kind, shards=shards, dtype=first.dtype, tokenizer=first.tokenizer,
                            eos_id=first.eos_id, vocab_size=first.vocab_size,
                            sources=[s for source in inputs for s in source.manifest.sources],
                            item_layout=first.item_layout, tokenizer_backend=backend, encryption=first.encryption)
        output.commit(manifest)
    except BaseException:
        output.abort(run_id)
        raise
    finally:
        output.release()
    return manifest


def _copy(source: _Input, info: ShardInfo, output: Output, name: str) -> ShardInfo:
    """One input shard into the output folder (or its staging folder) under `name`, checked."""
    target = output.folder / name
    source.fetch(info, target)
    size, checksum = target.stat().st_size, checksum_file(target)
    if size != info.bytes or checksum != info.checksum:
        raise ShardError(f"shard {source.where(info)} has {size} bytes and checksum {checksum}, its manifest says "
                         f"{info.bytes} and {info.checksum}: the input is corrupt; nothing was merged")
    return ShardInfo(**{**info.__dict__, "file": name})
