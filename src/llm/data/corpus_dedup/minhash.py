"""MinHash signatures over word n-grams, vectorised over a whole chunk of records with numpy.

A record's text is lower-cased and split on ASCII whitespace into words; every run
of `ngram` consecutive words is a shingle (a record with fewer words is one
shingle). Each shingle hashes to 64 bits; permutation p maps a shingle hash x to
`a_p * x + b_p mod 2**64` (multiply-add, a_p odd) and the signature's entry p is
the high 32 bits of the minimum over the record's shingles. `a_p, b_p` come from
a numpy generator seeded with `seed`: the same seed gives the same signatures on
every machine, process and engine.

Everything runs on arrays covering a batch of texts' bytes: word hashes are a polynomial
hash of their bytes (read off one prefix sum), n-gram hashes a weighted sum of word
hashes, and the minimum per record `np.minimum.reduceat` over blocks of permutations
(so the shingles x permutations matrix stays a few MB), or rensa's R-MinHash of the
same shingle hashes.
"""

from __future__ import annotations

from array import array
from functools import cached_property

import numpy as np

from llm.data.corpus_dedup.lsh import mix64

_BYTE_BASE = np.uint64(0x100000001B3)  # FNV's prime: an odd multiplier for the polynomial word hash
_BYTE_BASE_INV = np.uint64(pow(0x100000001B3, -1, 1 << 64))  # its inverse mod 2**64
_SHINGLE_BLOCK = 1 << 16  # shingles x permutations per block: 64 Ki x 16 x 8 bytes = 8 MB
_PERM_BLOCK = 16
# text hashed together: enough to amortise numpy's per-call cost (~1 µs a call), and its ~10 MB of arrays
# stay in cache (1 M-character batches were ~20% slower)
_BATCH_CHARS = 1 << 18
_U64, _U8 = np.uint64, np.uint8
_U32_CODE = "I" if array("I").itemsize == 4 else "L"  # the array type code of 32-bit unsigned ints


ENGINES = ("auto", "rensa", "numpy")
RENSA_EXTRA = "pip install 'llm-stream-data[dedup-fast]' (rensa>=0.5,<0.6)"


def rensa_available() -> bool:
    try:
        import rensa  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_engine(name: str) -> str:
    """The MinHash engine a run uses: `auto` is rensa when it is installed, numpy otherwise."""
    if name not in ENGINES:
        raise ValueError(f"minhash engine must be one of {', '.join(ENGINES)}, got {name!r}")
    if name == "auto":
        return "rensa" if rensa_available() else "numpy"
    if name == "rensa" and not rensa_available():
        raise ValueError(f"minhash engine 'rensa' is not installed: {RENSA_EXTRA}, or pass minhash='numpy'")
    return name


_TABLES = [np.ones(1, dtype=np.uint64), np.ones(1, dtype=np.uint64)]  # base**i, base**-i: per process, grown


def _power_tables(length: int) -> tuple[np.ndarray, np.ndarray]:
    """(base**i, base**-i) mod 2**64 for i < length (the base is odd, so invertible mod 2**64).

    Shared by every hasher of the process (a scan task makes one per input) and grown by doubling,
    so a process computes them about once.
    """
    if len(_TABLES[0]) < length:
        size = max(length, 2 * len(_TABLES[0]))
        with np.errstate(over="ignore"):
            _TABLES[0] = np.cumprod(np.concatenate(([_U64(1)], np.full(size - 1, _BYTE_BASE))), dtype=np.uint64)
            _TABLES[1] = np.cumprod(np.concatenate(([_U64(1)], np.full(size - 1, _BYTE_BASE_INV))), dtype=np.uint64)
    return _TABLES[0][:length], _TABLES[1][:length]


