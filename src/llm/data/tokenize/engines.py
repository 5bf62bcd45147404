"""The engines that turn text into ids for one vocabulary, and `auto`: the fastest token-identical one.

A vocabulary (a tokenizer.json or a .tiktoken file) has a reference engine: `tokenizers` for a
tokenizer.json, `tiktoken` for a .tiktoken file. Another engine serves it only when

1. it is installed,
2. the vocabulary's structure is one it is verified to reproduce (`bpe_vocab.py`), and
3. a self-check at load encodes probe texts (scripts, whitespace runs, contractions, digits,
   emoji, every added token's text, characters regex engines classify differently) exactly as
   the reference does.

`auto` takes the first engine in `PREFERENCE` that passes; measured with `bench/encoders.py`
(docs/optimized-shards.md). Which engine encoded a dataset never changes its ids, its
fingerprint, or the tokenizer's `fingerprint()`: those depend on the vocabulary alone.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import xxhash

from llm.data.storage.local import atomic_write, cache_home
from llm.data.tokenize.bpe_vocab import (
    GPT2_PATTERN,
    Unsupported,
    byte_level_bpe,
    complete_byte_alphabet,
    tiktoken_ranks,
    tokenizer_json_from_ranks,
)
from llm.data.tokenize.encoders import (  # noqa: F401  (re-exported: the engines by name)
    FastokensEncoder,
    GigatokenEncoder,
    MissingBytesEncoder,
    TiktokenEncoder,
    TokenizersEncoder,
)

log = logging.getLogger("llm.data.tokenize.tokenizers")

BACKENDS = ("tokenizers", "tiktoken", "fastokens", "gigatoken")
# Fastest first, for byte-level BPE vocabularies, as measured by `python -m bench.encoders`
# (docs/benchmarks.md, "Encoders").
PREFERENCE = ("fastokens", "gigatoken", "tiktoken", "tokenizers")
ENV_VAR = "LLM_TOKENIZER_BACKEND"

# Texts every candidate must encode exactly like the reference before it is used.
PROBE_TEXTS = (
    "Hello, world! It's 2024: don't panic. I'm sure we'll, they've, you're, she'd; HE'S WE'LL.",
    "naïve café Straße, 東京タワーの夜景, Привет мир, مرحبا بالعالم, नमस्ते दुनिया, 한국어 텍스트, ไทย",
    "emoji 🙂👩‍👩‍👧🇫🇷 combining e\u0301 zero\u200bwidth \ufeffbom \ufffd replacement",
    "  two leading spaces\tand\ttabs\r\n\r\nCRLF lines\u00a0nbsp\u2003em\u3000ideographic   trailing   ",
    "def f(x):\n    return x ** 2  # comment\n\n\n\n        deeply indented\n",
    "1234567890 3.14159 1e-9 ½ Ⅻ ١٢٣ x² 0x1F",
    "<|endoftext|>after<|endoftext|> <|endoftext|>\n<|endoftext <s></s>[SEP] endoftext|>",
    "",
    " ",
    "\n",
    "!!!??? ... — «quotes» ``ticks'' {braces} $$ ## @@",
    # Where regex engines' Unicode tables disagree: spaces that are (or were) \\s, format characters,
    # control characters, letters of recent Unicode versions; each between a letter and a contraction.
    *(
        f"x{c}'ll {c}1 {c}a {c}{c} {c}'s"
        for c in "\u180e\u200b\ufeff\u1680\u2000\u200a\u2028\u2029\u202f\u205f\u3000\x85\xa0\x1c\x1f\x0b\x0c\r"
        "\U0001e4d0\U00011f00\U00010d40\U0001e5d0\U00016100\U0002ebf0\U000e0001\U000f0000"
    ),
)


def resolve(backend: str | None) -> str:
    """The engine asked for: the argument, else $LLM_TOKENIZER_BACKEND, else 'auto'."""
    name = backend or os.environ.get(ENV_VAR) or "auto"
    if name not in ("auto", *BACKENDS):
        source = f"${ENV_VAR}" if not backend else "backend"
        raise ValueError(f"unknown tokenizer backend {name!r} ({source}): expected auto, {', '.join(BACKENDS)}")
    return name


def installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _require(name: str) -> None:
    if not installed(name):
        raise ImportError(f"{name} is not installed (pip install 'llm-stream-data[{name}]')")


def tiktoken_encoding(name: str, ranks: dict[bytes, int], special: dict[str, int], pattern: str = GPT2_PATTERN) -> Any:
    _require("tiktoken")
    import tiktoken

    return tiktoken.Encoding(name=name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=special)


def json_makers(path: Path, reference: TokenizersEncoder) -> dict[str, Callable[[], Any]]:
    """How each engine loads a tokenizer.json (raising ImportError or `Unsupported` when it cannot).

    A vocabulary lacking some byte symbols is given to the fast engines completed with them
    (`complete_byte_alphabet`), behind a `MissingBytesEncoder`.
    """
    vocabulary = functools.cache(lambda: complete_byte_alphabet(path))  # parsed once, by the first engine tried

    def served(make: Callable[[str], Any]) -> Any:
        text, first_added = vocabulary()
        engine = make(text)
        if first_added is None:
            return engine
        log.info("tokenizer %s lacks some of the 256 byte symbols: %s encodes it, and %s every document "
                 "holding one of those bytes", path, engine.name, reference.name)
        return MissingBytesEncoder(engine, reference, first_added)

    def fastokens():
        _require("fastokens")
        import fastokens as fk

        return served(lambda text: FastokensEncoder(fk.Tokenizer.from_json_str(text)))

    def gigatoken():
        _require("gigatoken")
        import gigatoken as gt

        # From the file's text: gigatoken.Tokenizer(path) would also try a Hub download for
        # names shaped like a repository id.
        return served(lambda text: GigatokenEncoder(lambda: gt.Tokenizer.from_json(text)))

    def tiktoken():
        _require("tiktoken")

        def make(text: str) -> TiktokenEncoder:
            ranks, special = tiktoken_ranks(byte_level_bpe(json.loads(text)))
            return TiktokenEncoder(tiktoken_encoding(path.stem, ranks, special), match_special=True)

        return served(make)

    return {"fastokens": fastokens, "gigatoken": gigatoken, "tiktoken": tiktoken, "tokenizers": lambda: reference}


def tiktoken_file_makers(
    path: Path, ranks: dict[bytes, int], reference: TiktokenEncoder, digest: str | None = None
) -> dict[str, Callable[[], Any]]:
    """How each engine loads a .tiktoken ranks file (GPT-2's pattern, `<|endoftext|>` never matched).

    fastokens gets the ranks as the equivalent byte-level tokenizer.json, not through its own
    `.tiktoken` loader: that one splits with a generic regex engine whose `\\s` differs from
    tiktoken's (U+180E), while its ByteLevel path matches `tokenizers` and `tiktoken`.
    The conversion (slow, and paid by every worker process) is kept by the ranks file's
    `digest` (sha256) under the user cache folder (`converted_vocabulary`).
    """

    def fastokens():
        _require("fastokens")
        import fastokens as fk

        return FastokensEncoder(fk.Tokenizer.from_json_str(converted_vocabulary(ranks, digest)))

    def gigatoken():
        _require("gigatoken")
        import gigatoken as gt

        # GPT-2's pre-tokenizer; no special tokens: a .tiktoken file's text is ordinary text.
        return GigatokenEncoder(lambda: gt.Tokenizer.from_tiktoken(str(path), pretokenizer="gpt2", special_tokens=None))

    return {"fastokens": fastokens, "gigatoken": gigatoken, "tiktoken": lambda: reference}


_CONVERSION_VERSION = 1


def converted_vocabulary(ranks: dict[bytes, int], digest: str | None) -> str:
    """The ranks as a byte-level tokenizer.json text, from the cache when this ranks file was converted before.

    The cached file is named by the ranks file's sha256 and written atomically, then its xxh3-128
    beside it (`.xxh3`): a file whose hash does not match (damaged, cut short, or left without its
    hash by a crash) is converted again: checking the hash is much cheaper than parsing the JSON
    at every process's start. (The engine built from it is still self-checked against tiktoken.)
    """
    # The name carries the conversion's version: a later change to it never reads an old file.
    cached = cache_home() / "tokenizers" / f"{digest}-ranks-v{_CONVERSION_VERSION}.json" if digest else None
    if cached is not None and (text := _read_checked(cached)) is not None:
        return text
    text = json.dumps(tokenizer_json_from_ranks(ranks))  # `Unsupported` unless every token is a merge of two
    if cached is not None:
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            data = text.encode()
            atomic_write(cached, data)
            atomic_write(_hash_path(cached), xxhash.xxh3_128_hexdigest(data).encode())
        except OSError:
            pass  # a read-only cache only costs the conversion next time
    return text


def _hash_path(cached: Path) -> Path:
    return cached.with_name(cached.name + ".xxh3")


def _read_checked(cached: Path) -> str | None:
    """The cached conversion when its recorded hash matches its bytes; None when absent or damaged."""
    try:
        data, want = cached.read_bytes(), _hash_path(cached).read_text().strip()
    except OSError:
        return None
    return data.decode() if xxhash.xxh3_128_hexdigest(data) == want else None


def _self_check(candidate: Any, reference: Any, probes: Sequence[str]) -> None:
    got = candidate.encode_batch(probes)
    want = reference.encode_batch(probes)
    for text, a, b in zip(probes, got, want):
        if list(a) != list(b):
            raise Unsupported(f"self-check: {text[:40]!r} encodes as {list(a)[:8]}..., the reference as {list(b)[:8]}...")
    if [list(x) for x in got] != [list(x) for x in want]:
        raise Unsupported("self-check: a different number of results")


def probes_for(added: Iterable[str]) -> list[str]:
    """The fixed probe texts plus each added token's text, alone and inside words."""
    texts = list(PROBE_TEXTS)
    for tok in added:
        texts += [tok, f"a{tok}b {tok} {tok}{tok}", f"{tok[:-1]} x{tok[1:]}"]
    return texts


def _load(maker: Callable[[], Any], reference: Any, probes: Sequence[str]) -> Any:
    """Build one engine and self-check it; any failure of a non-reference engine is `Unsupported`."""
    try:
        encoder = maker()
    except (ImportError, Unsupported):
        raise
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # e.g. fastokens refusing ranks with gaps; a Rust engine's panic (not an Exception)
        raise Unsupported(f"it failed to load it ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    if encoder is not reference:
        _self_check(encoder, reference, probes)
    return encoder


def pick(requested: str, makers: dict[str, Callable[[], Any]], reference: Any, probes: Sequence[str], what: str) -> Any:
    """The engine for one vocabulary: the one requested (or an error), or under 'auto' the first that passes."""
    if requested != "auto":
        if requested not in makers:
            raise ValueError(f"tokenizer backend {requested!r} cannot load {what}; use {' or '.join(makers)}")
        try:
            return _load(makers[requested], reference, probes)
        except (ImportError, Unsupported) as e:
            raise ValueError(f"tokenizer backend {requested!r} cannot serve {what}: {e}") from None
    for name in PREFERENCE:
        if name not in makers:
            continue
        try:
            return _load(makers[name], reference, probes)
        except ImportError as e:
            log.debug("tokenizer backend %s skipped for %s: %s", name, what, e)
        except Unsupported as e:
            level = logging.WARNING if str(e).startswith("self-check") else logging.DEBUG
            log.log(level, "tokenizer backend %s not used for %s: %s", name, what, e)
    return reference
