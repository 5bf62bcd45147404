"""Compressed inputs (.gz, .zst) opened so that a stream cut short or damaged is an error, never silent.

A truncated gzip stream would end in a bare `EOFError`; a truncated zstd stream
would simply end early (python-zstandard does not say that a frame was cut). So
zstd files have their frame and block headers walked before any byte is served
(cheap: one 3-byte read per block), and every read error of either format
becomes one `InputError` naming the file, the byte and the line.
"""

from __future__ import annotations

import gzip
import io
import os
import zlib
from pathlib import Path
from typing import BinaryIO

from llm.data.inputs.errors import InputError, one_line

_ZSTD_MAGIC = 0xFD2FB528
_SKIPPABLE = range(0x184D2A50, 0x184D2A60)
_FIX = "the file is incomplete or damaged: re-create or re-download it"


def _broken(path: Path, kind: str, where: str, detail: str = "") -> InputError:
    detail = f" ({one_line(detail)})" if detail else ""
    return InputError(f"{path}: truncated or corrupt {kind} stream {where}{detail}; {_FIX}")


def check_zstd_frames(raw: BinaryIO, path: Path) -> None:
    """Walk every frame and block header of a .zst file: each frame must end inside the file."""
    size = raw.seek(0, io.SEEK_END)
    pos = 0

    def read(at: int, n: int, what: str) -> bytes:
        raw.seek(at)
        data = raw.read(n)
        if len(data) < n:
            raise _broken(path, "zstd", f"at byte {at} of {size}", f"{what} cut short")
        return data

    while pos < size:
        magic = int.from_bytes(read(pos, 4, "a frame header"), "little")
        if magic in _SKIPPABLE:
            pos += 8 + int.from_bytes(read(pos + 4, 4, "a skippable frame header"), "little")
            if pos > size:
                raise _broken(path, "zstd", f"at byte {size}", "a skippable frame cut short")
            continue
        if magic != _ZSTD_MAGIC:
            raise _broken(path, "zstd", f"at byte {pos} of {size}", "not a zstd frame")
        fhd = read(pos + 4, 1, "a frame header")[0]
        single, checksum, dict_flag = (fhd >> 5) & 1, (fhd >> 2) & 1, fhd & 3
        fcs = (single, 2, 4, 8)[fhd >> 6]
        pos += 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag] + fcs
        while True:
            header = int.from_bytes(read(pos, 3, "a block header"), "little")
            kind, block = (header >> 1) & 3, header >> 3
            if kind == 3:
                raise _broken(path, "zstd", f"at byte {pos} of {size}", "reserved block type")
            pos += 3 + (1 if kind == 1 else block)
            if pos > size:
                raise _broken(path, "zstd", f"at byte {size}", "the last frame ends before its last block")
            if header & 1:
                break
        pos += 4 * checksum
        if pos > size:
            raise _broken(path, "zstd", f"at byte {size}", "the frame checksum is cut short")
    raw.seek(0)


class _Guarded:
    """Mixin: read errors of the decompressor become one InputError naming file, byte and line."""

    _path: Path
    _raw: BinaryIO
    _kind: str
    _lines: int = 0
    _errors: tuple[type[BaseException], ...] = ()

    def _fail(self, e: BaseException) -> InputError:
        try:  # the open file's size: the path may name an object in storage, downloaded to a temporary file
            at = f"at byte {self._raw.tell()} of {os.fstat(self._raw.fileno()).st_size}"
        except (OSError, ValueError, AttributeError):
            at = "while reading"
        return _broken(self._path, self._kind, f"{at}, in line {self._lines + 1}", one_line(e))

    def readline(self, size: int | None = -1) -> bytes:
        try:
            line = super().readline(size)  # type: ignore[misc]
        except self._errors as e:
            raise self._fail(e) from None
        self._lines += line.endswith(b"\n")
        return line

    def read(self, size: int | None = -1) -> bytes:
        try:
            return super().read(size)  # type: ignore[misc]
        except self._errors as e:
            raise self._fail(e) from None


class _GzipReader(_Guarded, gzip.GzipFile):
    """gzip.GzipFile that owns its raw file and names it when the stream is cut or damaged."""

    _kind = "gzip"
    _errors = (EOFError, OSError, zlib.error)

    def __init__(self, raw: BinaryIO, path: Path):
        self._path, self._raw = path, raw
        super().__init__(fileobj=raw, mode="rb")

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


class _ZstdReader(_Guarded, io.BufferedReader):
    """A buffered zstd stream (all frames) whose decompression errors name the file."""

    _kind = "zstd"

    def __init__(self, raw: BinaryIO, path: Path):
        import zstandard

        self._path, self._raw = path, raw
        self._errors = (zstandard.ZstdError, OSError)
        reader = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True, read_across_frames=True)
        super().__init__(reader, buffer_size=1 << 20)  # type: ignore[arg-type]


def open_compressed(raw: BinaryIO, path: Path, compression: str) -> BinaryIO:
    """Wrap an open raw file in its checked decompressor ('gz' or 'zst')."""
    try:
        if compression == "gz":
            return _GzipReader(raw, path)  # type: ignore[return-value]
        check_zstd_frames(raw, path)
        return _ZstdReader(raw, path)  # type: ignore[return-value]
    except BaseException:
        raw.close()
        raise
