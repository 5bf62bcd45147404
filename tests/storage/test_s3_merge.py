"""merge_datasets and encrypted shards on s3://: the same results as on a local folder, through the real S3 server."""

from __future__ import annotations

import numpy as np
import pytest

from llm.data import FernetEncryption, StreamingDataset, merge_datasets, optimize
from llm.data.shards.format.encryption import EncryptionError
from tests.storage.helpers import docs, stream_tokens, write


def test_merge_local_and_s3_datasets_into_s3(s3_env, tmp_path):
    a, b = str(tmp_path / "a"), s3_env.url()
    write(a, docs(60, seed=1))
    write(b, docs(50, seed=2))
    merged = s3_env.url()
    manifest = merge_datasets([a, b], merged)
    assert np.array_equal(stream_tokens(merged), np.concatenate([stream_tokens(a), stream_tokens(b)]))
    local = tmp_path / "from-s3"
    again = merge_datasets([b, merged], str(local))  # and out of s3:// into a folder
    assert np.array_equal(stream_tokens(str(local)), np.concatenate([stream_tokens(b), stream_tokens(merged)]))
    assert [s.checksum for s in again.shards[-len(manifest.shards):]] == [s.checksum for s in manifest.shards]


def test_encrypted_shards_on_s3(s3_env, tmp_path):
    fernet = FernetEncryption("s3 password")
    plain, secret = s3_env.url(), s3_env.url()
    write(plain, docs(40, seed=3))
    write(secret, docs(40, seed=3), encryption=fernet)
    assert np.array_equal(stream_tokens(secret, encryption=fernet), stream_tokens(plain))
    with pytest.raises(EncryptionError, match=rf"^{secret} is encrypted \(llm.data.FernetEncryption\); pass encryption="):
        stream_tokens(secret)


def _objects(url: str) -> dict[str, bytes]:
    """Every object under a prefix, by name (the lock, which a refused run may take and drop, left out)."""
    from llm.data.storage.lock import LOCK_NAME
    from llm.data.storage.objects import open_objects

    objects = open_objects(url, None)
    return {name: objects.get(name) for name in sorted(objects.list()) if name != LOCK_NAME}


def test_appends_the_dataset_cannot_hold_are_refused_on_s3(s3_env, tmp_path):
    """The one append check on a store: another password (optimize), another item layout (merge_datasets)."""
    fernet = FernetEncryption("s3 password")
    secret = s3_env.url()
    write(secret, docs(30, seed=4), encryption=fernet)
    before = _objects(secret)
    other = FernetEncryption("another password", salt=fernet.salt)
    with pytest.raises(EncryptionError, match=rf"^cannot append to {secret}: the fernet key given does not open its shards"):
        write(secret, docs(10, seed=5), encryption=other, mode="append")
    assert _objects(secret) == before
    assert stream_tokens(secret, encryption=fernet).size == sum(d.size for d in docs(30, seed=4))

    items = s3_env.url()
    optimize(lambda i: {"x": i}, list(range(6)), items, num_workers=0, progress=False)
    a, b = str(tmp_path / "a"), s3_env.url()
    for where in (a, b):
        optimize(lambda i: {"x": f"s{i}"}, list(range(4)), where, num_workers=0, progress=False)
    before = _objects(items)
    with pytest.raises(ValueError, match=rf"^cannot append to {items}: its item layout has field 'x' as int, "
                                         "the inputs' has str; "):
        merge_datasets([a, b], items, mode="append")
    assert _objects(items) == before
    ds = StreamingDataset(items)
    assert [ds[i]["x"] for i in range(len(ds))] == list(range(6))
