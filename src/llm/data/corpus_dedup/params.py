"""What a dedup run is asked to do (`DedupParams`): checked once, recorded in the report and the work folder."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from llm.data.corpus_dedup.lsh import choose_bands
from llm.data.inputs.dedup import check_hash_algo

DEFAULT_NGRAM = 5
DEFAULT_PERMUTATIONS = 128
DEFAULT_SEED = 1


@dataclass(frozen=True)
class DedupParams:
    """Exact dedup always; near dedup (MinHash-LSH) when `near` is a Jaccard threshold in (0, 1]."""

    near: float | None = None
    text_column: str = "text"
    hash_algo: str = "sha256"
    ngram: int = DEFAULT_NGRAM
    num_perm: int = DEFAULT_PERMUTATIONS
    bands: int = 0  # 0: chosen for the threshold (lsh.choose_bands)
    rows: int = 0
    seed: int = DEFAULT_SEED
    chunk_records: int = 50_000  # records a scan task holds at once: the memory bound of every stage
    minhash: str = "numpy"  # the MinHash engine (minhash.resolve_engine): "numpy" or "rensa", never "auto" here

    def __post_init__(self) -> None:
        check_hash_algo(self.hash_algo)
        if self.near is not None:
            if isinstance(self.near, bool) or not isinstance(self.near, (int, float)) or math.isnan(self.near) \
                    or not 0 < self.near <= 1:
                raise ValueError(f"near threshold must be a Jaccard similarity in (0, 1], got {self.near!r}")
            object.__setattr__(self, "near", float(self.near))
        for name in ("ngram", "num_perm", "chunk_records"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.near is not None and not (self.bands and self.rows):
            bands, rows = choose_bands(self.near, self.num_perm)
            object.__setattr__(self, "bands", bands)
            object.__setattr__(self, "rows", rows)
        if self.near is not None and self.bands * self.rows > self.num_perm:
            raise ValueError(f"bands x rows ({self.bands} x {self.rows}) exceeds num_perm {self.num_perm}")
        if self.minhash not in ("numpy", "rensa"):
            raise ValueError(f"minhash engine must be 'numpy' or 'rensa' once resolved, got {self.minhash!r}")
        if not self.text_column:
            raise ValueError("text_column must be a non-empty JSON key / parquet column name")

    def record(self) -> dict:
        """The parameters as the report and the work folder's plan write them."""
        out = asdict(self)
        if self.near is None:
            for key in ("ngram", "num_perm", "bands", "rows", "seed", "minhash"):
                out.pop(key)
        return out
