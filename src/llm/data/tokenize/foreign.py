"""`as_tokenizer`: a `Tokenizer` from whatever a user holds: ours, a spec, or a Hugging Face / `tokenizers` / tiktoken object.

Every public entry point that takes a tokenizer (the SFT collator and prompters, the text and
SFT streams, `optimize`, `optimize_text`) passes it through here. A foreign object becomes one
of our own tokenizers, built from its vocabulary written to a file (kept under the user cache
folder, named by its content), so that it encodes with our engines, pickles to workers as a
path, is re-opened by the ledger's audit, and has the identity (`fingerprint()`) that
`load_tokenizer` gives the same vocabulary file:

* a Hugging Face `PreTrainedTokenizerFast` (transformers 5: `TokenizersBackend`): its
  `backend_tokenizer`; EOS and padding are its `eos_token` / `pad_token`, its `chat_template`
  goes to a `tokenizer_config.json` beside the file. Loaded from a folder or a cached hub name
  whose tokenizer.json holds the same vocabulary, it is that very file;
* a `tokenizers.Tokenizer`: EOS is the first of `<|endoftext|>`, `</s>`, `<eos>`, ... it holds;
* a `tiktoken.Encoding`: EOS is its `eot_token`; GPT-2's split pattern with `<|endoftext|>` right
  after the ranks is a `.tiktoken` file (identical to `load_tokenizer` of that file), any other
  a `TiktokenEncodingTokenizer` folder. Text is encoded as ordinary text, as for `.tiktoken` files.

Per-call settings of the object (truncation, padding, a post-processor that adds no token) are
not the vocabulary: they are dropped, since we encode without special tokens and cut ourselves.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from llm.data.storage.local import atomic_write, cache_home
from llm.data.tokenize.bpe_vocab import GPT2_PATTERN
from llm.data.tokenize.engines import resolve
from llm.data.tokenize.hub import hub_tokenizer_file, looks_like_repo_id
from llm.data.tokenize.protocol import BaseTokenizer, Tokenizer
from llm.data.tokenize.tokenizers import (
    _EOS_CANDIDATES,
    ENCODING_FILE,
    HFTokenizer,
    TiktokenEncodingTokenizer,
    TiktokenTokenizer,
    load_tokenizer,
)

ACCEPTED = ("a tokenizer of llm.data.load_tokenizer or its spec, a Hugging Face PreTrainedTokenizerFast, "
            "a tokenizers.Tokenizer or a tiktoken.Encoding")


def as_tokenizer(obj: Any, backend: str | None = None, where: str = "tokenizer") -> Tokenizer:
    """`obj` as a `Tokenizer`: ours as it is, a spec string or path loaded, a foreign tokenizer object wrapped.

    `backend` picks the encoding engine for a spec or a foreign object (`load_tokenizer`);
    `where` names the argument in the error for anything else.
    """
    if isinstance(obj, BaseTokenizer) or isinstance(obj, Tokenizer):
        return obj
    if isinstance(obj, (str, os.PathLike)):
        return load_tokenizer(os.fspath(obj), backend)
    rust = getattr(obj, "backend_tokenizer", None) if _library(obj) == "transformers" else None
    if _library(rust) == "tokenizers":
        return _from_transformers(obj, rust, backend)
    if _library(obj) == "tokenizers" and hasattr(obj, "to_str"):
        return _from_tokenizers(obj, backend)
    if _library(obj) == "tiktoken" and hasattr(obj, "encode_ordinary"):
        return _from_tiktoken(obj, backend)
    if _library(obj) == "transformers":
        raise TypeError(f"{where} is a slow Hugging Face tokenizer ({type(obj).__name__}), which has no tokenizer.json; "
                        "load it with AutoTokenizer.from_pretrained(..., use_fast=True) or pass its tokenizer.json")
    raise TypeError(f"{where} must be {ACCEPTED}, got {type(obj).__name__}")


def _library(obj: Any) -> str:
    return type(obj).__module__.split(".")[0] if obj is not None else ""


# -- tokenizer.json vocabularies -------------------------------------------------------------------


def _from_transformers(obj: Any, rust: Any, backend: str | None) -> Tokenizer:
    name = getattr(obj, "name_or_path", "") or ""
    what = f"the Hugging Face tokenizer {name or type(obj).__name__}"
    eos = str(obj.eos_token) if getattr(obj, "eos_token_id", None) is not None else None  # str: an AddedToken too
    pad = str(obj.pad_token) if getattr(obj, "pad_token_id", None) is not None else None
    eos = eos or _found_eos(rust, what, "set its eos_token")
    template = getattr(obj, "chat_template", None)
    if isinstance(template, dict):  # transformers' named templates, as tokenizer_config.json lists them
        template = [{"name": k, "template": v} for k, v in template.items()]
    text = vocabulary_json(rust)
    source = _source_file(name)
    if source is not None and _same_vocabulary(source, text):
        if not template or _config_template(source) == template:
            return HFTokenizer(source, eos_token=eos, backend=resolve(backend), pad_token=pad)  # the very file
        text = source.read_bytes().decode()  # its bytes, so its identity, beside the template it lacks
    files = {"tokenizer.json": text}
    if template:  # where the chat prompters read it (sft/prompts.py)
        files["tokenizer_config.json"] = json.dumps({"chat_template": template, "eos_token": eos})
    return HFTokenizer(_kept(files), eos_token=eos, backend=resolve(backend), pad_token=pad)


def _from_tokenizers(tok: Any, backend: str | None) -> Tokenizer:
    eos = _found_eos(tok, "the tokenizers.Tokenizer", "add one with tok.add_special_tokens(['<|endoftext|>'])")
    return HFTokenizer(_kept({"tokenizer.json": vocabulary_json(tok)}), eos_token=eos, backend=resolve(backend))


def _found_eos(rust: Any, what: str, fix: str) -> str:
    """The end-of-text token our own loader would pick for this vocabulary, or one sentence asking for one."""
    for token in _EOS_CANDIDATES:
        if rust.token_to_id(token) is not None:
            return token
    raise ValueError(f"{what} has no end-of-text token (none of {', '.join(_EOS_CANDIDATES)}): {fix}")


def vocabulary_json(rust: Any) -> str:
    """The tokenizer.json text of a `tokenizers.Tokenizer` without its per-call settings.

    Serialized by `tokenizers` itself, as `Tokenizer.save` writes it: a tokenizer loaded from a
    file that `tokenizers` wrote gives back that file's bytes, so the same identity.
    """
    from tokenizers import Tokenizer as _RustTokenizer

    copy = _RustTokenizer.from_str(rust.to_str())
    copy.no_truncation()
    copy.no_padding()
    if _inert(json.loads(copy.to_str()).get("post_processor")):
        copy.post_processor = None  # what transformers 5 puts in place of none: it adds nothing
    return copy.to_str(pretty=True)


def _inert(processor: dict | None) -> bool:
    """A TemplateProcessing that only passes the sequences through (no special token)."""
    if not processor or processor.get("type") != "TemplateProcessing" or processor.get("special_tokens"):
        return False
    pieces = [*processor.get("single", []), *processor.get("pair", [])]
    return all(set(piece) == {"Sequence"} for piece in pieces)


def _source_file(name: str) -> Path | None:
    """The tokenizer.json a Hugging Face tokenizer was loaded from, when its `name_or_path` still finds it."""
    if not name:
        return None
    path = Path(name).expanduser()
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return path / "tokenizer.json"
    if path.is_file() and path.suffix == ".json":
        return path
    return hub_tokenizer_file(name) if looks_like_repo_id(name) else None


def _config_template(source: Path) -> Any:
    """The chat template of the tokenizer_config.json beside `source`, or None."""
    try:
        return json.loads((source.parent / "tokenizer_config.json").read_text(encoding="utf-8")).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return None


def _same_vocabulary(source: Path, text: str) -> bool:
    """Whether the file encodes as `text` does: equal but for the per-call settings and the post-processor."""
    from tokenizers import Tokenizer as _RustTokenizer

    def essence(serialized: str) -> dict:
        data = json.loads(serialized)
        for key in ("truncation", "padding", "post_processor"):  # ids without special tokens never depend on them
            data.pop(key, None)
        return data

    try:
        return essence(_RustTokenizer.from_file(str(source)).to_str()) == essence(text)
    except Exception:  # an unreadable file is not the same vocabulary
        return False


# -- the files kept --------------------------------------------------------------------------------


def _kept(files: dict[str, str], main: str = "tokenizer.json") -> Path:
    """`files` written once in a folder of their own, named by their content, under the user cache folder; `main`'s path."""
    key = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]
    for root in (cache_home() / "tokenizers" / "adapted", Path(tempfile.gettempdir()) / f"llm-adapted-{os.getuid()}"):
        path = root / key / main
        try:
            if not (path.is_file() and path.read_bytes().decode(errors="replace") == files[main]):
                path.parent.mkdir(parents=True, exist_ok=True)
                for name in sorted(files, key=lambda n: n == main):  # the main file last: its presence means done
                    atomic_write(path.parent / name, files[name].encode())
            return path
        except OSError:
            continue  # a read-only cache folder: the temporary folder instead
    raise OSError(f"cannot write the tokenizer's vocabulary under {cache_home()} nor {tempfile.gettempdir()}")


