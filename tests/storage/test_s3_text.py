"""Text sources in object storage (`data_source: local`, `dataset_path: s3://...`, `gs://...`, `az://...`),
against real servers (conftest.py). Tests parametrized over `store` run on each; the others on s3://.

The same files streamed from the store and from local disk give the same tokens in the same order;
globs and prefixes list like local globs and folders; a resume in a fresh process gives exactly the
remainder and asks only for the bytes after its cursors; resets mid-body lose and repeat nothing;
missing objects, wrong keys, exhausted retries and replaced objects are one sentence each.
"""

from __future__ import annotations

import gzip
import json
import random
import re
import textwrap
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from bench import faultproxy
from llm.data.inputs.readers import expand_inputs, expand_sources
from llm.data.storage.objects import open_objects
from llm.data.storage.s3 import StorageError
from llm.data.text.stream import FINGERPRINT_MISMATCH, StreamingTextDataModule
from llm.training.core.data_config import DataConfig
from tests.resume import assert_same_steps, attach, check_resume, take_steps
from tests.storage.conftest import QUICK_ON_S3, STORES
from tests.storage.faultproxy import FaultProxy

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def _docs(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"{seed}-{i} " + " ".join(rng.choices(WORDS, k=rng.choice([1, 3, 8, 40]))) for i in range(n)]


def _jsonl(docs: list[str]) -> bytes:
    return "".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)).encode()


