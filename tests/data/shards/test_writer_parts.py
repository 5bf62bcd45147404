"""Token shards written unjoined (ids and doc ends part by part) and from uncopied unsigned ids: same bytes, same checksum."""

from __future__ import annotations

import numpy as np
import pytest

from llm.data.shards.format.checksum import checksum_file
from llm.data.shards.format.writer import TokenShardWriter, as_token_array

DOCS = [[1, 2, 3], [65535, 0], [7] * 50, [9]]


def _write(folder, docs, dtype_in, compression=None, chunk_tokens=None):
    writer = TokenShardWriter(folder, f"s-{np.dtype(dtype_in).name}", "uint16", chunk_tokens=chunk_tokens,
                              compression=compression)
    for doc in docs:
        writer.add(as_token_array(np.asarray(doc, dtype=dtype_in), "test"))
    writer.flush()
    return writer.shards


@pytest.mark.parametrize("compression", [None, "zstd"])
@pytest.mark.parametrize("chunk_tokens", [None, 8])
def test_unsigned_and_int64_ids_give_the_same_shards_with_their_checksums(tmp_path, compression, chunk_tokens) -> None:
    if compression:
        pytest.importorskip("zstandard")
    by_dtype = {d: _write(tmp_path, DOCS, d, compression, chunk_tokens) for d in ("int64", "uint16", "uint32")}
    reference = [(tmp_path / s.file).read_bytes() for s in by_dtype["int64"]]
    for shards in by_dtype.values():
        assert [(tmp_path / s.file).read_bytes() for s in shards] == reference
        for s in shards:
            assert checksum_file(tmp_path / s.file) == s.checksum
            assert s.dtype == "uint16"
    if compression is None and chunk_tokens is None:  # the layout: uint16 ids, then uint64 document ends
        ids = np.concatenate([np.asarray(d) for d in DOCS])
        ends = np.cumsum([len(d) for d in DOCS])
        assert reference[0] == ids.astype("<u2").tobytes() + ends.astype("<u8").tobytes()


def test_unsigned_ids_are_not_copied_and_a_wide_id_still_widens_the_shard(tmp_path) -> None:
    ids = np.array([5, 6], dtype=np.uint16)
    assert as_token_array(ids, "test") is ids
    wide = np.array([70000, 1], dtype=np.uint32)
    assert as_token_array(wide, "test") is wide
    writer = TokenShardWriter(tmp_path, "w", "uint16")
    writer.add(as_token_array(ids, "test"))
    writer.add(as_token_array(wide, "test"))  # > 65535: the buffered shard is written, later ones are uint32
    writer.flush()
    assert [s.dtype for s in writer.shards] == ["uint16", "uint32"]
    data = (tmp_path / writer.shards[1].file).read_bytes()
    assert np.frombuffer(data[:8], dtype="<u4").tolist() == [70000, 1]
    with pytest.raises(ValueError, match="does not fit"):
        as_token_array(np.array([-1], dtype=np.int32), "doc 3")
