"""storage/local.py `write_file`: a list of parts goes out in few `writev` calls, and short writes go on where they
stopped, so the file holds every byte in order."""

from __future__ import annotations

import os

import pytest

from llm.data.storage import local


@pytest.mark.parametrize("step", [1, 7, 4096])
def test_parts_written_with_short_writes_arrive_whole_and_in_order(tmp_path, monkeypatch, step) -> None:
    parts = [b"head", b"", memoryview(bytes(range(256)) * 40), bytearray(b"x" * 5), b"tail"]
    real, calls = os.writev, []

    def short_writev(fd: int, views) -> int:  # a kernel may take fewer bytes than asked: here at most `step`
        calls.append(len(views))
        return real(fd, [memoryview(b"".join(bytes(v) for v in views))[:step]])

    monkeypatch.setattr(local.os, "writev", short_writev)
    path = tmp_path / "f"
    assert local.write_file(path, parts) == path.stat().st_size == sum(len(p) for p in parts)
    assert path.read_bytes() == b"".join(bytes(p) for p in parts)
    assert all(n <= 4 for n in calls)  # the empty part is never handed to the kernel
    if step == 4096:
        assert len(calls) == 3  # 10,253 bytes in 4 KiB writes


def test_a_generator_of_parts_is_written_as_it_comes(tmp_path) -> None:
    path = tmp_path / "g"
    assert local.write_file(path, (bytes([i]) * i for i in range(5))) == 10
    assert path.read_bytes() == b"\x01\x02\x02\x03\x03\x03\x04\x04\x04\x04"
