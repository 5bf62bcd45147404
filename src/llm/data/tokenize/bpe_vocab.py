"""Which tokenizer.json files another BPE engine can encode token for token, decided by structure.

`tokenizers` is the reference for a tokenizer.json. Other engines (`tiktoken`, `fastokens`) are
used for one only when its structure is one we have verified they reproduce exactly:

* a byte-level BPE: `ByteLevel` pre-tokenizer (GPT-2's split pattern, no prefix space), no
  normalizer, a `BPE` model without dropout, word prefixes/suffixes or byte fallback, no
  truncation or padding;
* added tokens matched as plain strings (no `single_word`, `lstrip`, `rstrip`).

`tiktoken` merges by token rank, not by the merge list, so it needs more (`tiktoken_ranks`): token
ids that grow with the merge order, and every merge being the split that rank-order merging
itself reaches for that token (checked for every token). Then both merge the same pairs in the
same order on any input: a token forms only from its own bytes, by the same steps as alone.

A vocabulary may lack some of the 256 byte symbols (a BPE trained without the byte alphabet as
`initial_alphabet`); `tokenizers` then drops those bytes from each pre-token, and the fast engines
refuse such a file. `complete_byte_alphabet` gives them the same vocabulary with the missing
symbols added under new ids that no merge uses: on text without those bytes it encodes exactly
like the original (engines.py re-encodes every other document with `tokenizers`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

# GPT-2's pre-tokenisation pattern: what a ByteLevel(use_regex=True) pre-tokenizer splits with,
# and what .tiktoken files of GPT-2's family need (they carry ranks only, not the pattern).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class Unsupported(ValueError):
    """This vocabulary's structure is not one the engine is verified to reproduce."""


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character standing for each byte, reversed."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


@dataclass
class ByteLevelBPE:
    """The parts of a byte-level BPE tokenizer.json that encoding depends on."""

    vocab: dict[str, int]
    merges: list[tuple[str, str]]
    added: dict[str, int] = field(default_factory=dict)  # added token text -> id (matched anywhere)
    ignore_merges: bool = False  # a word that is itself a token is emitted whole
    missing_bytes: list[str] = field(default_factory=list)  # byte symbols absent from the vocabulary


def _reject(condition: bool, why: str) -> None:
    if condition:
        raise Unsupported(why)


def read_byte_level_bpe(path: Path) -> ByteLevelBPE:
    """Parse `path`; raise `Unsupported` naming the first feature outside the verified structure."""
    return byte_level_bpe(_read_json(path))


def _read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise Unsupported(f"cannot read {path} as JSON ({e})") from None


def byte_level_bpe(data: dict) -> ByteLevelBPE:
    """The parsed tokenizer.json `data` as a `ByteLevelBPE`, or `Unsupported` naming what is outside it."""
    _reject(not isinstance(data, dict), "not a tokenizer.json object")
    _reject(data.get("normalizer") is not None, "it has a normalizer")
    _reject(data.get("truncation") is not None or data.get("padding") is not None, "it sets truncation or padding")
    pre = data.get("pre_tokenizer") or {}
    _reject(pre.get("type") != "ByteLevel", f"its pre-tokenizer is {pre.get('type')!r}, not ByteLevel")
    _reject(bool(pre.get("add_prefix_space")), "its ByteLevel pre-tokenizer adds a prefix space")
    _reject(not pre.get("use_regex", True), "its ByteLevel pre-tokenizer does not split with GPT-2's pattern")
    model = data.get("model") or {}
    _reject(model.get("type") != "BPE", f"its model is {model.get('type')!r}, not BPE")
    _reject(model.get("dropout") not in (None, 0, 0.0), "its BPE has dropout")
    _reject(bool(model.get("continuing_subword_prefix")) or bool(model.get("end_of_word_suffix")),
            "its BPE has a subword prefix or word suffix")
    _reject(bool(model.get("byte_fallback")), "its BPE uses byte fallback")
    vocab = model.get("vocab")
    _reject(not isinstance(vocab, dict), "its BPE has no vocab object")
    merges = []
    for m in model.get("merges") or []:
        pair = m.split(" ") if isinstance(m, str) else m
        _reject(not isinstance(pair, list) or len(pair) != 2, f"merge {m!r} is not a pair")
        merges.append((pair[0], pair[1]))
    missing = [c for c in byte_decoder() if c not in vocab]
    added = {}
    for tok in data.get("added_tokens") or []:
        _reject(any(tok.get(k) for k in ("single_word", "lstrip", "rstrip")),
                f"added token {tok.get('content')!r} has single_word/lstrip/rstrip matching")
        _reject(not tok.get("content"), "an added token is empty")
        added[tok["content"]] = int(tok["id"])
    return ByteLevelBPE(vocab=vocab, merges=merges, added=added, ignore_merges=bool(model.get("ignore_merges")),
                        missing_bytes=missing)


