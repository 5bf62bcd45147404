"""Tokenizers behind one small interface: `simple` bytes, tokenizer.json and `.tiktoken` vocabularies.

A BPE vocabulary is encoded by one of several engines (`engines.py`), all token-identical.
"""

from __future__ import annotations

import binascii
import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from llm.data.collector import collector_paused
from llm.data.tokenize import engines as tb
from llm.data.tokenize.encoders import tokenizer_threads
from llm.data.tokenize.hub import hub_tokenizer_file, looks_like_repo_id, missing_sentence
from llm.data.tokenize.protocol import BaseTokenizer, Tokenizer  # noqa: F401  (Tokenizer: re-exported for callers)


class SimpleTokenizer(BaseTokenizer):
    """Dependency-free byte-level tokenizer: ids 0..255 are UTF-8 bytes, 256 is EOS."""

    spec = "simple"
    backend = "simple"
    eos_id = 256
    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(t.encode("utf-8")) for t in texts]

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(every text's UTF-8 bytes as one uint8 array, offsets): the ids are the bytes, no Python ints."""
        encoded = [t.encode("utf-8") for t in texts]
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        offsets = np.concatenate((np.zeros(1, dtype=np.int64), np.cumsum(lengths)))
        return np.frombuffer(b"".join(encoded), dtype=np.uint8), offsets

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def fingerprint(self) -> dict:
        return {"type": "simple", "vocab_size": self.vocab_size, "eos_id": self.eos_id}


# Common end-of-text spellings, most specific first; the first one in the vocabulary wins.
_EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|eos|>", "[SEP]", "<|end_of_text|>")


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


class _EngineTokenizer(BaseTokenizer):
    """A BPE vocabulary encoded by the engine `engines.pick` chose; subclasses load it and decode."""

    kind: str  # the fingerprint's type
    vocab_size: int
    eos_id: int
    _digest: str  # of the vocabulary file
    _args: dict[str, Any]  # the constructor's arguments but the backend
    _encoder: Any  # an engine from `engines`: TokenizersEncoder, TiktokenEncoder or FastokensEncoder

    def encode(self, text: str) -> list[int]:
        return self._encoder.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._encoder.encode_batch(texts)

    @property
    def encode_flat(self) -> Callable[[Sequence[str]], tuple[Any, Any]] | None:
        """The backend's flat batch encoder ((ids, offsets) arrays), or None if it has none."""
        return self._encoder.encode_flat

    def fingerprint(self) -> dict:
        # The vocabulary's, whichever backend encodes: every backend gives the same ids.
        return {"type": self.kind, "sha256": self._digest, "vocab_size": self.vocab_size, "eos_id": self.eos_id}

    def __getstate__(self) -> dict:
        return {**self._args, "backend": self.backend}  # pickled as what rebuilds it

    def __setstate__(self, state: dict) -> None:
        # The same engine where it is installed; any other gives the same ids.
        self.__init__(**{**state, "backend": _same_or_auto(state["backend"])})


class HFTokenizer(_EngineTokenizer):
    """A Hugging Face tokenizer.json; `tokenizers` decodes, the chosen `backend` encodes (same ids)."""

    kind = "hf"

    def __init__(self, path: Path, eos_token: str | None = None, backend: str = "tokenizers",
                 pad_token: str | None = None):
        from tokenizers import Tokenizer as _RustTokenizer

        self.path = path
        self.spec = str(path)
        self._args = {"path": path, "eos_token": eos_token, "pad_token": pad_token}
        try:
            self._tok = _RustTokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception that names no file
            raise ValueError(f"tokenizer file {path} is not a tokenizer.json that `tokenizers` can read: {e}") from None
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_id = self._find_eos(eos_token)
        # a Hugging Face tokenizer's own padding token (as_tokenizer); the fingerprint does not hold it
        self.pad_id = self._tok.token_to_id(pad_token) if pad_token else None
        self._digest = _file_digest(path)
        reference = tb.TokenizersEncoder(self._tok)
        added = [t.content for t in self._tok.get_added_tokens_decoder().values()]
        self._encoder = tb.pick(
            tb.resolve(backend), tb.json_makers(path, reference), reference, tb.probes_for(added), str(path)
        )
        self.backend: str = self._encoder.name

    def _find_eos(self, eos_token: str | None) -> int:
        for token in (eos_token,) if eos_token else _EOS_CANDIDATES:
            token_id = self._tok.token_to_id(token)
            if token_id is not None:
                return token_id
        wanted = eos_token or " or ".join(_EOS_CANDIDATES)
        raise ValueError(f"tokenizer {self.path} has no end-of-text token {wanted}; add one when training it")

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)


