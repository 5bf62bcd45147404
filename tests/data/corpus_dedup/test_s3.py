"""Inputs in object storage (`s3://`, a real S3-compatible server on loopback): the same result as the local files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llm.data import dedup_corpus
from llm.data.storage.objects import open_objects
from tests.data.corpus_dedup.helpers import tree, write_corpus
from tests.storage.conftest import s3_server  # noqa: F401 - the session's SeaweedFS server, as tests/storage use it


def test_s3_inputs_give_the_local_result_with_objects_named_in_the_removed_list(s3_server, tmp_path: Path) -> None:  # noqa: F811
    write_corpus(tmp_path / "in")
    url = s3_server.url()
    objects = open_objects(url, s3_server.options())
    for path in sorted(p for p in (tmp_path / "in").rglob("*") if p.is_file()):
        objects.put(path.relative_to(tmp_path / "in").as_posix(), path)
    local = dedup_corpus(str(tmp_path / "in"), tmp_path / "local", near=0.8, num_workers=0, progress=False)
    remote = dedup_corpus(url, tmp_path / "remote", near=0.8, num_workers=2, progress=False,
                          storage_options=s3_server.options())
    strip = lambda report: {k: v for k, v in report.items() if k != "files"}  # noqa: E731
    assert strip(remote) == strip(local) and remote["removed"] == 6
    prefix = url.removeprefix("s3://")
    mine, theirs = tree(tmp_path / "local"), tree(tmp_path / "remote")
    # objects mirror as bucket/key; the records written are the same bytes
    assert {name: data for name, data in theirs.items() if not name.lstrip(".").startswith("dedup")} == {
        f"{prefix}/{name}": data for name, data in mine.items() if not name.lstrip(".").startswith("dedup")}
    removed = [json.loads(line) for line in theirs["dedup-removed.jsonl"].decode().splitlines()]
    assert removed[0]["file"] == f"{url}/a.jsonl" and removed[0]["line"] == 14


@pytest.mark.slow  # a cluster of two raylets (~20 s to start)
def test_s3_inputs_on_the_ray_engine_give_the_local_bytes(s3_server, ray_cluster, tmp_path: Path) -> None:  # noqa: F811
    write_corpus(tmp_path / "in")
    url = s3_server.url()
    objects = open_objects(url, s3_server.options())
    for path in sorted(p for p in (tmp_path / "in").rglob("*") if p.is_file()):
        objects.put(path.relative_to(tmp_path / "in").as_posix(), path)
    local = dedup_corpus(url, tmp_path / "local", near=0.8, num_workers=0, progress=False,
                         storage_options=s3_server.options())
    on_ray = dedup_corpus(url, tmp_path / "ray", near=0.8, engine="ray", num_workers=2, progress=False,
                          storage_options=s3_server.options())
    assert on_ray["removed"] == local["removed"] == 6
    assert tree(tmp_path / "ray") == tree(tmp_path / "local")
