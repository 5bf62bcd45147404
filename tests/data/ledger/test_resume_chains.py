"""Issue 36's resume chains, each ending with `llm-data audit` of its ledger: the exactly-once count and OK.

Chains that already audit elsewhere: 0 and 2 workers, a scheduled mixture, text with dedup and SFT best fit
(tests/data/ledger/test_text_ledger.py); a shard chain over batch, ranks and workers and a mixture at another
batch (test_shard_ledger.py); every `check_resume` / `check_resume_chain` caller (tests/resume.py), among them
scheduled mixtures at other global batches (tests/data/text/test_elastic.py, tests/data/shards/test_mix_elastic.py).
Here: two simulated nodes sharing one ledger, one rank resumed on two real torch.distributed ranks (gloo), and the
two loader bugs the helper's audit found (a state saved before the first batch; a rank's padding row in a short
last global batch).
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from llm.cli.data import main as llm_data
from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader
from llm.data.ledger.reader import read_ledger
from tests.data.shards.helpers import make_token_dataset

BLOCK = 64


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_token_dataset(tmp_path_factory.mktemp("chains-ds"), n_lines=800)


def size(path: Path) -> int:
    return len(StreamingDataset(path, item_loader=TokensLoader(block_size=BLOCK)))


def audit_cli(ledger: Path, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    code = llm_data(["audit", str(ledger)])
    return code, capsys.readouterr().out


def run_node(config: dict, state: dict | None, steps: int | None) -> tuple[int, dict]:
    """One node of `nodes`, its `local` ranks in lockstep (global rank node * local + local rank), all writing the
    one ledger folder the nodes share; returns (rows read on this node, rank 0 of this node's state)."""
    multiprocessing.set_start_method("fork", force=True)
    world = config["nodes"] * config["local"]
    ds = StreamingDataset(config["path"], item_loader=TokensLoader(block_size=BLOCK), shuffle=True, seed=3)
    loaders, iters = [], []
    for local in range(config["local"]):
        loader = StreamingDataLoader(ds, batch_size=config["batch"], num_workers=config.get("workers", 0),
                                     ledger=config["ledger"])
        if state is not None:
            loader.load_state_dict(state)
        os.environ["RANK"], os.environ["WORLD_SIZE"] = str(config["node"] * config["local"] + local), str(world)
        iters.append(iter(loader))  # a loader reads its rank when iteration starts
        loaders.append(loader)
    os.environ.pop("RANK"), os.environ.pop("WORLD_SIZE")
    rows = done = 0
    while steps is None or done < steps:
        got = [next(it, None) for it in iters]
        if done == 0 and config.get("sync"):  # every rank's ledger is open (at its first batch): now the nodes wait for each other
            _meet(Path(config["sync"]), config["node"], config["nodes"])
        if got[0] is None:
            break
        rows += sum(len(b) for b in got if b is not None)
        done += 1
    return rows, [loader.state_dict() for loader in loaders][0]  # every rank commits at the checkpoint


def _meet(folder: Path, node: int, nodes: int, timeout: float = 60.0) -> None:
    """A barrier of the nodes of one link, as a launcher's rendezvous is: a resume's ranks all open the ledger (and
    take its next generation) before any of them commits, or a late node would take the generation after it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"node{node}").touch()
    deadline = time.monotonic() + timeout
    while len(list(folder.glob("node*"))) < nodes:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{folder}: only {len(list(folder.glob('node*')))} of {nodes} nodes met")
        time.sleep(0.01)


def nodes_step(pool: ProcessPoolExecutor, config: dict, nodes: int, state: dict | None, steps: int | None
               ) -> tuple[int, dict]:
    """`nodes` node processes at once, one link of the chain; node 0's rank 0 state is the checkpoint."""
    sync = Path(config["ledger"]).parent / f"meet-{len(list(Path(config['ledger']).parent.glob('meet-*')))}"
    futures = [pool.submit(run_node, {**config, "node": n, "nodes": nodes, "sync": str(sync)}, state, steps)
               for n in range(nodes)]
    results = [f.result() for f in futures]
    return sum(r for r, _ in results), results[0][1]


def test_two_simulated_nodes_share_one_ledger_through_a_resume_chain(dataset: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    n, ledger = size(dataset), tmp_path / "ledger"
    config = {"path": str(dataset), "ledger": str(ledger), "local": 2, "batch": 3}
    ctx = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(max_workers=2, mp_context=ctx) as pool:
        total, state = nodes_step(pool, {**config, "workers": 2}, 2, None, 5)  # 2 nodes x 2 ranks, 2 workers each
        rows, state = nodes_step(pool, config, 1, state, 7)  # one node (its 2 ranks) while the other is down
        total += rows
        rows, state = nodes_step(pool, {**config, "batch": 2}, 2, state, None)  # both again, another batch
        total += rows
    assert total == n and state["epoch"] == 1
    code, out = audit_cli(ledger, capsys)
    assert code == 0 and f"{n:,} samples trained exactly once" in out and "audit: OK" in out, out
    read = read_ledger(ledger)
    assert sorted(set(read.ranks.tolist())) == [0, 1, 2, 3]  # both nodes' ranks, in one folder
    assert [read.markers[g]["topology"]["world_size"] for g in sorted(read.markers)] == [2, 4]


def test_a_state_saved_before_the_first_batch_resumes_and_audits_clean(dataset: Path, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture) -> None:
    """A checkpoint at step 0 carried the ledger state {run: None}, which load_state_dict refused."""
    n, ledger = size(dataset), tmp_path / "ledger"
    ds = StreamingDataset(dataset, item_loader=TokensLoader(block_size=BLOCK), shuffle=True, seed=3)
    state = StreamingDataLoader(ds, batch_size=4, ledger=ledger).state_dict()
    assert state["ledger"] is None  # nothing recorded yet: no position, not a run id of None
    loader = StreamingDataLoader(ds, batch_size=4, num_workers=2, ledger=ledger)
    loader.load_state_dict(state)
    assert sum(len(b) for b in loader) == n
    assert loader.state_dict()["ledger"]["step"] == -(-n // 4)
    code, out = audit_cli(ledger, capsys)
    assert code == 0 and f"{n:,} samples trained exactly once" in out, out


def test_a_ranks_padding_row_in_a_short_last_batch_is_not_a_repeat(dataset: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    """A last global batch with fewer samples than ranks: the rank left without one repeats an early sample to
    step with the others (plan/schedule.py); the ledger records that step without the row."""
    n, world = size(dataset), 3
    batch = next(b for b in range(2, 40) if 0 < n % (b * world) < world)  # the last global batch: fewer than 3
    ledger = tmp_path / "ledger"
    _, state = run_node({"path": str(dataset), "ledger": str(ledger), "node": 0, "nodes": 1, "local": world,
                         "batch": batch}, None, None)
    assert state["epoch"] == 1
    code, out = audit_cli(ledger, capsys)
    assert code == 0 and f"{n:,} samples trained exactly once" in out and "audit: OK" in out, out
    read = read_ledger(ledger)
    last = read.rows["step"] == read.rows["step"].max()
    assert int(last.sum()) == n % (batch * world)  # the padding row is not in the ledger


def _dist_rank(rank: int, port: int, config: dict, state: dict, out: multiprocessing.Queue) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        ds = StreamingDataset(config["path"], item_loader=TokensLoader(block_size=BLOCK), shuffle=True, seed=3)
        loader = StreamingDataLoader(ds, batch_size=config["batch"], num_workers=config["workers"],
                                     ledger=config["ledger"])
        loader.load_state_dict(state)
        rows = sum(len(b) for b in loader)  # the rank comes from torch.distributed
        dist.barrier()
        out.put((rank, rows, loader.state_dict()))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_one_rank_resumed_on_two_real_ranks_audits_clean(dataset: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    """1 rank, then 2 torch.distributed processes (gloo) resuming its checkpoint: every sample once."""
    n, ledger = size(dataset), tmp_path / "ledger"
    ds = StreamingDataset(dataset, item_loader=TokensLoader(block_size=BLOCK), shuffle=True, seed=3)
    loader = StreamingDataLoader(ds, batch_size=8, ledger=ledger)
    head = 0
    for i, batch in enumerate(loader):
        head += len(batch)
        if i == 6:
            break
    state = loader.state_dict()
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()
    port = _free_port()
    config = {"path": str(dataset), "ledger": str(ledger), "batch": 4, "workers": 1}
    procs = [ctx.Process(target=_dist_rank, args=(r, port, config, state, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=240) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert head + sum(rows for _, rows, _ in results) == n
    assert results[0][2]["epoch"] == 1
    code, text = audit_cli(ledger, capsys)
    assert code == 0 and f"{n:,} samples trained exactly once" in text and "audit: OK" in text, text
    read = read_ledger(ledger)
    assert sorted(set(read.ranks.tolist())) == [0, 1] and read.markers[1]["topology"]["world_size"] == 2


def _run_edited(config: dict, state: dict | None, steps: int | None) -> tuple[list, dict]:
    """run_loader, whose resume hands the ledger an older position than the cursor's (a state edited by hand; the
    resume drops the segment past it, as after a kill -9):
    the tokens are the straight run's, only the ledger can tell."""
    from tests.data.shards.helpers import run_loader

    if state is not None and state.get("ledger"):
        state = {**state, "ledger": {**state["ledger"], "step": state["ledger"]["step"] - 2}}
    return run_loader(config, state, steps)


def _run_without_ledger(config: dict, state: dict | None, steps: int | None) -> tuple[list, dict]:
    from tests.data.shards.helpers import run_loader

    return run_loader({k: v for k, v in config.items() if k != "ledger"}, state, steps)


def test_the_resume_helper_fails_on_a_fault_only_the_ledger_shows(dataset: Path) -> None:
    from tests.resume import check_resume

    config = {"path": str(dataset), "block": BLOCK, "batch": 8}
    with pytest.raises(AssertionError, match="the ledger audit failed: .*was never trained"):
        check_resume(_run_edited, config, stops=[5], fresh_process=False)
    with pytest.raises(AssertionError, match="0 ledgers under .*must pass config\\['ledger'\\]"):
        check_resume(_run_without_ledger, config, stops=[5], fresh_process=False)