def complete_byte_alphabet(path: Path) -> tuple[str, int | None]:
    """(tokenizer.json text, first added id): `path` with the byte symbols it lacks added, or as it is.

    The added symbols get ids after every id in the file (vocabulary and added tokens), so an
    encoding that holds an id >= the first one met a byte the original vocabulary drops. None
    when nothing lacks. Raises `Unsupported` for a file outside the verified structure.
    """
    data = _read_json(path)
    bpe = byte_level_bpe(data)
    if not bpe.missing_bytes:
        return Path(path).read_text(encoding="utf-8"), None
    first = 1 + max([*bpe.vocab.values(), *bpe.added.values()])
    vocab = data["model"]["vocab"]
    for offset, symbol in enumerate(bpe.missing_bytes):
        vocab[symbol] = first + offset
    return json.dumps(data, ensure_ascii=False), first


def _to_bytes(symbol: str) -> bytes:
    decoder = byte_decoder()
    try:
        return bytes(decoder[c] for c in symbol)
    except KeyError:
        raise Unsupported(f"vocabulary entry {symbol!r} is not in the byte-level alphabet") from None


def _rank_merge(ranks: dict[bytes, int], piece: bytes, below: int) -> list[bytes]:
    """tiktoken's merge loop on `piece`, using only ranks below `below`: lowest rank first, leftmost on ties."""
    parts = [piece[i : i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best, at = below, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1], below)
            if rank < best:
                best, at = rank, i
        if at < 0:
            break
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    return parts


def tiktoken_ranks(bpe: ByteLevelBPE) -> tuple[dict[bytes, int], dict[str, int]]:
    """(mergeable ranks, special tokens) for a `tiktoken.Encoding` identical to `bpe`; or `Unsupported`.

    A rank is the token's id. Vocabulary entries no merge produces (added tokens aside) are left
    out: `tokenizers` never emits them, and neither does an encoder that does not know them.
    """
    ranks = {bytes([b]): bpe.vocab[symbol] for symbol, b in byte_decoder().items()}
    merged: list[tuple[bytes, bytes, int]] = []
    last = -1
    for left, right in bpe.merges:
        token = left + right
        _reject(token not in bpe.vocab, f"merge {left!r} {right!r} makes {token!r}, which is not in the vocabulary")
        tid = bpe.vocab[token]
        _reject(tid <= last, f"token ids do not grow with the merge order (at {token!r})")
        last = tid
        a, b = _to_bytes(left), _to_bytes(right)
        _reject(a + b in ranks, f"two merges make {token!r}")
        ranks[a + b] = tid
        merged.append((a, b, tid))
    for a, b, tid in merged:
        _reject(_rank_merge(ranks, a + b, tid) != [a, b],
                f"rank-order merging does not split {a + b!r} as its merge {a!r} {b!r} does")
    if bpe.ignore_merges:
        made = {*byte_decoder(), *(left + right for left, right in bpe.merges), *bpe.added}
        _reject(any(symbol not in made for symbol in bpe.vocab), "it emits whole words no merge makes (ignore_merges)")
    ids = set(ranks.values())
    _reject(len(ids) != len(ranks), "two byte symbols share an id")
    _reject(any(tid in ids for tid in bpe.added.values()), "an added token shares its id with a merged token")
    texts = sorted(bpe.added)
    # tiktoken matches special tokens in no defined order: one being a prefix of another is ambiguous.
    _reject(any(b.startswith(a) for a, b in zip(texts, texts[1:])), "one added token is a prefix of another")
    return ranks, dict(bpe.added)


def tokenizer_json_from_ranks(ranks: dict[bytes, int], added: dict[str, int] | None = None) -> dict:
    """A `tokenizers` tokenizer.json (as a dict) encoding like `tiktoken` with these ranks and GPT-2's pattern.

    Each token's merge is the split rank-order merging reaches for it, so the file passes
    `tiktoken_ranks`. `added` tokens are matched anywhere in text (tiktoken's `allowed_special="all"`).
    """
    chars = {b: c for c, b in byte_decoder().items()}

    def sym(token: bytes) -> str:
        return "".join(chars[b] for b in token)

    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) > 1:
            parts = _rank_merge(ranks, token, rank)
            _reject(len(parts) != 2, f"no merge of two tokens below its rank makes {token!r}")
            merges.append([sym(parts[0]), sym(parts[1])])
    vocab = {sym(t): r for t, r in ranks.items()}
    added_tokens = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
        for t, i in (added or {}).items()
    ]
    vocab.update(added or {})
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens, "normalizer": None,
        "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
