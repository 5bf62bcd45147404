"""Audit's view of the token-shard sources a ledger names: each rebuilt as trained, its order and its bytes now."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from llm.data.ledger.format import BY_DTYPE, RULES, row_checksums
from llm.data.shards.format.loaders import TokensLoader
from llm.data.shards.read.dataset import StreamingDataset

_BY_DTYPE = [RULES[name] for name in BY_DTYPE]


class ShardAuditor:
    """Audit's view of the token-shard sources a ledger header names: their order and their bytes now."""

    def __init__(self, sources: list[dict[str, Any]], checksum: Callable[..., np.ndarray] = row_checksums):
        self.sources = sources
        self.checksum = checksum  # the ledger's rule (format.checksum_rule): version 1 ledgers have their own
        self._datasets: dict[int, Any] = {}
        self._dtypes: dict[int, np.dtype | None] = {}
        self.problems: list[str] = []

    def dataset(self, s: int) -> Any | None:
        """Source s rebuilt with the settings it was trained with (None, with a problem named, if it cannot be)."""
        if s in self._datasets:
            return self._datasets[s]
        info, ds = self.sources[s], None
        try:
            ds = StreamingDataset(info["path"], item_loader=TokensLoader(block_size=info["block_size"]) if
                                  info.get("block_size") else None, shuffle=info["shuffle"], seed=info["seed"],
                                  shuffle_window=info.get("shuffle_window") or "global",
                                  subsample=info.get("subsample", 1.0),
                                  # the short last block dropped or not: it changes the count, so the order
                                  drop_partial_block=bool(info.get("drop_partial_block", False)))
        except (OSError, ValueError) as e:
            self.problems.append(f"{info.get('name')} ({info.get('path')}) cannot be opened to check it: {e}")
        except (KeyError, TypeError) as e:  # a header edited by hand: a key gone, or a value of another type
            self.problems.append(f"the ledger header's entry of source {s} ({info.get('name')!r}) is damaged "
                                 f"({type(e).__name__}: {e}); restore ledger.json, its source is not checked")
        if ds is not None and ds.fingerprint != info.get("fingerprint"):
            self.problems.append(f"{info['name']} ({info['path']}) changed since the run: its fingerprint is "
                                 f"{ds.fingerprint[:12]}, the run trained on {str(info.get('fingerprint'))[:12]}")
            ds = None
        if ds is not None and info.get("split") is not None:
            ds = None  # a train_test_split view: its order is not rebuilt here; its counts are still audited
        self._datasets[s] = ds
        return ds

    def expected_items(self, s: int, epoch: int, count: int) -> np.ndarray:
        ds = self.dataset(s)
        if ds is None:
            return np.empty(0, np.int64)
        key = self.sources[s].get("order")  # a mixture's source: its order under the mixture's component
        order = ds.epoch_permutation(epoch, key) if key else ds.order(epoch)
        return order(np.arange(count, dtype=np.int64))

    def stored_dtype(self, s: int) -> np.dtype | None:
        """The dtype the run checksummed source s's rows in (its header entry's `checksum_dtype`), None for the rules
        that take the ids' values whatever holds them (versions 1 and 2); a header without it is a problem named."""
        if self.checksum not in _BY_DTYPE:
            return None
        if s not in self._dtypes:
            info, self._dtypes[s] = self.sources[s], None
            try:
                self._dtypes[s] = np.dtype(info["checksum_dtype"])
            except (KeyError, TypeError) as e:
                self.problems.append(f"the ledger header's entry of source {s} ({info.get('name')!r}) has no valid "
                                     f"checksum_dtype ({type(e).__name__}: {e}); restore ledger.json, its samples' "
                                     "checksums are not checked")
        return self._dtypes[s]

    def verify(self, s: int, items: np.ndarray, crcs: np.ndarray) -> np.ndarray:
        ds = self.dataset(s)
        if ds is None or not self.sources[s].get("block_size"):
            return np.ones(len(items), bool)
        dtype = self.stored_dtype(s)
        if self.checksum in _BY_DTYPE and dtype is None:
            return np.ones(len(items), bool)
        good = np.empty(len(items), bool)
        for lo in range(0, len(items), 4096):  # bounded memory for long runs
            blocks = ds.read_blocks(items[lo:lo + 4096])["input_ids"]
            # read in the loader's dtype now; the rule casts them back to the dtype the run checksummed them in
            good[lo:lo + 4096] = self.checksum(blocks, dtype) == crcs[lo:lo + 4096]
        return good
