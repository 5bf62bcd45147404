"""MinHash signatures over word n-grams, vectorised over a whole chunk of records with numpy.

A record's text is lower-cased and split on ASCII whitespace into words; every run
of `ngram` consecutive words is a shingle (a record with fewer words is one
shingle). Each shingle hashes to 64 bits; permutation p maps a shingle hash x to
`a_p * x + b_p mod 2**64` (multiply-add, a_p odd) and the signature's entry p is
the high 32 bits of the minimum over the record's shingles. `a_p, b_p` come from
a numpy generator seeded with `seed`: the same seed gives the same signatures on
every machine, process and engine.

Everything runs on arrays covering a chunk's bytes: word hashes are a polynomial
hash of their bytes computed with `np.add.reduceat`, n-gram hashes a weighted sum
of word hashes, and the minimum per record `np.minimum.reduceat` over blocks of
permutations (so the shingles x permutations matrix stays a few MB).
"""

from __future__ import annotations

import numpy as np

from llm.data.corpus_dedup.lsh import mix64

_WHITESPACE = np.zeros(256, dtype=bool)
_WHITESPACE[[9, 10, 11, 12, 13, 28, 29, 30, 31, 32]] = True  # what bytes.split() splits on, plus str's separators
_BYTE_BASE = np.uint64(0x100000001B3)  # FNV's prime: an odd multiplier for the polynomial word hash
_SHINGLE_BLOCK = 1 << 16  # shingles x permutations per block: 64 Ki x 16 x 8 bytes = 8 MB
_PERM_BLOCK = 16
_BATCH_CHARS = 4 << 20  # text hashed together: enough to amortise numpy's per-call cost
_U64 = np.uint64


class MinHasher:
    """Signatures (n_records, num_perm) uint32 for lists of texts; deterministic for (ngram, num_perm, seed)."""

    def __init__(self, num_perm: int, ngram: int, seed: int):
        rng = np.random.Generator(np.random.PCG64(seed))
        self.num_perm, self.ngram = num_perm, ngram
        self.a = rng.integers(0, 2**64, size=num_perm, dtype=np.uint64, endpoint=False) | _U64(1)
        self.b = rng.integers(0, 2**64, size=num_perm, dtype=np.uint64, endpoint=False)
        self.gram_weights = mix64(np.arange(1, ngram + 1, dtype=np.uint64) * _U64(0x9E3779B97F4A7C15)) | _U64(1)
        self._powers = np.ones(1, dtype=np.uint64)

    def _power_table(self, length: int) -> np.ndarray:
        """base**i mod 2**64 for i < length (grown, never shrunk)."""
        if len(self._powers) < length:
            powers = np.ones(length, dtype=np.uint64)
            with np.errstate(over="ignore"):
                powers[1:] = np.cumprod(np.full(length - 1, _BYTE_BASE, dtype=np.uint64), dtype=np.uint64)
            self._powers = powers
        return self._powers[:length]

    def word_hashes(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(hash per word of all texts, number of words per text): the chunk's words, in order."""
        encoded = [t.lower().encode("utf-8", "surrogatepass") for t in texts]
        data = np.frombuffer(b" ".join(encoded) + b" ", dtype=np.uint8)
        # texts are joined by one space, so a text boundary is a word boundary too
        space = _WHITESPACE[data]
        starts = np.flatnonzero(~space & np.concatenate(([True], space[:-1])))
        ends = np.flatnonzero(~space & np.concatenate((space[1:], [True]))) + 1
        lengths = ends - starts
        n = len(data)
        # position of each byte inside its word (meaningless on spaces, whose terms are zeroed below)
        pos = np.arange(n, dtype=np.int64)
        offset = np.zeros(n, dtype=np.int64)
        offset[starts] = starts - np.concatenate(([0], starts[:-1]))
        pos_in_word = pos - np.cumsum(offset)
        pos_in_word[space] = 0
        max_len = int(lengths.max()) if len(lengths) else 1
        powers = self._power_table(max_len)
        with np.errstate(over="ignore"):
            terms = (data.astype(np.uint64) + _U64(1)) * powers[pos_in_word]
            terms[space] = 0
            sums = np.add.reduceat(terms, starts) if len(starts) else np.zeros(0, np.uint64)
            hashes = mix64(sums ^ (lengths.astype(np.uint64) * _U64(0xC2B2AE3D27D4EB4F)))
        # words per text: text boundaries in byte offsets of the joined buffer
        text_ends = np.cumsum([len(e) + 1 for e in encoded]) - 1  # offset of each separator space
        words_per_text = np.diff(np.concatenate(([0], np.searchsorted(starts, text_ends))))
        return hashes, words_per_text

    def shingles(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(hash per shingle, number of shingles per text): every text gets at least one shingle."""
        words, counts = self.word_hashes(texts)
        n = self.ngram
        text_start = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
        text_end = text_start + counts
        per_text = np.maximum(counts - n + 1, 1)
        # shingle j of text t starts at word text_start[t] + j and takes up to n words (fewer: a short text)
        owner = np.repeat(np.arange(len(texts)), per_text)
        first = np.repeat(text_start, per_text) + (np.arange(per_text.sum()) - np.repeat(np.cumsum(per_text) - per_text, per_text))
        limit = text_end[owner]
        padded = np.concatenate((words, np.zeros(n, dtype=np.uint64)))
        acc = np.zeros(len(first), dtype=np.uint64)
        with np.errstate(over="ignore"):
            for k in range(n):
                inside = (first + k) < limit
                acc += np.where(inside, padded[np.minimum(first + k, len(padded) - 1)], _U64(0)) * self.gram_weights[k]
            return mix64(acc), per_text

    def signatures(self, texts: list[str]) -> np.ndarray:
        """(len(texts), num_perm) uint32 MinHash signatures, a batch of about `_BATCH_CHARS` characters at a time.

        The per-byte arrays of a batch take about 50 bytes per byte of text: batches bound them (~200 MB).
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
        out = np.empty((len(texts), self.num_perm), dtype=np.uint32)
        shingles, per_text = self.shingles(texts)
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


def estimated_jaccard(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Share of equal entries of paired signatures (n, num_perm) -> (n,) float: the Jaccard estimate."""
    return (a == b).mean(axis=1)