class TiktokenTokenizer(_EngineTokenizer):
    """A BPE from a local `.tiktoken` ranks file (e.g. GPT-2's), `<|endoftext|>` appended as EOS.

    Text is encoded as ordinary text (`<|endoftext|>` in a document is not the EOS id), by the
    chosen `backend`; `tiktoken` decodes.
    """

    kind = "tiktoken"

    def __init__(self, path: Path, backend: str = "tiktoken"):
        self.path = path
        self.spec = str(path)
        self._args = {"path": path}
        ranks = read_ranks(path)
        self.eos_id = max(ranks.values()) + 1
        self.vocab_size = self.eos_id + 1
        self._enc = tb.tiktoken_encoding(path.stem, ranks, {"<|endoftext|>": self.eos_id})
        self._digest = _file_digest(path)
        reference = tb.TiktokenEncoder(self._enc, match_special=False)
        self._encoder = tb.pick(
            tb.resolve(backend), tb.tiktoken_file_makers(path, ranks, reference, self._digest), reference, tb.probes_for([]), str(path)
        )
        self.backend: str = self._encoder.name

    def decode(self, ids: Iterable[int]) -> str:
        return self._enc.decode(list(ids))


def read_ranks(path: Path) -> dict[bytes, int]:
    """A `.tiktoken` file's mergeable ranks: one `<base64 token> <rank>` line each."""
    ranks = {}
    for line_no, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[binascii.a2b_base64(token)] = int(rank)  # b64decode, without its per-call checks
        except ValueError:
            raise ValueError(f"{path}:{line_no} is not a `<base64 token> <rank>` line of a .tiktoken file") from None
    return ranks


ENCODING_FILE = "tiktoken_encoding.json"  # beside ranks.tiktoken: a tiktoken.Encoding given to `as_tokenizer`


class TiktokenEncodingTokenizer(BaseTokenizer):
    """A `tiktoken.Encoding` of any split pattern, kept as a folder: `tiktoken_encoding.json` and `ranks.tiktoken`.

    Written by `as_tokenizer` for an Encoding that is not GPT-2's pattern with only `<|endoftext|>`
    after its ranks (that one is an ordinary `.tiktoken` file); `tiktoken` encodes text as
    ordinary text, like a `.tiktoken` file, and its `<|endoftext|>` is the EOS.
    """

    backend = "tiktoken"

    def __init__(self, path: Path, backend: str = "tiktoken"):
        if tb.resolve(backend) not in ("auto", "tiktoken"):
            raise ValueError(f"tokenizer backend {backend!r} cannot serve {path}; use tiktoken")
        self.path = path
        self.spec = str(path)
        meta = json.loads(path.read_text())
        ranks_file = path.parent / "ranks.tiktoken"
        special = meta["special_tokens"]
        if "<|endoftext|>" not in special:
            raise ValueError(f"{path} has no <|endoftext|> among its special_tokens; add it as the end-of-text token")
        self._enc = tb.tiktoken_encoding(meta["name"], read_ranks(ranks_file), special, meta["pat_str"])
        self.eos_id = special["<|endoftext|>"]
        self.vocab_size = self._enc.n_vocab
        self._digest = hashlib.sha256(path.read_bytes() + b"\0" + ranks_file.read_bytes()).hexdigest()[:16]

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._enc.encode_ordinary_batch(list(texts), num_threads=tokenizer_threads())

    def decode(self, ids: Iterable[int]) -> str:
        return self._enc.decode(list(ids))

    def fingerprint(self) -> dict:
        return {"type": "tiktoken-encoding", "sha256": self._digest, "vocab_size": self.vocab_size, "eos_id": self.eos_id}

    def __getstate__(self) -> dict:
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])


