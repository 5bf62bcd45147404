"""Bucket names with the word "bucket" in them (the README's own s3://bucket/ds): a missing bucket and a
missing object are told apart by the error's type, never by the words of its message."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from llm.data.shards.format.loaders import TokensLoader
from llm.data.shards.format.manifest import ManifestError
from llm.data.shards.read.dataset import StreamingDataset
from llm.data.storage.objects import open_objects
from llm.data.storage.s3 import BucketNotFound
from tests.storage.helpers import docs, stream_tokens, write


@pytest.mark.parametrize("bucket", ["bucket", "my-bucket"])
def test_optimize_to_a_new_prefix_of_a_bucket_named_bucket_works(s3_server, tmp_path, bucket):
    options = s3_server.options()
    open_objects(f"s3://{bucket}/seed", options).put("x", b"1")  # the bucket exists, the prefix does not
    url = f"s3://{bucket}/ds-{uuid.uuid4().hex[:8]}"
    documents = docs(20)
    write(url, documents, storage_options=options)
    tokens = stream_tokens(url, storage_options=options, cache_dir=tmp_path)
    assert np.array_equal(tokens, np.concatenate(documents))
    with pytest.raises(ManifestError, match=f"no index.json .*{url}-missing/index.json does not exist"):
        StreamingDataset(url + "-missing", storage_options=options, cache_dir=tmp_path)


def test_a_missing_bucket_named_bucket_is_one_sentence_saying_so(store_server, tmp_path):
    missing = f"missing-bucket-{uuid.uuid4().hex[:8]}"
    with pytest.raises(BucketNotFound, match=f"{store_server.bucket_word} '{missing}' does not exist") as e:
        StreamingDataset(f"{store_server.scheme}://{missing}/ds", item_loader=TokensLoader(block_size=8),
                         storage_options=store_server.options(), cache_dir=tmp_path)
    assert "\n" not in str(e.value) and store_server.endpoint in str(e.value)
    if store_server.scheme == "s3":
        return  # SeaweedFS creates a bucket on its first write (AWS S3 would refuse, as Azurite and GCS do)
    with pytest.raises(BucketNotFound, match=f"{store_server.bucket_word} '{missing}' does not exist"):
        write(f"{store_server.scheme}://{missing}/ds", docs(5), storage_options=store_server.options())
