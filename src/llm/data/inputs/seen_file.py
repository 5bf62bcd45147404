"""The seen-hashes file of deduplication: three layouts read, each detected for sure, never guessed.

* the guide's framework (written for new files): text, one full-length lowercase hex
  digest per line (blank lines and trailing spaces ignored). A line is whole once its
  newline is written: a last line without one, or of another length than the
  algorithm's digest, is a torn append, ignored and cut off by the next writer.
* ours (v2, read and appended to): a 32-byte header (magic, version, digest size,
  hash algorithm) then blocks, one per commit: `uint32 count | uint64 xxh3 of the
  digests | count x 16-byte digests`. A wrong algorithm, flipped bytes or another
  file's content are one clear error; a block cut short at the end is a torn append.
* ours before the header (v1): bare 16-byte digests back to back.

In memory a digest is its first 16 bytes (`DIGEST_BYTES`), whatever the layout.
A file that is only read (`write_seen_hashes: false`) is never modified.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import xxhash

DIGEST_BYTES = 16
NEW_LAYOUT = "hex"  # the guide's: its users swap our code in without converting their files
MAGIC = b"LLMSEEN\x00"
VERSION = 2
_HEADER = struct.Struct("<8sHH20s")  # magic, version, digest bytes, algorithm (ASCII, NUL-padded)
_BLOCK = struct.Struct("<IQ")  # digest count, xxh3_64 of the digests
_HEX_LINE = re.compile(rb"^[0-9a-fA-F]{32,128}$")


class SeenFileError(ValueError):
    """A seen-hashes file that cannot be what the state or the settings say it is."""


@dataclass
class SeenFile:
    """What a seen-hashes file holds: its layout, digests (16 bytes each, concatenated) and where each commit ends."""

    path: Path
    layout: str  # "v2", "hex" or "raw"
    digests: bytes
    ends: list[tuple[int, int]]  # (digest count, byte offset) after each complete commit/line/digest
    algo: str | None = None

    @property
    def count(self) -> int:
        return len(self.digests) // DIGEST_BYTES


def read_seen_file(path: str | Path, algo: str, width: int | None = None) -> SeenFile | None:
    """The file at `path` parsed (None when it does not exist); a layout or algorithm mismatch is an error.

    `width`: the algorithm's full digest size in bytes; a hex line of another length
    (nor the 16 bytes older appends wrote) is an error, or torn when it is the last.
    """
    path = Path(path)
    if not path.exists():
        return None
    if path.is_dir():
        raise SeenFileError(f"seen-hashes file {path} is a folder; seen_hashes_path must name a file")
    data = path.read_bytes()
    if data.startswith(MAGIC):
        return _parse_v2(path, data, algo)
    if _looks_hex(data):
        return _parse_hex(path, data, {2 * DIGEST_BYTES, 2 * width} if width else None)
    if len(data) - len(data) % DIGEST_BYTES and _is_text(data):
        raise SeenFileError(
            f"seen-hashes file {path} is text but not one hex digest per line; point seen_hashes_path at a "
            "seen-hashes file (or a new path)"
        )
    whole = len(data) - len(data) % DIGEST_BYTES  # a torn last digest (crash mid-append) is dropped
    ends = [(i, i * DIGEST_BYTES) for i in range(1, whole // DIGEST_BYTES + 1)]
    return SeenFile(path, "raw", data[:whole], ends)


def _parse_v2(path: Path, data: bytes, algo: str) -> SeenFile:
    if len(data) < _HEADER.size:
        raise SeenFileError(f"seen-hashes file {path} has a truncated header ({len(data)} bytes)")
    _, version, size, raw_algo = _HEADER.unpack_from(data)
    file_algo = raw_algo.rstrip(b"\0").decode("ascii", "replace")
    if version != VERSION or size != DIGEST_BYTES:
        raise SeenFileError(f"seen-hashes file {path} has version {version} / digest size {size}; expected {VERSION} / {DIGEST_BYTES}")
    if file_algo != algo:
        raise SeenFileError(
            f"seen-hashes file {path} was written with hash_algo {file_algo!r}, not {algo!r}; use "
            f"hash_algo: {file_algo} or another seen_hashes_path"
        )
    pos, digests, ends, count = _HEADER.size, [], [], 0
    while pos < len(data):
        if pos + _BLOCK.size > len(data):
            break  # torn append: the block header itself is cut
        n, checksum = _BLOCK.unpack_from(data, pos)
        body = data[pos + _BLOCK.size : pos + _BLOCK.size + n * DIGEST_BYTES]
        if len(body) < n * DIGEST_BYTES:
            break  # torn append: fewer digests than the block announces
        if xxhash.xxh3_64_intdigest(body) != checksum:
            raise SeenFileError(
                f"seen-hashes file {path} is corrupt: the block at byte {pos} fails its checksum; "
                "restore it from a backup or start a new seen_hashes_path"
            )
        digests.append(body)
        count += n
        pos += _BLOCK.size + len(body)
        ends.append((count, pos))
    return SeenFile(path, "v2", b"".join(digests), ends, file_algo)


def _is_text(data: bytes) -> bool:
    sample = data[:4096]
    return all(32 <= b < 127 or b in b"\r\n\t" for b in sample)


def _looks_hex(data: bytes) -> bool:
    if b"\n" not in data:  # no line is whole yet: hex when it can be the start of a first line
        return re.fullmatch(rb"[0-9a-fA-F]+ *", data) is not None
    # the text after the last newline may be torn: judge by the whole lines
    body = [line.rstrip() for line in data[: data.rindex(b"\n")].split(b"\n") if line.strip()]
    return bool(body) and all(_HEX_LINE.match(line) and len(line) % 2 == 0 for line in body)


def _parse_hex(path: Path, data: bytes, lengths: set[int] | None) -> SeenFile:
    digests, ends, pos, count = [], [], 0, 0
    for number, raw in enumerate(data.split(b"\n"), 1):
        line_end = pos + len(raw) + 1
        line = raw.rstrip()
        if line_end > len(data):
            break  # a last line without its newline is torn (a crash mid-append), never a digest
        if line:
            valid = bool(_HEX_LINE.match(line)) and len(line) % 2 == 0 and (lengths is None or len(line) in lengths)
            if not valid and line_end == len(data):
                break  # the last line, whole but of the wrong length: torn as well
            if not valid:
                expected = " or ".join(str(n) for n in sorted(lengths or ())) or "32 to 128"
                raise SeenFileError(
                    f"seen-hashes file {path}: line {number} is not a hex digest of {expected} characters; "
                    "remove that line or point seen_hashes_path at another file"
                )
            digests.append(bytes.fromhex(line.decode("ascii"))[:DIGEST_BYTES].ljust(DIGEST_BYTES, b"\0"))
            count += 1
        ends.append((count, min(line_end, len(data))))
        pos = line_end
    return SeenFile(path, "hex", b"".join(digests), ends)


def cut_to(seen: SeenFile, count: int) -> int:
    """The byte length of the file holding exactly the first `count` digests (a commit boundary)."""
    if count == 0:
        return _HEADER.size if seen.layout == "v2" else 0
    for n, offset in seen.ends:
        if n == count:
            return offset
    raise SeenFileError(
        f"seen-hashes file {seen.path} has no commit that ends at digest {count}; it was written by another "
        "run than the state being loaded"
    )


def truncate_to(seen: SeenFile, count: int) -> None:
    """Forget digests committed after `count` (written by a run that then crashed)."""
    size = cut_to(seen, count)
    if seen.path.stat().st_size != size:
        with open(seen.path, "r+b") as f:
            f.truncate(size)


def encode(layout: str, digests: bytes, width: int) -> bytes:
    """One commit of full-width digests as `layout` writes it (binary layouts keep the first 16 bytes)."""
    rows = [digests[i : i + width] for i in range(0, len(digests), width)]
    if layout == "hex":
        return "".join(row.hex() + "\n" for row in rows).encode("ascii")
    short = b"".join(row[:DIGEST_BYTES] for row in rows)
    if layout == "v2":
        return _BLOCK.pack(len(rows), xxhash.xxh3_64_intdigest(short)) + short
    return short


def append_digests(
    path: str | Path, digests: bytes, algo: str, width: int = DIGEST_BYTES, base: int | None = None
) -> tuple[int, int]:
    """Append one commit of `width`-byte digests durably, in the file's own layout; (digest count, bytes) after it.

    A new file gets the guide's layout. `base`: the commit continues a file of exactly
    `base` digests (a checkpoint's): a file already holding all of them is left as it
    is, one holding part of them (a torn publication) is cut back to `base` first.
    Writers of one file take turns (an exclusive `flock` for the whole append), so a
    writer cutting off a crashed run's torn tail never cuts another live writer's commit.
    """
    import fcntl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = len(digests) // width
    with open(path, "ab") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        seen = read_seen_file(path, algo, width) if os.fstat(f.fileno()).st_size else None
        held = seen.count if seen else 0
        if base is None:
            base = held
        if held >= base + n:  # published already (a retry after the file was written)
            return held, path.stat().st_size
        if held < base:
            raise SeenFileError(
                f"seen-hashes file {path} holds {held} digests but the checkpoint being published continues "
                f"one of {base}; it was changed by another run: point seen_hashes_path at that run's file"
            )
        if seen is not None:  # a torn append of a crashed run is cut off before adding to the file
            truncate_to(seen, base)
        f.write(encode(seen.layout if seen else NEW_LAYOUT, digests, width))
        f.flush()
        os.fsync(f.fileno())
        return base + n, os.fstat(f.fileno()).st_size
