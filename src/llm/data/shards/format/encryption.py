"""Encrypted shards, LitData's way: an `Encryption` turns a whole shard's stored bytes into ciphertext and back.

Encryption is chunk-level: the writer encrypts each finished shard (after compression) and
the reader decrypts a whole shard when it first needs it, like a compressed one. Checksums
are over the bytes on disk (the ciphertext), so `verify` needs no key. The manifest records
that the shards are encrypted and by which class, with its public state (a salt, never a key
or password), so a reader without the key, or with another class or key, gets one sentence.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import numpy as np

from llm.data.shards.format.pread import ShardError

LEVELS = ("chunk",)


class EncryptionError(ValueError):
    """An encrypted dataset read without its key, or with another kind of key."""


class Encryption(ABC):
    """What `optimize(..., encryption=)` and `StreamingDataset(..., encryption=)` take: bytes in, bytes out.

    Subclasses implement `encrypt` and `decrypt` (whole shards); `state_dict()` is the public,
    non-secret state a reader needs besides its key (it is written into index.json), and
    `for_dataset(state)` returns the instance that reads a dataset written with that state.
    """

    level = "chunk"

    @abstractmethod
    def encrypt(self, data: bytes) -> bytes:
        """One shard's stored bytes -> what is written to disk."""

    @abstractmethod
    def decrypt(self, data: bytes) -> bytes:
        """What `encrypt` wrote -> the shard's stored bytes; raises when the key is wrong."""

    @property
    def algorithm(self) -> str:
        return type(self).__name__

    def state_dict(self) -> dict[str, Any]:
        """Public state recorded in the manifest (never a secret)."""
        return {}

    def for_dataset(self, state: dict[str, Any]) -> Encryption:
        """The instance that reads a dataset whose manifest recorded `state` (default: this one)."""
        return self


def class_name(encryption: Encryption) -> str:
    """The class as the manifest names it: ours by their public name (llm.data.X), others by module path."""
    cls = type(encryption)
    return f"llm.data.{cls.__qualname__}" if cls.__module__ == __name__ else f"{cls.__module__}.{cls.__qualname__}"


def record(encryption: Encryption | None) -> dict[str, Any] | None:
    """What the manifest says about a dataset's encryption: the class, algorithm and level, plus public state."""
    if encryption is None:
        return None
    if not isinstance(encryption, Encryption):
        raise TypeError(f"encryption must be an llm.data.Encryption (e.g. FernetEncryption(password)), "
                        f"got {type(encryption).__name__}")
    if encryption.level not in LEVELS:
        raise ValueError(f"encryption level {encryption.level!r} is not supported: llm.data encrypts whole shards "
                         "(level='chunk'), which also hides the item boundaries")
    return {"class": class_name(encryption), "algorithm": encryption.algorithm, "level": encryption.level,
            **encryption.state_dict()}


def for_reading(recorded: dict[str, Any] | None, encryption: Encryption | None, where: str) -> Encryption | None:
    """The encryption that reads a dataset (None when it is not encrypted), or one sentence saying why not."""
    if recorded is None:
        if encryption is not None:
            raise EncryptionError(f"{where} is not encrypted; drop encryption= to read it")
        return None
    if encryption is None:
        raise EncryptionError(f"{where} is encrypted ({recorded.get('class')}); pass encryption= with its key "
                              "to read it, e.g. StreamingDataset(..., encryption=FernetEncryption.load(path, password))")
    if not isinstance(encryption, Encryption):
        raise TypeError(f"encryption must be an llm.data.Encryption, got {type(encryption).__name__}")
    if class_name(encryption) != recorded.get("class"):
        raise EncryptionError(f"{where} was encrypted with {recorded.get('class')}, not {class_name(encryption)}; "
                              "pass an instance of that class")
    try:
        return encryption.for_dataset(recorded)
    except EncryptionError as e:  # e.g. a damaged salt: which dataset it is, too
        raise EncryptionError(f"{where}: {e}") from None


def key_opens(encryption: Encryption, stored: bytes, info: Any, kind: str) -> bool:
    """Whether `encryption` turns a shard's stored bytes (its manifest entry `info`) back into the shard.

    Fernet authenticates (a wrong key raises); a user's class may not, so the plaintext must also
    have the shard's size and the end of its layout: token shards end with their documents' ends
    (the last one the token count), item shards with their offsets table (0 up to the records'
    size). Random bytes from a wrong key pass that by chance only.
    """
    try:
        data = encryption.decrypt(stored)
        if info.compression is not None:
            import zstandard

            data = zstandard.ZstdDecompressor().decompress(data, max_output_size=info.raw_bytes)
    except Exception:  # the user's class may raise anything; Fernet raises InvalidToken, zstd ZstdError
        return False
    if len(data) != info.raw_bytes:
        return False
    count = info.documents if kind == "tokens" else info.items + 1
    if not count:
        return True
    if len(data) < 8 * count:
        return False
    ends = np.frombuffer(bytes(data[len(data) - 8 * count:]), "<u8")
    last = info.tokens if kind == "tokens" else len(data) - 8 * count
    first_ok = kind == "tokens" or ends[0] == 0
    return bool(first_ok and ends[-1] == last and np.all(ends[1:] >= ends[:-1]))


