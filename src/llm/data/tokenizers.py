"""Tokenizers behind one small interface: `simple` bytes, Hugging Face `tokenizers`, `tiktoken` files."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable


@runtime_checkable
class Tokenizer(Protocol):
    """What every stage needs from a tokenizer; nothing more."""

    spec: str
    eos_id: int
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def fingerprint(self) -> dict: ...


class SimpleTokenizer:
    """Dependency-free byte-level tokenizer: ids 0..255 are UTF-8 bytes, 256 is EOS."""

    spec = "simple"
    eos_id = 256
    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(t.encode("utf-8")) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def fingerprint(self) -> dict:
        return {"type": "simple", "vocab_size": self.vocab_size, "eos_id": self.eos_id}


# Common end-of-text spellings, most specific first; the first one in the vocabulary wins.
_EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|eos|>", "[SEP]", "<|end_of_text|>")


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


class HFTokenizer:
    """A Hugging Face `tokenizers` tokenizer loaded from a local tokenizer.json."""

    def __init__(self, path: Path, eos_token: str | None = None):
        from tokenizers import Tokenizer as _RustTokenizer

        self.path = path
        self.spec = str(path)
        self._tok = _RustTokenizer.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_id = self._find_eos(eos_token)
        self._digest = _file_digest(path)
        # encode_batch_fast skips offset tracking (tokenizers >= 0.20): same ids, less work.
        self._batch = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)

    def _find_eos(self, eos_token: str | None) -> int:
        for token in (eos_token,) if eos_token else _EOS_CANDIDATES:
            token_id = self._tok.token_to_id(token)
            if token_id is not None:
                return token_id
        wanted = eos_token or " or ".join(_EOS_CANDIDATES)
        raise ValueError(f"tokenizer {self.path} has no end-of-text token {wanted}; add one when training it")

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def fingerprint(self) -> dict:
        return {"type": "hf", "sha256": self._digest, "vocab_size": self.vocab_size, "eos_id": self.eos_id}


# GPT-2's pre-tokenisation pattern; .tiktoken files carry ranks only, not the pattern.
_GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class TiktokenTokenizer:
    """A `tiktoken` BPE from a local `.tiktoken` ranks file (e.g. GPT-2's), `<|endoftext|>` appended as EOS."""

    def __init__(self, path: Path):
        import tiktoken

        self.path = path
        self.spec = str(path)
        ranks = {}
        for line_no, line in enumerate(path.read_bytes().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
            except ValueError:
                raise ValueError(f"{path}:{line_no} is not a `<base64 token> <rank>` line of a .tiktoken file") from None
        self.eos_id = max(ranks.values()) + 1
        self.vocab_size = self.eos_id + 1
        self._enc = tiktoken.Encoding(
            name=path.stem,
            pat_str=_GPT2_PATTERN,
            mergeable_ranks=ranks,
            special_tokens={"<|endoftext|>": self.eos_id},
        )
        self._digest = _file_digest(path)

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._enc.encode_ordinary_batch(list(texts), num_threads=tokenizer_threads())

    def decode(self, ids: Iterable[int]) -> str:
        return self._enc.decode(list(ids))

    def fingerprint(self) -> dict:
        return {"type": "tiktoken", "sha256": self._digest, "vocab_size": self.vocab_size, "eos_id": self.eos_id}


def tokenizer_threads() -> int:
    """Threads one batch encode may use: 1 inside our worker processes, which are the parallelism.

    `LLM_TOKENIZER_THREADS` is set to 1 by `optimize` workers; elsewhere every core may be used.
    """
    return int(os.environ.get("LLM_TOKENIZER_THREADS") or os.cpu_count() or 1)


def load_tokenizer(spec: str) -> Tokenizer:
    """Load `simple`, a tokenizer.json (or a folder holding one) or a `.tiktoken` file."""
    if spec == "simple":
        return SimpleTokenizer()
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return HFTokenizer(path / "tokenizer.json")
    if path.is_file() and path.suffix == ".json":
        return HFTokenizer(path)
    if path.is_file() and path.suffix == ".tiktoken":
        return TiktokenTokenizer(path)
    if path.is_dir():
        raise ValueError(f"tokenizer folder {spec} holds no tokenizer.json; pass the tokenizer.json or .tiktoken file itself")
    if path.is_file():
        raise ValueError(f"tokenizer file {spec} is neither a tokenizer.json (.json) nor a .tiktoken file")
    if os.sep in spec or "/" in spec or path.suffix in (".json", ".tiktoken") or spec.startswith("~"):
        raise ValueError(f"tokenizer file not found: {spec}")
    raise ValueError(
        f"unknown tokenizer spec {spec!r}: expected 'simple', a tokenizer.json file, "
        "a folder holding tokenizer.json, or a .tiktoken file"
    )


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int, path: str | Path) -> Path:
    """Train a GPT-2-like byte-level BPE with `tokenizers` and save it as tokenizer.json."""
    from tokenizers import Tokenizer as _RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = _RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    path = Path(path)
    if path.suffix != ".json":
        path = path / "tokenizer.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def token_dtype(vocab_size: int) -> str:
    """The narrowest unsigned dtype that holds every id: uint16 when it fits, else uint32."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"