def _same_or_auto(backend: str) -> str:
    return backend if tb.installed(backend) else "auto"


def load_tokenizer(spec: str, backend: str | None = None) -> Tokenizer:
    """Load `simple`, a tokenizer.json (or a folder holding one), a `.tiktoken` file, or a hub name.

    A hub name (`gpt2`, `EleutherAI/gpt-neox-20b`) that is no file here is the tokenizer.json of
    that repository in the local Hugging Face cache (`hub.py`); nothing is downloaded.

    `backend` picks the engine that encodes a BPE vocabulary: 'tokenizers', 'tiktoken',
    'fastokens', or 'auto' (the default, or $LLM_TOKENIZER_BACKEND): the fastest installed one
    that is verified token-identical to the reference for this vocabulary
    (`llm.data.tokenize.engines`). Every backend yields the same ids and the same
    `fingerprint()`; the one chosen is the tokenizer's `backend`. `simple` has one encoder.
    """
    chosen = tb.resolve(backend)  # a bad name fails even for `simple`
    if spec == "simple":
        return SimpleTokenizer()
    # a vocabulary is a few hundred thousand small objects: with the collector walking a torch process's
    # heap as they pile up, a trained 50k BPE loaded 0.09 s (a quarter) slower, before a stream's first batch
    with collector_paused():
        return _load(spec, chosen)


def _load(spec: str, chosen: str) -> Tokenizer:
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return HFTokenizer(path / "tokenizer.json", backend=chosen)
    if path.is_dir() and (path / ENCODING_FILE).is_file():
        return TiktokenEncodingTokenizer(path / ENCODING_FILE, backend=chosen)
    if path.is_file() and path.name == ENCODING_FILE:
        return TiktokenEncodingTokenizer(path, backend=chosen)
    if path.is_file() and path.suffix == ".json":
        return HFTokenizer(path, backend=chosen)
    if path.is_file() and path.suffix == ".tiktoken":
        return TiktokenTokenizer(path, backend=chosen)
    if path.is_dir():
        raise ValueError(f"tokenizer folder {spec} holds no tokenizer.json; pass the tokenizer.json or .tiktoken file itself")
    if path.is_file():
        raise ValueError(f"tokenizer file {spec} is neither a tokenizer.json (.json) nor a .tiktoken file")
    if looks_like_repo_id(spec):
        cached = hub_tokenizer_file(spec)
        if cached is None:
            raise ValueError(missing_sentence(spec))
        return HFTokenizer(cached, backend=chosen)
    raise ValueError(f"tokenizer file not found: {spec}")


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int, path: str | Path, progress: bool = False) -> Path:
    """Train a GPT-2-like byte-level BPE with `tokenizers` and save it as tokenizer.json.

    The vocabulary always holds all 256 byte symbols (`initial_alphabet`), seen in the text or
    not: a vocabulary lacking some drops those bytes when encoding, and is slower to serve.
    `progress`: the trainer's own bars (counting pairs, computing merges), drawn on a terminal only.
    """
    from tokenizers import Tokenizer as _RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = _RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=progress,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    missing = len(pre_tokenizers.ByteLevel.alphabet()) - sum(
        tok.token_to_id(c) is not None for c in pre_tokenizers.ByteLevel.alphabet()
    )
    if missing:  # never seen: BpeTrainer keeps its initial alphabet; a guard against a change of it
        raise RuntimeError(f"the trained vocabulary lacks {missing} of the 256 byte symbols")
    path = Path(path)
    if path.suffix != ".json":
        path = path / "tokenizer.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def token_dtype(vocab_size: int) -> str:
    """The narrowest unsigned dtype that holds every id: uint16 when it fits, else uint32."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"