class MinHasher:
    """Signatures (n_records, num_perm) uint32 for lists of texts; deterministic for (ngram, num_perm, seed, engine).

    Both engines sign the same shingle hashes (this module's word n-grams). `numpy` applies this
    module's permutations; `rensa` hands the shingle hashes of a batch to rensa's R-MinHash in one
    call (Rust, ~10x faster). Their signatures differ (another sketch), and so do their errors:
    `params.verify_margin` says how far below the threshold a rensa estimate still verifies.
    """

    def __init__(self, num_perm: int, ngram: int, seed: int, engine: str = "numpy"):
        if engine not in ("numpy", "rensa"):
            raise ValueError(f"MinHasher engine must be 'numpy' or 'rensa' (resolve 'auto' first), got {engine!r}")
        self.num_perm, self.ngram, self.seed, self.engine = num_perm, ngram, seed, engine
        self.gram_weights = mix64(np.arange(1, ngram + 1, dtype=np.uint64) * _U64(0x9E3779B97F4A7C15)) | _U64(1)

    @cached_property
    def _permutations(self) -> tuple[np.ndarray, np.ndarray]:
        """The numpy engine's (a, b) per permutation: made on first use, so that rensa's signing never imports
        numpy.random (~6 ms in each fresh worker process)."""
        rng = np.random.Generator(np.random.PCG64(self.seed))
        a = rng.integers(0, 2**64, size=self.num_perm, dtype=np.uint64, endpoint=False) | _U64(1)
        b = rng.integers(0, 2**64, size=self.num_perm, dtype=np.uint64, endpoint=False)
        return a, b

    @property
    def a(self) -> np.ndarray:
        return self._permutations[0]

    @property
    def b(self) -> np.ndarray:
        return self._permutations[1]

    def word_hashes(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(hash per word of all texts, number of words per text): the chunk's words, in order.

        A word's hash is the polynomial sum of (byte + 1) * base**i over its bytes (i from 0 at
        its first byte), mixed with its length. It is read off one prefix sum over the whole
        buffer: prefix[end] - prefix[start] is the word's sum times base**start, which
        base**-start undoes. Three passes over the bytes instead of one per step of a per-word
        position count; the same hashes, so the same signatures as before.
        """
        # str.lower() of an ASCII text is its bytes' A-Z to a-z, done below for the whole buffer at once
        # (a lowered text has no A-Z left): the per-text call is left to the others
        encoded = [t.encode("utf-8", "surrogatepass") if t.isascii() else t.lower().encode("utf-8", "surrogatepass")
                   for t in texts]
        data = np.frombuffer(b" ".join(encoded) + b" ", dtype=np.uint8)
        # texts are joined by one space, so a text boundary is a word boundary too
        with np.errstate(over="ignore"):  # uint8 arithmetic wraps: x - 9 < 5 is 9 <= x <= 13
            data = data + ((data - _U8(65)) < 26).view(np.uint8) * _U8(32)
            space = ((data - _U8(9)) < 5) | ((data - _U8(28)) < 5)  # what bytes.split() splits on, and \x1c-\x1f
        edge = np.flatnonzero(space[1:] != space[:-1]) + 1  # where a run of word or space bytes begins
        # runs alternate, and the buffer ends with a space: every word ends where the next space run begins
        if len(data) and not space[0]:
            starts, ends = np.concatenate(([0], edge[1::2])), edge[0::2]
        else:
            starts, ends = edge[0::2], edge[1::2]
        n = len(data)
        powers, inverse = _power_tables(n + 1)
        with np.errstate(over="ignore"):
            prefix = np.empty(n + 1, dtype=np.uint64)
            prefix[0] = 0
            terms = data.astype(np.uint64)
            terms += _U64(1)
            terms *= powers[:n]
            np.cumsum(terms, out=prefix[1:])
            del terms
            sums = (prefix[ends] - prefix[starts]) * inverse[starts]
            hashes = mix64(sums ^ ((ends - starts).astype(np.uint64) * _U64(0xC2B2AE3D27D4EB4F)))
        # words per text: text boundaries in byte offsets of the joined buffer
        text_ends = np.cumsum([len(e) + 1 for e in encoded]) - 1  # offset of each separator space
        words_per_text = np.diff(np.concatenate(([0], np.searchsorted(starts, text_ends))))
        return hashes, words_per_text

    def shingles(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(hash per shingle, number of shingles per text): every text gets at least one shingle.

        Shingle j of a text of at least n words is the weighted sum of its words j..j+n-1: n shifted
        multiply-adds over the chunk's whole word array give every window, and the windows that stay
        inside one text are kept. A shorter text is one shingle of all its words (summed apart).
        """
        words, counts = self.word_hashes(texts)
        n = self.ngram
        text_start = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
        text_end = text_start + counts
        per_text = np.maximum(counts - n + 1, 1)
        padded = np.concatenate((words, np.zeros(n, dtype=np.uint64)))
        total = len(words)
        out = np.empty(int(per_text.sum()), dtype=np.uint64)
        whole = counts >= n
        with np.errstate(over="ignore"):
            windows = padded[:total] * self.gram_weights[0]
            for k in range(1, n):
                windows += padded[k : k + total] * self.gram_weights[k]
            inside = np.arange(total) + n <= np.repeat(text_end, counts)  # the window ends within its text
            out[np.repeat(whole, per_text)] = windows[inside]
            short = np.flatnonzero(~whole)
            if len(short):  # fewer than n words: one shingle of all of them (none: a shingle of nothing)
                first, limit = text_start[short], text_end[short]
                acc = np.zeros(len(short), dtype=np.uint64)
                for k in range(n):
                    take = (first + k) < limit
                    acc += np.where(take, padded[np.minimum(first + k, len(padded) - 1)], _U64(0)) * self.gram_weights[k]
                out[np.repeat(~whole, per_text)] = acc
            return mix64(out), per_text

    def signatures(self, texts: list[str]) -> np.ndarray:
        """(len(texts), num_perm) uint32 MinHash signatures, a batch of about `_BATCH_CHARS` characters at a time.

        The per-byte arrays of a batch take about 40 bytes per byte of text: batches bound them (~10 MB).
        """
        out = np.empty((len(texts), self.num_perm), dtype=np.uint32)
        start, size = 0, 0
        for i, text in enumerate(texts):
            size += len(text)
            if size >= _BATCH_CHARS or i == len(texts) - 1:
                out[start : i + 1] = self._batch(texts[start : i + 1])
                start, size = i + 1, 0
        return out

    def _batch(self, texts: list[str]) -> np.ndarray:
        shingles, per_text = self.shingles(texts)
        if self.engine == "rensa":
            return self._rensa(shingles, per_text)
        out = np.empty((len(texts), self.num_perm), dtype=np.uint32)
        bounds = np.concatenate(([0], np.cumsum(per_text)))
        # blocks of whole texts holding about _SHINGLE_BLOCK shingles (one long text: a block of its own)
        cuts = np.unique(np.searchsorted(bounds, np.arange(0, bounds[-1], _SHINGLE_BLOCK), side="right") - 1)
        cuts = np.concatenate((cuts[cuts > 0], [len(texts)]))
        lo = 0
        for hi in cuts.tolist():
            if hi <= lo:
                continue
            s0, s1 = int(bounds[lo]), int(bounds[hi])
            block = shingles[s0:s1, None]
            starts = bounds[lo:hi] - s0
            for p0 in range(0, self.num_perm, _PERM_BLOCK):
                a, b = self.a[None, p0 : p0 + _PERM_BLOCK], self.b[None, p0 : p0 + _PERM_BLOCK]
                with np.errstate(over="ignore"):
                    mins = np.minimum.reduceat(block * a + b, starts, axis=0)
                out[lo:hi, p0 : p0 + _PERM_BLOCK] = (mins >> _U64(32)).astype(np.uint32)
            lo = hi
        return out


    def _rensa(self, shingles: np.ndarray, per_text: np.ndarray) -> np.ndarray:
        """rensa's R-MinHash of each text's shingle hashes (one flat buffer and its row offsets, one call)."""
        from rensa import RMinHash

        offsets = np.concatenate(([0], np.cumsum(per_text))).astype(np.uint64)
        matrix = RMinHash.digest_matrix_from_flat_token_hashes(shingles, offsets, self.num_perm, self.seed)
        # to_rows() is its only way out (lists of ints, no buffer); array.fromlist converts a row in C,
        # ~4x faster than numpy reading the ints one by one
        flat = array(_U32_CODE)
        for row in matrix.to_rows():
            flat.fromlist(row)
        return np.frombuffer(flat, dtype=np.uint32).reshape(-1, self.num_perm)


def estimated_jaccard(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Share of equal entries of paired signatures (n, num_perm) -> (n,) float: the Jaccard estimate."""
    return (a == b).mean(axis=1)
