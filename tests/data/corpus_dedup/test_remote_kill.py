"""An s3:// output under the local folder's crash guards: a real SIGKILL at every kill point (the local ones of
test_kill.py and the object store's own), --overwrite after a kill, two writers at once, an object damaged in the
bucket; each time the same command run again ends with the local engine's bytes and an empty scratch folder."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from llm.data import dedup_corpus
from llm.data.storage.lock import LOCK_NAME
from llm.data.storage.objects import open_objects
from llm.data.storage.s3 import ObjectNotFound
from tests.data.corpus_dedup.helpers import tree, write_corpus
from tests.data.corpus_dedup.test_kill import KILL_POINTS, ROOT
from tests.data.corpus_dedup.test_remote_output import remote_tree
from tests.storage.conftest import s3_server  # noqa: F401 - the session's server

# A prefix has no rename: no `cleanup:rename`; its own points: a folder's files put but not its marker (`upload`),
# the scratch copy's deletion cut short (`sweep`); --overwrite's deletion cut short (`overwrite`) is tested below.
REMOTE_POINTS = [p for p in KILL_POINTS if p != "cleanup:rename"] + ["upload", "sweep"]
QUICK = ("upload", "sweep")  # the store's own; test_remote_output.py kills at clusters and report too


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, dict[str, bytes]]:
    """The corpus and the bytes of one local run of it (the reference of every test here)."""
    folder = tmp_path_factory.mktemp("corpus")
    write_corpus(folder)
    local = tmp_path_factory.mktemp("local") / "out"
    dedup_corpus(str(folder), local, near=0.8, num_workers=0, progress=False)
    return folder, tree(local)


class Runs:
    """`llm-data dedup CORPUS --output s3://.../<new prefix> --near 0.8` in subprocesses, one scratch folder."""

    def __init__(self, server, corpus: Path, scratch: Path):
        self.server, self.scratch = server, scratch
        self.url = f"s3://{server.bucket}/{uuid.uuid4().hex[:12]}"
        self.cmd = [sys.executable, "-m", "llm.cli.data", "dedup", str(corpus), "--output", self.url, "--near", "0.8",
                    "--no-progress"]
        self.env = {**os.environ, **server.env(), "LLM_DEDUP_SCRATCH": str(scratch),
                    "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
        self.env.pop("LLM_DEDUP_KILL_AT", None)

    def start(self, *extra: str, kill_at: str | None = None, near: str = "0.8") -> subprocess.Popen:
        env = {**self.env, **({"LLM_DEDUP_KILL_AT": kill_at} if kill_at else {})}
        cmd = [*self.cmd[:-2], near, self.cmd[-1], *extra]
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def __call__(self, *extra: str, kill_at: str | None = None, near: str = "0.8") -> subprocess.CompletedProcess:
        proc = self.start(*extra, kill_at=kill_at, near=near)
        out, err = proc.communicate(timeout=120)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def tree(self) -> dict[str, bytes]:
        return remote_tree(self.url, self.server.options())


@pytest.fixture
def runs(s3_server, corpus, tmp_path: Path) -> Runs:  # noqa: F811
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    return Runs(s3_server, corpus[0], scratch)


def test_the_list_names_every_kill_point_of_an_object_store_output() -> None:
    code = (ROOT / "src" / "llm" / "data" / "corpus_dedup" / "remote.py").read_text()
    named = set(re.findall(r'kill_point\("([^"]+)"', code)) | set(re.findall(r'(?:drop|_delete)\(.*, "([^"]+)"\)$', code, re.M))
    assert named == {"cleanup:plan", "cleanup", "upload", "sweep", "overwrite"}


@pytest.mark.parametrize("point", [pytest.param(p, marks=() if p in QUICK else pytest.mark.slow) for p in REMOTE_POINTS])
def test_a_kill_at_any_point_then_the_same_command_ends_with_the_local_bytes(corpus, runs: Runs, point: str) -> None:
    first = runs(kill_at=point)
    assert first.returncode == -9, first.stderr  # a real SIGKILL at that point, not an exception
    second = runs()
    assert second.returncode == 0, second.stderr
    assert runs.tree() == corpus[1]  # the plan too, and no work object left
    assert list(runs.scratch.iterdir()) == []  # the killed run's scratch copy went with the rerun
    if point in QUICK:
        third = runs()  # a finished run, run again: nothing to do, nothing changed
        assert third.returncode == 0 and "already holds this run's result" in third.stderr, third.stderr
        assert runs.tree() == corpus[1]


@pytest.mark.parametrize("point", ["write:2", pytest.param("overwrite", marks=pytest.mark.slow)])
def test_overwrite_after_a_killed_run_of_other_parameters_leaves_no_stale_object(corpus, runs: Runs, point: str) -> None:
    """A run of another threshold killed with its outputs half written (or a finished one whose --overwrite was
    killed while deleting it), then --overwrite: only this run's objects, and no scratch copy of either run."""
    if point == "overwrite":
        assert runs(near="0.9").returncode == 0
        killed = runs("--overwrite", kill_at="overwrite")
    else:
        killed = runs(near="0.9", kill_at=point)
    assert killed.returncode == -9, killed.stderr
    again = runs("--overwrite")
    assert again.returncode == 0, again.stderr
    assert runs.tree() == corpus[1]
    assert list(runs.scratch.iterdir()) == []