# -- tiktoken --------------------------------------------------------------------------------------


def _from_tiktoken(enc: Any, backend: str | None) -> Tokenizer:
    try:  # the state tiktoken itself pickles
        ranks, pattern, special = enc._mergeable_ranks, enc._pat_str, dict(enc._special_tokens)
    except AttributeError:
        raise TypeError(f"the tiktoken.Encoding {enc.name} does not expose its ranks in this tiktoken version; "
                        "pass its .tiktoken file instead") from None
    if "<|endoftext|>" not in special:
        raise ValueError(f"the tiktoken.Encoding {enc.name} has no <|endoftext|> special token (its eot_token); "
                         "add it to special_tokens")
    ranks_text = "".join(f"{_b64(token)} {rank}\n" for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]))
    if pattern == GPT2_PATTERN and special == {"<|endoftext|>": max(ranks.values()) + 1}:
        # exactly a .tiktoken file as load_tokenizer reads it (the format tiktoken writes and ships)
        return TiktokenTokenizer(_kept({"ranks.tiktoken": ranks_text}, "ranks.tiktoken"), backend=resolve(backend))
    meta = json.dumps({"name": enc.name, "pat_str": pattern, "special_tokens": special}, sort_keys=True, indent=1)
    path = _kept({"ranks.tiktoken": ranks_text, ENCODING_FILE: meta}, ENCODING_FILE)
    return TiktokenEncodingTokenizer(path, backend=resolve(backend))


def _b64(token: bytes) -> str:
    import base64

    return base64.b64encode(token).decode()
