"""`llm-train why|spikes` and `llm-data audit` given what a hostile user would type: counts below the range,
a run or checkpoint folder, the folder of all a run's ledgers, a path that does not exist."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llm.cli.data import main as llm_data
from llm.training.train import main as llm_train


@pytest.mark.parametrize("argv, named", [
    (["spikes", "RUN", "--top", "-3"], "argument --top: -3 is below 1"),
    (["spikes", "RUN", "--top", "0"], "argument --top: 0 is below 1"),
    (["spikes", "RUN", "--window", "2"], "argument --window: 2 is below 3"),
    (["why", "RUN", "--step", "2", "--preview", "-1"], "argument --preview: -1 is below 0"),
    (["why", "RUN", "--step", "x"], "argument --step: invalid int value: 'x'"),
])
def test_counts_out_of_range_are_refused_before_anything_is_read(argv: list[str], named: str,
                                                                  capsys: pytest.CaptureFixture) -> None:
    # before: --top -3 or --window 2 printed "no spike" (exit 0), a guess
    with pytest.raises(SystemExit) as exit_:
        llm_train(argv)
    assert exit_.value.code == 2 and named in capsys.readouterr().err


def _audit(path: Path, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    code = llm_data(["audit", str(path)])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_llm_data_audit_names_what_it_was_given_instead_of_a_ledger(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    code, out = _audit(tmp_path / "nope", capsys)
    assert code == 2 and f"ledger folder {tmp_path / 'nope'} does not exist" in out, out
    run = tmp_path / "ckpt"
    (run / "step_3").mkdir(parents=True)
    (run / "latest").write_text("step_3\n")
    (run / "step_3" / "meta.json").write_text("{}")
    for ledger in ("6d28c9318f405ab3", "7a7af54a33cc17fc"):
        (run / "ledger" / ledger).mkdir(parents=True)
        (run / "ledger" / ledger / "ledger.json").write_text(json.dumps({"version": 1, "run": ledger, "sources": []}))
    for folder in (run, run / "step_3"):
        code, out = _audit(folder, capsys)
        assert code == 2 and f"is an llm-train run or checkpoint folder, not a ledger; audit it with " \
                             f"`llm-train audit {folder}`" in out, out
    code, out = _audit(run / "ledger", capsys)
    assert code == 2 and "holds the ledgers of runs 6d28c9318f405ab3, 7a7af54a33cc17fc, not one ledger" in out, out
    code, out = _audit(tmp_path, capsys)  # a folder with nothing of a ledger: the reader's own sentence
    assert code == 2 and "holds no ledger (ledger.json is missing)" in out, out


def test_a_fresh_run_keeps_the_ledger_another_live_run_still_writes(tmp_path: Path) -> None:
    # before: a second fresh run in one checkpoint_dir, started before the first's first checkpoint, took the
    # first's ledger for stale and removed it at its own first checkpoint, under the first run's feet
    import os
    import socket
    import subprocess
    import sys
    from types import SimpleNamespace

    from llm.data.ledger.writer import lock_name
    from llm.training.ledger import RunLedger

    root = tmp_path / "ckpt" / "ledger"
    live, stale = root / "aaaa", root / "bbbb"
    stale.mkdir(parents=True)
    (stale / lock_name(0)).write_text(json.dumps({"pid": 2 ** 22 + 7, "host": socket.gethostname(), "since": 0}))
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from llm.data.storage.lock import FolderLock; "
         f"FolderLock(sys.argv[1], name={lock_name(0)!r}).acquire(); print('held', flush=True); time.sleep(60)",
         str(live)], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert holder.stdout.readline().strip() == "held"
        said: list[str] = []
        config = SimpleNamespace(checkpoint=SimpleNamespace(checkpoint_dir=str(tmp_path / "ckpt"), ledger=True,
                                                            ledger_loss=False))
        ledger = RunLedger(config, SimpleNamespace(writes_ledger=True), None, said.append)
        ledger._replaced = [live, stale]
        ledger.replaced_gone()
        assert live.is_dir() and not stale.exists()
        assert len(said) == 1 and said[0].startswith(f"ledger {live} is kept: it is being written by pid {holder.pid}")
        assert str(live / lock_name(0)) in said[0]
    finally:
        holder.kill()
        holder.wait()


CHILD = '''
import os, signal, sys
from pathlib import Path
import llm.data.ledger.writer as writer
import llm.data.storage.local as local
from llm.training.core.loading import build_config
from llm.training.trainer import Trainer
from tests.training.test_run_ledger import _tree

corpus, out, batch, point, at = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
trainer = None
real_write, real_atomic = local.write_file, writer.atomic_write

def write_file(path, parts):  # half a segment on disk, then kill -9
    if point == "mid" and ".seg.tmp" in str(path) and trainer.step == at:
        data = b"".join(bytes(p) for p in ([parts] if isinstance(parts, (bytes, memoryview)) else parts))
        real_write(path, data[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    return real_write(path, parts)

def atomic_write(path, data):  # the segment (and marker) landed, the checkpoint not yet
    real_atomic(path, data)
    if point == "after" and str(path).endswith(".seg") and trainer.step == at:
        os.kill(os.getpid(), signal.SIGKILL)

local.write_file, writer.atomic_write = write_file, atomic_write
latest = out / "ckpt" / "latest"
tree = _tree(corpus, out, batch=batch, resume=str(latest) if latest.exists() else None, epochs=2)
trainer = Trainer(build_config(tree), "lm", log=lambda _: None)
try:
    trainer.fit()
finally:
    trainer.close()
'''


@pytest.mark.parametrize("point, at", [("mid", 6), ("after", 9)])
def test_kill_9_during_a_commit_then_resume_audits_exactly_the_steps_the_run_stands_on(
        tmp_path: Path, capsys: pytest.CaptureFixture, point: str, at: int) -> None:
    import os
    import signal
    import subprocess
    import sys

    from tests.training.test_run_ledger import _corpus

    corpus, out = _corpus(tmp_path / "c.txt"), tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def child(batch: int, kill: str, step: int) -> int:
        return subprocess.run([sys.executable, "-c", CHILD, str(corpus), str(out), str(batch), kill, str(step)],
                              env=env, cwd=Path(__file__).resolve().parents[2], capture_output=True).returncode

    if at > 6:  # a resumed run is killed: its generation's marker is on disk too
        assert child(4, "after", 6) == -signal.SIGKILL
    assert child(2, point, at) == -signal.SIGKILL
    assert child(3, "none", -1) == 0  # resumed to the end of epoch 2
    code = llm_train(["audit", str(out / "ckpt")])
    text = capsys.readouterr().out
    assert code == 0 and "audit: OK" in text, text
    # every sample of both epochs once: a batch of 3 divides the 90 blocks of an epoch, so nothing is dropped
    assert "180 samples trained exactly once" in text, text