def unlock(encrypted: bool, encryption: Encryption | None, stored: bytes, where: str) -> bytes:
    """A shard's stored bytes as written before encryption (as they are when it is not encrypted)."""
    if not encrypted:
        return stored
    if encryption is None:
        raise EncryptionError(f"shard {where} is encrypted; pass encryption= with its key to read it")
    return decrypt_shard(encryption, stored, where)


def decrypt_shard(encryption: Encryption, stored: bytes, where: str) -> bytes:
    """A shard's ciphertext -> its stored bytes; a wrong key is one sentence naming the shard."""
    try:
        return encryption.decrypt(stored)
    except Exception as e:  # the user's class may raise anything; Fernet raises InvalidToken
        raise ShardError(f"shard {where} does not decrypt with the {encryption.algorithm} key given "
                         f"({type(e).__name__}): a wrong key or password, or a corrupt shard") from None


class FernetEncryption(Encryption):
    """Fernet (AES-128-CBC + HMAC-SHA256, from `cryptography`) with a key derived from a password.

    As in LitData: PBKDF2-HMAC-SHA256 over the password and a random 16-byte salt,
    480,000 iterations; `save(path)` writes the algorithm, level and salt (no secret), and
    `load(path, password)` rebuilds the key. The salt is in the manifest too, so
    `FernetEncryption(password)` alone also reads a dataset it did not write.
    """

    iterations = 480_000

    SALT_BYTES = 16

    def __init__(self, password: str, level: str = "chunk", salt: bytes | None = None):
        try:
            from cryptography.fernet import Fernet  # noqa: F401
        except ImportError:
            raise ModuleNotFoundError("FernetEncryption needs the cryptography package: "
                                      "pip install 'llm-stream-data[encryption]'") from None
        if not isinstance(password, str) or not password:
            raise ValueError("FernetEncryption needs a non-empty password string")
        if salt is not None and (not isinstance(salt, bytes) or len(salt) != self.SALT_BYTES):
            raise ValueError(f"FernetEncryption's salt must be {self.SALT_BYTES} bytes, got {_described(salt)}")
        self.password, self.level = password, level
        self.salt = salt if salt is not None else os.urandom(self.SALT_BYTES)
        self._key = self._derive(password, self.salt)

    @property
    def algorithm(self) -> str:
        return "fernet"

    @classmethod
    def _derive(cls, password: str, salt: bytes) -> bytes:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

        kdf = PBKDF2HMAC(algorithm=hashes.SHA256(), length=32, salt=salt, iterations=cls.iterations)
        return base64.urlsafe_b64encode(kdf.derive(password.encode()))

    def _fernet(self) -> Any:
        from cryptography.fernet import Fernet

        return Fernet(self._key)

    def encrypt(self, data: bytes) -> bytes:
        return self._fernet().encrypt(bytes(data))

    def decrypt(self, data: bytes) -> bytes:
        return self._fernet().decrypt(bytes(data))

    def state_dict(self) -> dict[str, Any]:
        return {"salt": base64.urlsafe_b64encode(self.salt).decode()}

    def for_dataset(self, state: dict[str, Any]) -> FernetEncryption:
        raw = decode_salt(state.get("salt"), "the manifest's key 'encryption.salt'")
        return self if raw == self.salt else FernetEncryption(self.password, self.level, raw)

    def save(self, file_path: str | Path) -> None:
        """The algorithm, level and salt as JSON (no password, no key)."""
        state = {"algorithm": self.algorithm, "level": self.level, **self.state_dict()}
        Path(file_path).write_text(json.dumps(state))

    @classmethod
    def load(cls, file_path: str | Path, password: str) -> FernetEncryption:
        """The encryption `save` described, with its key derived again from `password`."""
        try:
            state = json.loads(Path(file_path).read_text())
            salt = state["salt"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise EncryptionError(f"{file_path} is not a file FernetEncryption.save wrote ({type(e).__name__}: {e})") from None
        return cls(password, level=state.get("level", "chunk"), salt=decode_salt(salt, f"{file_path}: key 'salt'"))


def decode_salt(text: Any, field: str) -> bytes:
    """A Fernet salt as `state_dict` writes it (URL-safe base64 of 16 bytes); anything else is one sentence.

    Strict: the lenient decoder drops characters outside the alphabet, so a damaged salt would
    turn into another salt (or none: '!!' decodes to b''), and so into another key.
    """
    try:
        raw = base64.b64decode(text, altchars=b"-_", validate=True) if isinstance(text, str) else None
    except (binascii.Error, ValueError):
        raw = None
    if raw is None or len(raw) != FernetEncryption.SALT_BYTES:
        raise EncryptionError(f"{field} is {_described(text)}, not a salt: expected {FernetEncryption.SALT_BYTES} "
                              "bytes in URL-safe base64 as FernetEncryption wrote them; the file was damaged or edited")
    return raw


def _described(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
