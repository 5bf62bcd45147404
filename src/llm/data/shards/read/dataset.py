"""StreamingDataset: one folder of optimized shards (local, remote or a peer's) as samples in a seeded order.

The read path (plans, chunks, the resume contract) is `source.py`'s, shared with the mixture;
this module owns what is particular to one dataset: its manifest and reader, its subset
(subsample, split), its shuffle, and its remote cache.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from llm.data.ingest_stats import zero_remote
from llm.data.shards.format.encryption import Encryption, for_reading
from llm.data.shards.format.items_reader import ItemReader
from llm.data.shards.format.loaders import ItemsLoader, TokensLoader
from llm.data.shards.format.manifest import Manifest, ManifestError
from llm.data.shards.format.reader import TokenReader, _ShardBytes
from llm.data.shards.interop import open_foreign, open_in_place, open_remote_peer
from llm.data.shards.plan.schedule import epoch_order
from llm.data.shards.plan.shuffle.windowed import shard_sample_starts, straddling_blocks
from llm.data.shards.plan.subset import ComposedView, SampleView, check_subsample, subsample_view
from llm.data.shards.read.access import as_transform
from llm.data.shards.read.source import SampleSource, renamed
from llm.data.storage.paths import parse_location


class StreamingDataset(SampleSource):
    """Samples of a dataset made by `optimize`: token blocks (TokensLoader) or items (ItemsLoader)."""

    def __init__(
        self,
        input_dir: str | Path,
        item_loader: TokensLoader | ItemsLoader | None = None,
        shuffle: bool = False,
        drop_partial_block: bool = False,
        seed: int = 42,
        verify_checksums: bool | str = True,
        shuffle_algorithm: str = "feistel",
        cache_dir: str | Path | None = None,
        max_cache_size: int | str | None = "50GB",
        storage_options: dict | None = None,
        shuffle_window: int | str | None = None,
        subsample: float = 1.0,
        transform: Callable[[Any], Any] | list[Callable[[Any], Any]] | None = None,
        drop_last: bool | None = None,
        encryption: Encryption | None = None,
    ):
        """`input_dir`: a folder, `local:/network/folder` or `s3://bucket/prefix`. Remote shards are
        downloaded ahead of use into `cache_dir/<fingerprint>` (default: the user cache dir), verified,
        and evicted to keep that folder under `max_cache_size`; see docs/storage.md.

        `shuffle_window`: shuffle samples within windows of this many shards (in a seeded shard
        order) instead of globally, so the working set is that many shards. None / "auto": a
        remote dataset with a bounded cache gets the window that fits half of `max_cache_size`,
        anything else a global shuffle; "global" forces the global one.
        `verify_checksums`: True checks each shard's checksum on first use unless this machine
        already verified that very file (format/verified.py); "always" hashes regardless.
        `drop_partial_block`: drop the short last token block instead of padding it (`drop_last`, its
        older name, is accepted; the loader's `drop_short_batch` is the other meaning).
        `subsample`: a seeded subset of floor(subsample * n) samples (> 1 repeats them; subset.py).
        `transform`: a callable (or a list, applied in order) on each sample as `ds[i]` gives it, also in
        workers; it moves the loader to the per-sample path (access.py).
        `encryption`: the key of a dataset written with `optimize(..., encryption=)` (format/encryption.py)."""
        if verify_checksums not in (True, False, "always"):
            raise ValueError(f"verify_checksums must be True, False or 'always', got {verify_checksums!r}")
        if item_loader is not None and not isinstance(item_loader, (TokensLoader, ItemsLoader)):
            raise TypeError(f"item_loader must be TokensLoader(block_size=...) or ItemsLoader(), got {item_loader!r}")
        self.subsample, self.transform, self.split = check_subsample(subsample), as_transform(transform), None
        self.cache = None
        self.edges = None  # remote token shards' kept edges (edges.py)
        # A peer's data read in place (shards/interop/): LitData / MDS / Megatron folders, `olmo:` specs.
        self.foreign = open_in_place(input_dir, storage_options, cache_dir)
        location = parse_location(input_dir) if self.foreign is None else None
        if self.foreign is not None:
            self.input_dir: Path | str = str(input_dir)
            self.manifest = self.foreign.manifest
        elif location.is_remote:
            from llm.data.shards.format.remote import load_manifest, open_cache

            self.input_dir = location.url()
            try:
                self.manifest, objects = load_manifest(location, storage_options)
            except ManifestError:  # no index.json: a Megatron prefix or folder is copied and read in place
                self.foreign = open_remote_peer(location, storage_options, cache_dir)
                if self.foreign is None:
                    raise
                self.manifest = self.foreign.manifest
            else:
                self.cache = open_cache(location, self.manifest, objects, cache_dir, max_cache_size)
        else:
            self.input_dir = location.local_path()
            self.foreign = open_foreign(self.input_dir)
            self.manifest = self.foreign.manifest if self.foreign else Manifest.load(self.input_dir)
        self.encryption = for_reading(getattr(self.manifest, "encryption", None), encryption, str(self.input_dir))
        self.item_loader = item_loader or self._default_loader()
        if self.item_loader.kind != self.manifest.kind:
            raise ValueError(
                f"{self.input_dir} holds {self.manifest.kind}, but item_loader is {type(self.item_loader).__name__}; "
                f"use {'TokensLoader(block_size=...)' if self.manifest.kind == 'tokens' else 'ItemsLoader()'}"
            )
        self.drop_partial_block = renamed(drop_partial_block, drop_last, "drop_partial_block", "drop_last")
        self.shuffle, self.seed = shuffle, seed
        self.shuffle_algorithm = shuffle_algorithm
        self.fingerprint = self.manifest.fingerprint()
        self.epoch = 0
        self._order: tuple | None = None  # (key, the last epoch order): see epoch_permutation
        if self.manifest.kind == "tokens":
            self._init_tokens(verify_checksums)
        else:
            self.reader = (self.foreign.item_reader(verify_checksums) if self.foreign else
                           ItemReader(self.input_dir, self.manifest, verify_checksums, self._remote_files(verify_checksums)))
            self.num_samples = self.reader.total
        block = self.block_size if self.manifest.kind == "tokens" else None
        self.sample_starts = shard_sample_starts(self.reader.starts, block, self.num_samples)
        # Blocks a windowed order reads in the later of their two shards' windows (windowed.py); a
        # subset (view) keeps them in the earlier one: its samples are not the stored blocks.
        self.straddles = None if block is None else straddling_blocks(self.reader.starts, block, self.num_samples)
        self.view: SampleView | ComposedView | None = None
        self.apply_subsample()
        self.shuffle_window = self._resolve_window(shuffle_window)

    def __repr__(self) -> str:
        """Where the samples come from, how many, and their block size (tokens) or kind (items)."""
        size = f"block_size={self.block_size}" if self.manifest.kind == "tokens" else "kind='items'"
        subset = f", subsample={self.subsample}" if self.subsample != 1 else ""
        return (f"StreamingDataset(input_dir={str(self.input_dir)!r}, samples={self.num_samples}, {size}{subset}, "
                f"shuffle={self.shuffle}, seed={self.seed})")

    def apply_subsample(self) -> None:
        """Serve `subsample` of the current samples; `unsampled` keeps (view, starts) from before it,
        so that a split of an upsampled dataset splits the stored samples first (plan/splits.py)."""
        self.unsampled = (self.view, self.sample_starts)
        view = subsample_view(self.sample_starts, self.subsample, f"subsample:{self.seed}")
        if view is not None:
            self.set_view(view)

    def set_view(self, view: SampleView) -> None:
        """Serve only the samples of `view` (ids of this dataset's current samples): a subsample or split."""
        self.view = view if self.view is None else ComposedView(view, self.view)
        self.sample_starts, self.num_samples = view.starts, view.num_samples
        self._order = None

    def _resolve_window(self, value: int | str | None) -> int | None:
        """The window in shards that the order uses; None for a global shuffle (or none at all)."""
        shards = len(self.sample_starts) - 1  # of the subsample, when it repeats shards
        if value is None or (isinstance(value, str) and value in ("auto", "global")):
            if value == "global" or not self.shuffle or self.cache is None or self.cache.max_bytes is None:
                return None
            largest = int(self.manifest.column("bytes").max(initial=1))
            value = max(1, (self.cache.max_bytes // 2) // max(largest, 1))  # leaves half for prefetch and spill
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"shuffle_window must be a number of shards >= 1, 'auto', 'global' or None, got {value!r}")
        elif not self.shuffle:
            raise ValueError(f"shuffle_window={value} needs shuffle=True; drop shuffle_window or pass shuffle=True")
        return None if value >= shards else int(value)  # a window of every shard is the global shuffle

    def _remote_files(self, verify: bool) -> Any:
        """The shard files of a remote or encrypted dataset (None: the reader opens the folder's itself)."""
        if self.cache is None:
            if self.encryption is None:
                return None
            return _ShardBytes(Path(self.input_dir), self.manifest, verify, encryption=self.encryption)
        from llm.data.shards.format.remote import RemoteShardBytes

        return RemoteShardBytes(self.cache, self.manifest, verify, encryption=self.encryption)

    def _default_loader(self) -> TokensLoader | ItemsLoader:
        if self.manifest.kind == "items":
            return ItemsLoader()
        raise ValueError(f"{self.input_dir} holds tokens: pass item_loader=TokensLoader(block_size=...)")

    def _init_tokens(self, verify: bool) -> None:
        block = self.item_loader.block_size
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"TokensLoader.block_size must be a positive integer to read {self.input_dir}, got {block!r}")
        self.block_size = block
        self.reader = (self.foreign.token_reader(block, verify) if self.foreign else
                       TokenReader(self.input_dir, self.manifest, verify, self._remote_files(verify)))
        if self.cache is not None and self.manifest.encryption is None:  # never plaintext beside ciphertext
            from llm.data.shards.read.edges import EdgeStore

            self.edges = EdgeStore(self.cache.folder, self.manifest, block, self.reader.starts)
            self.reader.files.opened = self.edges.keep  # every shard's edges, cut when it is opened (verified)
        total = self.reader.total
        self.num_samples = total // block if self.drop_partial_block else math.ceil(total / block)
        pad = self.item_loader.pad_id
        self.pad_id = pad if pad is not None else (self.manifest.eos_id or 0)
        self.token_dtype = self._token_dtype()

    def _token_dtype(self) -> np.dtype:
        """The batches' token dtype: TokensLoader.dtype, or the widest stored one; ids must fit it."""
        stored = max((np.dtype(d or self.manifest.dtype) for d in self.manifest.distinct("dtype")),
                     key=lambda d: d.itemsize, default=np.dtype(self.manifest.dtype))
        wanted = np.dtype(self.item_loader.dtype) if self.item_loader.dtype else stored
        vocab = (self.manifest.tokenizer or {}).get("vocab_size")
        largest = max(int(vocab) - 1 if isinstance(vocab, int) else np.iinfo(stored).max, self.pad_id)
        if largest > np.iinfo(wanted).max:
            raise ValueError(
                f"TokensLoader.dtype {wanted} cannot hold the token ids of {self.input_dir} (up to {largest}, stored as "
                f"{stored}); use torch.int64"
            )
        return wanted

    # ---- reading ---------------------------------------------------------------------------

    def read_blocks(self, sample_ids: np.ndarray) -> dict[str, np.ndarray]:
        """Token blocks for these sample ids (as `ds[i]`) as arrays of shape (len(ids), block_size)."""
        n, block = len(sample_ids), self.block_size
        out = {"input_ids": np.empty((n, block), dtype=self.token_dtype)}
        if self.item_loader.document_boundaries:
            out["position_ids"] = np.empty((n, block), dtype=np.int64)
        self.fill_blocks(sample_ids, out, np.arange(n))
        return out

    def fill_blocks(self, sample_ids: np.ndarray, out: dict[str, np.ndarray], dest: np.ndarray) -> None:
        """Write the blocks of these sample ids into rows `dest` of the arrays in `out`."""
        # Blocks inside one shard are gathered shard by shard (tokens, and positions when asked);
        # only the few that cross a shard boundary or hit the end are read one by one.
        tokens, positions = out["input_ids"], out.get("position_ids")
        sample_ids = self.to_base(sample_ids)  # a subsample's or split's ids -> stored blocks
        starts = np.asarray(sample_ids, dtype=np.int64) * self.block_size
        rest = self.reader.gather_blocks(starts, self.block_size, tokens, dest)
        if positions is not None:
            self.reader.gather_positions(starts, self.block_size, positions, rest, dest)
        for k in rest.tolist():
            row = int(dest[k])
            self._read_block(int(sample_ids[k]), tokens[row], None if positions is None else positions[row])

    def _read_block(self, sample: int, out: np.ndarray, positions: np.ndarray | None) -> None:
        start = sample * self.block_size
        stop = min(start + self.block_size, self.reader.total)
        if self.edges is None:
            self.reader.read(start, stop, out, positions)
        else:  # a straddling block: the parts that kept edges hold are read from them (edges.py)
            self.edges.read(self.reader, start, stop, out, positions)
        out[stop - start :] = self.pad_id

    def _unkept(self, shards: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """(first, last) shard of each block, less the parts of two-shard blocks that kept edges hold."""
        keep = np.ones(shards.shape, dtype=bool)
        starts = self.reader.starts
        for k in np.flatnonzero(shards[:, 1] == shards[:, 0] + 1).tolist():
            a, b = int(shards[k, 0]), int(shards[k, 1])
            keep[k, 0] = not self.edges.covers(a, int(tokens[k, 0] - starts[a]), int(starts[a + 1] - starts[a]))
            keep[k, 1] = not self.edges.covers(b, 0, int(tokens[k, 1] + 1 - starts[b]))
        return shards[keep]

    def verify(self) -> None:
        """Check every shard's size and checksum against the manifest (raises ShardError)."""
        self.reader.verify()

    # ---- the source contract (source.py) ------------------------------------------------------

    def to_base(self, ids: np.ndarray) -> np.ndarray:
        """Sample ids of this dataset (a subsample or split of the stored samples) -> stored sample ids."""
        return np.asarray(ids, dtype=np.int64) if self.view is None else self.view(ids)

    def reads_remote(self) -> bool:
        return self.cache is not None

    def release(self) -> None:
        if self.cache is not None:
            self.reader.files.release()

    def remote_counters(self, wait: bool = False) -> dict[str, int]:
        if self.cache is None:
            return zero_remote()
        if wait:
            self.cache.wait_prefetches()
        return self.cache.counters.snapshot()

    def order(self, epoch: int) -> Callable[[np.ndarray], np.ndarray]:
        return self.epoch_permutation(epoch)

    def epoch_permutation(self, epoch: int, component: str = "shuffle", legacy: bool | None = None,
                          legacy_window: bool | None = None) -> Callable[[np.ndarray], np.ndarray]:
        """Epoch position -> sample id: global or windowed shuffle (or storage order).

        The shuffle's seed is `derive_seed(seed, component, epoch)` (a mixture asks for its sources'
        orders under components of their own); `legacy` (default: this dataset's, set by a
        version-1 state) keys it by seed + epoch instead, as before state version 2;
        `legacy_window` (default: this dataset's, set by a state before version 3) reads the blocks
        that straddle two shards in the earlier shard's window, as windowed orders did before.
        """
        legacy = self.legacy_seeds if legacy is None else legacy
        legacy_window = self.legacy_window if legacy_window is None else legacy_window
        straddles = None if legacy_window or self.view is not None else self.straddles
        key = (epoch, component, legacy, straddles is None, self.seed, self.shuffle, self.shuffle_algorithm,
               self.shuffle_window)
        # a windowed order costs O(shards) to set up: keep the last (set_view() drops it)
        cached = self._order
        if cached is None or cached[0] != key:
            cached = self._order = (key, epoch_order(self.num_samples, self.seed, epoch, self.shuffle,
                                                     self.shuffle_algorithm, self.shuffle_window, self.sample_starts,
                                                     component=component, legacy=legacy, straddles=straddles))
        return cached[1]

    def hint_samples(self, sample_ids: np.ndarray) -> None:
        """Remote data: tell the cache which shards these samples read, each once, in order of first use."""
        if self.cache is None or not len(sample_ids):
            return
        samples = self.to_base(sample_ids)
        if self.manifest.kind == "tokens":
            first = samples * self.block_size
            last = np.minimum(first + self.block_size, self.reader.total) - 1
            ids = np.stack([first, last], axis=1).reshape(-1)
        else:
            ids = samples
        shards = np.searchsorted(self.reader.starts, ids, side="right") - 1
        if self.edges is not None:  # a straddling block's part that an edge holds needs no fetch of its shard
            shards = self._unkept(shards.reshape(-1, 2), ids.reshape(-1, 2))
        first_seen = np.ones(len(shards), dtype=bool)
        first_seen[1:] = shards[1:] != shards[:-1]
        self.cache.hint(list(dict.fromkeys(shards[first_seen].tolist())))