def _wait_for_lock(runs: Runs, proc: subprocess.Popen) -> None:
    objects = open_objects(runs.url, runs.server.options())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            objects.get(LOCK_NAME)
            return
        except ObjectNotFound:
            time.sleep(0.01)
    raise AssertionError(f"the first writer never took the lock (exit {proc.poll()})")


def test_two_writers_at_once_one_finishes_the_other_is_refused_or_waits(corpus, runs: Runs) -> None:
    """The first holds the lock, stopped (SIGSTOP) so that the second surely comes while it runs."""
    first = runs.start()
    _wait_for_lock(runs, first)
    os.kill(first.pid, signal.SIGSTOP)
    try:
        refused = runs()
        waiting = runs.start("--wait")
        time.sleep(3)  # long enough for an unguarded second writer to have started writing
        still = waiting.poll()
    finally:
        os.kill(first.pid, signal.SIGCONT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert refused.returncode == 2  # the CLI's one-sentence error
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(
        f"llm-data: error: {re.escape(runs.url)} is being written by a dedup run, pid {first.pid} on host {re.escape(socket.gethostname())}"
        r" since [-0-9: ]+ \(lock file .*\); wait for it to finish or pass wait=True \(CLI: --wait\); if that run is dead, delete "
        f"{re.escape(runs.url)}/{LOCK_NAME}", lines[0]), refused.stderr
    _, err = waiting.communicate(timeout=120)
    assert still is None and waiting.returncode == 0, err
    assert f"waiting for {runs.url}: held by pid {first.pid}" in err and "already holds this run's result" in err
    assert runs.tree() == corpus[1]
    assert list(runs.scratch.iterdir()) == []



@pytest.mark.parametrize(("rel", "how"), [
    (".dedup-work/scan/00002/lines.u64", "inverted"),  # unchecked, it gave wrong output: a kept line dropped
    pytest.param(".dedup-work/scan/00002/sig.u32", "truncated", marks=pytest.mark.slow),
    pytest.param(".dedup-work/exact.pairs", "truncated", marks=pytest.mark.slow),
    pytest.param(".dedup-work/plan.json", "truncated", marks=pytest.mark.slow),  # the driver's read
])
def test_a_committed_object_changed_in_the_bucket_is_a_named_error_never_wrong_output(corpus, runs: Runs, rel: str,
                                                                                     how: str) -> None:
    """Killed before the clusters were committed, then an object a later stage reads is damaged in the store; the
    rerun on another node (no scratch copy: this one's is deleted) names it, and --overwrite starts over."""
    import shutil

    assert runs(kill_at="clusters").returncode == -9
    [copy] = runs.scratch.iterdir()
    shutil.rmtree(copy)
    objects = open_objects(runs.url, runs.server.options())
    data = objects.get(rel)
    objects.put(rel, data[: len(data) // 2] if how == "truncated" else bytes(255 - b for b in data))
    again = runs()
    assert again.returncode == 2 and again.stderr.splitlines()[-1] == (
        f"llm-data: error: {runs.url}/{rel} is not the object this dedup run committed (its sha256 differs: changed "
        "or damaged in the store); pass overwrite=True (CLI: --overwrite) to start over"), again.stderr
    over = runs("--overwrite")
    assert over.returncode == 0, over.stderr
    assert runs.tree() == corpus[1]
    assert list(runs.scratch.iterdir()) == []