def write_inputs(folder: Path, n: int = 120) -> Path:
    """One file of every kind, a file in a sub-folder, and files a folder listing must skip."""
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("".join(d + ("\n   \n" if i % 9 == 4 else "\n") for i, d in enumerate(_docs(n, 1))))
    (folder / "b.jsonl").write_bytes(_jsonl(_docs(n, 2)))
    (folder / "c.jsonl.gz").write_bytes(gzip.compress(_jsonl(_docs(n, 3))))
    (folder / "d.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(_jsonl(_docs(n, 4))))
    pq.write_table(pa.table({"text": _docs(n, 5)}), folder / "e.parquet", row_group_size=31)
    (folder / "f.json").write_text(json.dumps([{"text": d} for d in _docs(40, 6)]))  # a JSON array
    (folder / "sub" / "g.jsonl").write_bytes(_jsonl(_docs(n, 7)))
    (folder / ".hidden.txt").write_text("never read\n")
    (folder / "notes.md").write_text("not an input kind a folder picks up\n")
    return folder


def upload(folder: Path, url: str, options: dict) -> None:
    objects = open_objects(url, options)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        objects.put(path.relative_to(folder).as_posix(), path)


@pytest.fixture
def store() -> str:
    """The store a test runs on: s3 unless it parametrizes `store`."""
    return "s3"


@pytest.fixture
def server(request, store):
    return request.getfixturevalue(f"{store}_server")


def via(server, endpoint: str, **extra) -> dict:
    """The server's storage_options with requests sent through `endpoint` (a fault proxy)."""
    return {**server.options(**extra), **server.options_via(endpoint)}


@pytest.fixture
def corpus(server, tmp_path) -> tuple[Path, str]:
    folder = write_inputs(tmp_path / "corpus")
    url = server.url()
    upload(folder, url, server.options())
    return folder, url


def make_module(config: dict) -> StreamingTextDataModule:
    data = DataConfig(data_source=config.get("source", "local"), dataset_path=config["path"],
                      max_seq_len=config.get("L", 16), num_workers=config.get("workers", 0),
                      storage_options=config.get("options"))
    return StreamingTextDataModule(data, config.get("batch", 4), rank=0, world_size=1, loop=False)


def run_stream(config: dict, state: dict | None, steps: int | None) -> tuple[list, dict]:
    """`tests/resume.py` protocol over one rank."""
    module = attach(make_module(config), config)
    if state is not None:
        module.load_state_dict(state)
    return take_steps(module.train_dataloader(), steps), module.state_dict()


def _upstream(server) -> tuple[str, int]:
    host, port = server.endpoint.removeprefix("http://").split(":")
    return host, int(port)


def _one_sentence(message: str) -> None:
    assert "\n" not in message and "Traceback" not in message, message


@pytest.mark.timeout(300)
# s3 with 2 workers: test_dedup_over_s3_with_two_worker_processes; gs: test_an_object_replaced_..._is_refused[gs]
@pytest.mark.parametrize("store,workers", [("s3", 0), pytest.param("s3", 2, marks=pytest.mark.slow), ("az", 0),
                                           pytest.param("gs", 0, marks=pytest.mark.slow)])
def test_s3_streams_the_same_tokens_as_local_files(server, corpus, workers):
    folder, url = corpus
    local = run_stream({"path": str(folder), "workers": workers}, None, None)[0]
    remote, state = run_stream({"path": url, "workers": workers, "options": server.options()}, None, None)
    assert len(local) > 100
    assert_same_steps(remote, local, f"{server.scheme} vs local, {workers} workers")
    assert all(c["done"] for c in state["partitions"].values())
    # the fingerprint names the objects by their ETags; the keys never reach a dump
    assert all(v.startswith("etag:") for v in state["fingerprint"]["stamps"].values())
    assert "storage_options" not in DataConfig(storage_options=server.options()).model_dump()


@pytest.mark.timeout(300)
@pytest.mark.filterwarnings("ignore:DedupTextSource is running with in-memory only state")
def test_dedup_over_s3_with_two_worker_processes(s3_server, tmp_path):
    docs = _docs(150, 8)
    path = tmp_path / "dup.jsonl"
    path.write_bytes(_jsonl(docs + docs[:50]))  # 50 repeats to drop
    url = s3_server.url()
    upload(tmp_path, url, s3_server.options())
    config = {"path": f"{url}/dup.jsonl", "workers": 2, "options": s3_server.options(), "source": "dedup_local"}
    remote, _ = run_stream(config, None, None)  # the wrapped source's workers start from the forkserver too
    local, _ = run_stream({**config, "path": str(path), "options": None}, None, None)
    assert_same_steps(remote, local, "dedup over s3 vs local, 2 workers")
    assert 150 <= sum(int((s["labels"] == 256).sum()) for s in remote) < 200  # repeats within a worker dropped


@pytest.mark.parametrize("store", STORES)
def test_globs_prefixes_and_single_objects_list_like_local_paths(server, corpus):
    folder, url = corpus
    opts = server.options()

    def names(pattern: str) -> list[str]:
        found = expand_sources([pattern], opts)
        return [str(f).removeprefix(url + "/") if str(f).startswith(url) else
                Path(f).relative_to(folder.resolve()).as_posix() for f in found]

    for pattern in ("", "/*.jsonl", "/**/*.jsonl", "/*.json*", "/sub/*", "/?.txt", "/[ab].*", "/a.txt", "/sub"):
        want = names(f"{folder}{pattern}")
        assert names(f"{url}{pattern}") == want, pattern
        assert names(f"local:{folder}{pattern}") == want, pattern
    assert names(url) == ["a.txt", "b.jsonl", "c.jsonl.gz", "d.jsonl.zst", "e.parquet", "f.json", "sub/g.jsonl"]
    assert names(f"{url}/*.jsonl") == ["b.jsonl"]  # `*` stays within one level, as on disk
    assert expand_inputs([f"local:{folder}/a.txt"]) == [(folder / "a.txt").resolve()]
    mixed = expand_sources([f"{url}/b.jsonl", str(folder / "a.txt")], opts)  # local files first, then objects
    assert [Path(str(f)).name for f in mixed] == ["a.txt", "b.jsonl"]


@pytest.mark.parametrize("store", STORES)
def test_missing_objects_and_wrong_keys_are_one_sentence(server, corpus):
    _, url = corpus
    opts = server.options()
    at = r"at http://127.0.0.1:\d+(/devstoreaccount1)?"  # Azure's endpoint names the account
    cases = [
        (f"{url}/nope.jsonl", opts, rf"{url}/nope.jsonl is neither an object nor a prefix with objects under it "
                                    rf"{at}: check the path"),
        (f"{url}/*.csv", opts, rf"{re.escape(url)}/\*.csv: no objects match this pattern {at}"),
        (url, server.wrong_credentials(),
         rf"access denied \(HTTP 403[^)]*\) to {url} {at}: check [^;]*{server.keys_variable}"),
        (f"{server.scheme}://no-such-bucket-x/data/*.jsonl", opts,
         rf"{server.bucket_word} 'no-such-bucket-x' does not exist {at}"),
    ]
    for path, options, message in cases:
        with pytest.raises(StorageError, match=message) as info:
            make_module({"path": path, "options": options})
        _one_sentence(str(info.value))
    with pytest.raises(ValueError, match=r"unknown storage scheme 'hdfs://'"):
        make_module({"path": "hdfs://bucket/data/*.jsonl"})


@pytest.mark.timeout(300)
# Fresh processes (2 workers: ~45 s): CI. In make test, an in-process resume over s3 gives exactly the remainder in
# test_a_resume_fetches_only_the_bytes_after_its_cursors[s3].
@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_in_a_fresh_process_gives_exactly_the_remainder(server, corpus, workers):
    _, url = corpus
    config = {"path": url, "workers": workers, "options": server.options()}
    ref = check_resume(run_stream, config, stops=[23] if workers else [61])  # mid-stream
    assert len(ref) > 100


class _Counter:
    """Wraps the fault proxy's upstream call: every GET of one key, with its Range and body bytes."""

    def __init__(self, monkeypatch, key: str):
        self.key, self.gets = key, []
        real = faultproxy._forward

        def forward(upstream, head: bytes, body: bytes) -> bytes:
            response = real(upstream, head, body)
            text = head.decode("latin-1")
            method, path = text.split(" ", 2)[:2]
            if method == "GET" and unquote(path.split("?")[0]).endswith("/" + key):
                found = re.search(r"(?im)^(?:x-ms-)?range:\s*bytes=(\d+)-(\d*)", text)
                start = int(found.group(1)) if found else 0
                self.gets.append((start, len(response) - response.index(b"\r\n\r\n") - 4))
            return response

        monkeypatch.setattr(faultproxy, "_forward", forward)

    def total(self) -> int:
        return sum(n for _, n in self.gets)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("store", QUICK_ON_S3)
def test_a_resume_fetches_only_the_bytes_after_its_cursors(server, tmp_path, monkeypatch):
    path = tmp_path / "big.jsonl"
    path.write_bytes(_jsonl(_docs(8000, 9)))
    url = server.url()
    upload(tmp_path, url, server.options())
    counter = _Counter(monkeypatch, "big.jsonl")
    proxy = FaultProxy(_upstream(server), lambda *_: "ok")
    try:
        config = {"path": f"{url}/big.jsonl", "options": via(server, proxy.endpoint), "L": 256, "batch": 8}
        ref, _ = run_stream(config, None, None)
        full = counter.total()
        head, state = run_stream(config, None, int(len(ref) * 0.8))
        counter.gets.clear()
        tail, _ = run_stream(config, state, None)
    finally:
        proxy.close()
    assert_same_steps(head + tail, ref, "resume through the proxy")
    size = path.stat().st_size
    assert size <= full < 2 * size  # a whole read fetches the object about once
    parts = make_module({**config, "options": server.options()}).partitions()
    fresh = {"offset": 0, "done": False}  # a partition the state has no cursor for is not started
    live = [(p.start, p.end, c) for p in parts if not (c := state["partitions"].get(p.key, fresh))["done"]]
    assert live and len(live) < len(parts) / 3 + 2
    first = min(c["offset"] or start - 1 for start, _, c in live)  # where the unread lines begin
    probe = [(s, n) for s, n in counter.gets if s < first]
    assert probe == [(0, 4096)], counter.gets[:5]  # only the 4 KiB "is it a JSON array?" probe comes earlier
    unread = sum(end - max(start, c["offset"]) for start, end, c in live)
    assert counter.total() - 4096 <= unread + len(live) * 8192, (counter.total(), unread, size)
    assert counter.total() < 0.4 * size


@pytest.mark.timeout(300)
@pytest.mark.parametrize("store", QUICK_ON_S3)
def test_resets_mid_body_lose_and_repeat_nothing(server, corpus):
    folder, url = corpus

    def plan(method: str, path: str, attempt: int) -> str:  # every other GET of an object breaks halfway
        return "reset" if method == "GET" and "." in path.rsplit("/", 1)[-1] and attempt % 2 else "ok"

    proxy = FaultProxy(_upstream(server), plan)
    try:
        options = via(server, proxy.endpoint, retries=3, backoff=0.01)
        got = run_stream({"path": url, "options": options}, None, None)[0]
    finally:
        proxy.close()
    assert_same_steps(got, run_stream({"path": str(folder)}, None, None)[0], "s3 through resets vs local")
    assert proxy.faults["reset"] >= 20


@pytest.mark.parametrize("store", STORES)
def test_after_the_retry_budget_one_sentence_names_bucket_and_key(server, corpus):
    _, url = corpus

    def plan(method: str, path: str, attempt: int) -> str:
        return "reset" if method == "GET" and path.endswith("/b.jsonl") and attempt > 1 else "ok"  # the probe passes

    proxy = FaultProxy(_upstream(server), plan)
    try:
        options = via(server, proxy.endpoint, retries=2, backoff=0.01)
        module = make_module({"path": f"{url}/b.jsonl", "options": options})
        with pytest.raises(StorageError, match=rf"reading {url}/b.jsonl at http://127.0.0.1:\d+[^ ]* failed after 3 "
                                               r"attempts \(") as info:
            take_steps(module.train_dataloader())
    finally:
        proxy.close()
    _one_sentence(str(info.value))


@pytest.mark.parametrize("store", STORES)
def test_an_object_replaced_between_runs_or_while_read_is_refused(server, corpus, tmp_path):
    folder, url = corpus
    config = {"path": url, "options": server.options()}
    _, state = run_stream(config, None, 5)
    objects = open_objects(url, server.options())
    data = bytearray((folder / "a.txt").read_bytes())
    data[-3] = ord("#")  # same size, other content
    objects.put("a.txt", bytes(data))
    module = make_module(config)
    with pytest.raises(ValueError, match=rf"{FINGERPRINT_MISMATCH}: stamps\.a\.txt: 'etag:"):
        module.load_state_dict(state)
    # replaced after the source listed it: the next GET names the old ETag and is refused
    objects.put("a.txt", (folder / "a.txt").read_bytes())
    with pytest.raises(StorageError, match=rf"{url}/a.txt at http://127.0.0.1:\d+[^ ]* changed while it was read") as info:
        take_steps(module.train_dataloader())
    assert isinstance(info.value, ValueError)  # also an InputError: workers pass the sentence on
    _one_sentence(str(info.value))


@pytest.mark.timeout(600)
@pytest.mark.slow  # end to end; `make test-all` and CI run it
def test_kill_9_of_llm_train_reading_s3_text_resumes_exactly(s3_server, tmp_path, monkeypatch):
    import yaml

    import bench.soak as soak

    url = s3_server.url()
    real_config = soak.write_config

    def s3_config(folder: Path, corpus: Path, workers: int, *args, **kw) -> Path:
        open_objects(url, s3_server.options()).put(corpus.name, corpus)
        path = real_config(folder, corpus, workers, *args, **kw)
        tree = yaml.safe_load(path.read_text())
        tree["data"].update(dataset_path=f"{url}/{corpus.name}", storage_options=s3_server.options())
        path.write_text(yaml.safe_dump(tree))
        return path

    monkeypatch.setattr(soak, "write_config", s3_config)
    # worker processes of an s3 source start from a forkserver, which imports the main script:
    # the training script must be import-safe, as with any spawn/forkserver DataLoader
    guarded = "def main():\n" + textwrap.indent(soak._RUN, "    ") + "\n\nif __name__ == '__main__':\n    main()\n"
    monkeypatch.setattr(soak, "_RUN", guarded)
    result = soak.kill_chain(tmp_path, soak.seeded_kills(seed=4, steps=12, count=2), ranks=1, workers=2)
    assert len(result.resumed_at) == 2 and result.steps == 12
    assert result.documents > 40 and result.documents_lost == result.documents_repeated == 0
    from llm.training.checkpoint import load_checkpoint

    ckpt = load_checkpoint(tmp_path / "chain" / "ckpt" / "latest")
    assert ckpt["stream_data"]["fingerprint"]["dataset_path"] == f"{url}/corpus.txt"  # it read the store
    assert "storage_options" not in ckpt["config"]["data"]  # and kept the keys out of the checkpoint


@pytest.mark.parametrize("store", STORES)
def test_an_object_has_one_version_stamp_whether_listed_or_found_by_key(server, corpus):
    _, url = corpus
    listed = {o.name: o.stamp() for o in expand_sources([url], server.options())}
    by_key = expand_sources([f"{url}/b.jsonl"], server.options())[0]
    assert by_key.stamp() == listed["b.jsonl"] and by_key.stamp().startswith('etag:"'), (by_key.stamp(), listed)
