"""The one resume test helper every stateful piece goes through.

A pipeline is described by a module-level function ``run(config, state, steps)``
that builds it from ``config`` (a plain dict), loads ``state`` when given, takes
at most ``steps`` steps (``None``: until the epoch ends) and returns
``(outputs, state_after)``: one numpy array (or dict of arrays) per step and
the pipeline's ``state_dict()`` after the last step taken. ``run`` simulates
its own topology (ranks, workers) from ``config`` and returns *global* steps,
so the helper stays topology-free.

``check_resume`` runs the uninterrupted reference once, then for every stop
point takes ``stop`` steps in one fresh process, saves the state, and
continues in another fresh process under each resume config, comparing the
result with the reference either token for token (``exact=True``) or as a
multiset of records (``exact=False``: nothing lost, nothing repeated).

Both helpers end with the run ledger's audit (`tests/resume_ledger.py`): every run they drive gets
``config["ledger"]``, a folder of its own (the straight run's, and one per resumed chain; a stop's
head is copied for each continuation), which ``run`` must hand to its stream
(``StreamingDataLoader(ledger=)``, ``StreamingTextDataModule(ledger=)``, the SFT module's, or a
trainer's ``checkpoint.checkpoint_dir``), and every rank's ``state_dict()`` commits it. At the end
each ledger must audit OK (``llm-data audit``'s check, the data re-read), hold exactly the rows the
run consumed (a shard ledger: that many samples trained exactly once), and the chain's sample
identities must be the straight run's: the same multiset per epoch, and the same order where the
topology is unchanged or the resume is token for token.

Streams that cannot take a ledger pass ``ledger=False`` and are listed here with the reason:

* none.

``verify=False`` audits the counts without re-reading the data (``llm-data audit --no-verify``), for
data the audit cannot open by itself: an encrypted dataset (the audit takes no key), a shard dataset on an
object store reached through ``storage_options`` (the test servers' endpoint; the ledger header keeps no
credentials, so the audit's reader asks the default endpoint).
"""

from __future__ import annotations

import multiprocessing
import pickle
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from tests.resume_ledger import assert_same_identities, audited, copy_ledger, rows_in

RunFn = Callable[[dict, dict | None, int | None], tuple[list[Any], dict]]


_PRELOAD = ["numpy", "torch", "llm.data.shards.read.dataset"]


def in_fresh_process(fn: Callable, *args: Any) -> Any:
    """Call ``fn(*args)`` in a new process and return its result.

    The process is forked from a fork server that has only imported the heavy
    libraries (torch, numpy, llm.data), never run any pipeline code: it holds no
    state of the test's earlier runs, yet starts in milliseconds instead of the
    seconds a spawned interpreter needs to import torch.
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(_as_training_script, fn, *args).result()


def _as_training_script(fn: Callable, *args: Any) -> Any:
    # A fork-server child inherits "forkserver" as its default start method, so its
    # DataLoader workers would start through the server (about 1 s each); a training
    # script forks them. Restore that default before running the pipeline.
    multiprocessing.set_start_method("fork", force=True)
    return fn(*args)


def take_steps(batches: Any, steps: int | None = None) -> list[dict]:
    """Up to `steps` batches (all when None) of dicts of tensors, as dicts of numpy arrays."""
    out, it = [], iter(batches)
    while steps is None or len(out) < steps:
        batch = next(it, None)
        if batch is None:
            break
        out.append({k: v.numpy() for k, v in batch.items()})
    return out


def _flatten(step: Any) -> list[np.ndarray]:
    if isinstance(step, dict):
        return [np.asarray(step[k]) for k in sorted(step)]
    return [np.asarray(step)]


def assert_same_steps(actual: Sequence[Any], expected: Sequence[Any], what: str) -> None:
    """Token-for-token equality of two step sequences, with a readable failure."""
    assert len(actual) == len(expected), f"{what}: {len(actual)} steps, expected {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        for fa, fe in zip(_flatten(a), _flatten(e)):
            assert fa.shape == fe.shape and np.array_equal(fa, fe), f"{what}: step {i} differs"


def _records(steps: Sequence[Any], split_records: Callable[[Any], list[bytes]]) -> Counter:
    counts: Counter = Counter()
    for step in steps:
        counts.update(split_records(step))
    return counts


def check_resume(
    run: RunFn,
    config: dict,
    stops: Sequence[int],
    resume_configs: Sequence[dict] = (),
    *,
    exact: bool = True,
    split_records: Callable[[Any], list[bytes]] | None = None,
    fresh_process: bool = True,
    ledger: bool = True,
    verify: bool = True,
) -> list[Any]:
    """Stop at each of ``stops``, resume under ``config`` and every ``resume_configs``.

    With ``exact=False`` the continuation is compared as a multiset of records
    (``split_records(step)`` turns one step into hashable records) so another
    topology may reorder but never lose or repeat a record. Each run's ledger
    is audited and compared with the straight run's (module docstring).
    Returns the reference steps.
    """
    call = in_fresh_process if fresh_process else (lambda fn, *a: fn(*a))
    with tempfile.TemporaryDirectory(prefix="resume-ledger-") as tmp:
        folders = Path(tmp)

        def with_ledger(cfg: dict, name: str) -> dict:
            return {**cfg, "ledger": str(folders / name)} if ledger else cfg

        reference, _ = call(run, with_ledger(config, "straight"), None, None)
        assert reference, "the reference run produced no steps"
        straight = audited(folders / "straight", reference, "the straight run", verify) if ledger else None
        for stop in stops:
            assert 0 <= stop <= len(reference), f"stop {stop} outside 0..{len(reference)}"
            head, state = call(run, with_ledger(config, f"stop{stop}-0"), None, stop)
            assert_same_steps(head, reference[:stop], f"first {stop} steps")
            state = pickle.loads(pickle.dumps(state))  # the state must survive serialisation
            for i in range(1, len(resume_configs) + 1):  # the head's ledger, before any continuation adds to it
                copy_ledger(folders / f"stop{stop}-0", folders / f"stop{stop}-{i}")
            for i, cfg in enumerate((config, *resume_configs)):
                tail, _ = call(run, with_ledger(cfg, f"stop{stop}-{i}"), state, None)
                what = f"resume at step {stop} with {cfg}"
                if exact or i == 0:
                    assert_same_steps(head + tail, reference, what)
                else:
                    assert split_records is not None, "exact=False needs split_records"
                    got = _records(head + tail, split_records)
                    want = _records(reference, split_records)
                    lost, repeated = want - got, got - want
                    assert not lost and not repeated, (
                        f"{what}: {sum(lost.values())} records lost, {sum(repeated.values())} repeated"
                    )
                if ledger:
                    chain = audited(folders / f"stop{stop}-{i}", head + tail, what, verify)
                    assert straight is not None
                    assert_same_identities(straight, chain, exact or i == 0, what)
    return reference


def check_refused_state_changes_nothing(stage: Any, bad_state: Any, run: Callable[[Any], Sequence[Any]],
                                        fresh: Any) -> None:
    """`stage.check(bad_state)` and `stage.load_state_dict(bad_state)` raise StateError, and afterwards
    `run(stage)` gives exactly what `run(fresh)` gives: a refused state changed nothing (stage.py)."""
    import pytest

    from llm.data.stage import StateError

    with pytest.raises(StateError):
        stage.check(bad_state)
    with pytest.raises(StateError):
        stage.load_state_dict(bad_state)
    assert_same_steps(run(stage), run(fresh), "after a refused state")


def attach(module: Any, config: dict) -> Any:
    """`module` with the ledger folder the resume helpers gave `config`, attached (before its state is loaded)."""
    if config.get("ledger"):
        module.attach_ledger(config["ledger"])
    return module


def loaded(modules: list, state: dict | None, ledger: str | None = None) -> list:
    """The data modules of one simulated topology (one per rank), each given `state` when there is one, and
    `ledger` (the folder `config["ledger"]` the resume helpers pass) attached first.

    A process made by the spawn start method (the fresh processes above, mp.spawn) hands "spawn" on to
    its DataLoader workers too; torchrun / plain python use "fork" on Linux, as set here.
    """
    multiprocessing.set_start_method("fork", force=True)
    for m in modules:
        if ledger:
            m.attach_ledger(ledger)
        if state is not None:
            m.load_state_dict(state)
    return modules


def step_ranks(modules: list, steps: int | None, keys: Sequence[str] = ("input_ids", "labels")) -> list[dict]:
    """Up to `steps` global steps (all when None) of the ranks' train loaders: each rank's batch, stacked."""
    iters = [iter(m.train_dataloader()) for m in modules]
    out: list[dict] = []
    while steps is None or len(out) < steps:
        live = [b for b in (next(it, None) for it in iters) if b is not None]
        if not live:
            break
        out.append({k: np.concatenate([b[k].numpy() for b in live]) for k in keys})
    return out


def step_rows(step: Any) -> list[bytes]:
    """One step as its rows (samples), each as bytes: what a chain compares when the batch size changes."""
    arrays = _flatten(step)
    return [b"|".join(np.ascontiguousarray(a[i]).tobytes() for a in arrays) for i in range(len(arrays[0]))]


def check_resume_chain(
    run: RunFn,
    chain: Sequence[tuple[dict, int | None]],
    *,
    exact: bool = True,
    rows: Callable[[Any], list[bytes]] = step_rows,
    source_of: Callable[[bytes], Any] | None = None,
    fresh_process: bool = True,
    ledger: bool = True,
    verify: bool = True,
) -> list[bytes]:
    """Run a chain of topologies, each resumed from the state the previous one saved, and compare rows.

    ``chain`` is ``[(config, steps), ...]``: the first config runs ``steps`` steps from the start, each
    next one loads the saved state and runs its ``steps`` (``None``: to the end of the epoch). Configs may
    change anything a resume may change: the global batch size, ranks, workers, sources. The rows of the
    whole chain are compared with the rows of one uninterrupted run under the first config:

    * ``exact=True``: the same rows in the same order (a batch change only regroups them);
    * ``exact=False``: the same multiset of rows (nothing lost, nothing repeated), and with
      ``source_of(row)`` each source's rows in the straight run's order.

    Then both ledgers are audited and their sample identities compared (module docstring; in order
    with ``exact=True``). Returns the reference rows.
    """
    call = in_fresh_process if fresh_process else (lambda fn, *a: fn(*a))
    with tempfile.TemporaryDirectory(prefix="resume-ledger-") as tmp:
        folders = Path(tmp)

        def with_ledger(cfg: dict, name: str) -> dict:
            return {**cfg, "ledger": str(folders / name)} if ledger else cfg

        want, consumed = _chain_rows(run, call, chain, rows, exact, source_of, with_ledger)
        if ledger:
            straight = audited(folders / "straight", [np.empty(consumed[0])], "the straight run", verify)
            resumed = audited(folders / "chain", [np.empty(consumed[1])], f"chain {list(chain)}", verify)
            assert_same_identities(straight, resumed, exact, f"chain {list(chain)}")
    return want


def _chain_rows(run: RunFn, call: Callable, chain: Sequence[tuple[dict, int | None]], rows: Callable[[Any], list[bytes]],
                exact: bool, source_of: Callable[[bytes], Any] | None, with_ledger: Callable[[dict, str], dict]
                ) -> tuple[list[bytes], tuple[int, int]]:
    """check_resume_chain's runs and row comparisons; returns the reference rows, and the rows (samples) the
    straight run and the chain consumed."""
    first = chain[0][0]
    reference_steps, _ = call(run, with_ledger(first, "straight"), None, None)
    want = [r for step in reference_steps for r in rows(step)]
    assert want, "the reference run produced no rows"
    got: list[bytes] = []
    state: dict | None = None
    consumed = (sum(rows_in(s) for s in reference_steps), 0)
    for i, (cfg, steps) in enumerate(chain):
        out, state = call(run, with_ledger(cfg, "chain"), state, steps)
        consumed = (consumed[0], consumed[1] + sum(rows_in(s) for s in out))
        state = pickle.loads(pickle.dumps(state))  # the state must survive serialisation
        got += [r for step in out for r in rows(step)]
        assert len(got) <= len(want) + 64, f"chain link {i} ({cfg}): {len(got)} rows, more than the epoch's {len(want)}"
    what = f"chain {[(c, s) for c, s in chain]}"
    if exact:
        assert len(got) == len(want), f"{what}: {len(got)} rows, expected {len(want)}"
        first_diff = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), None)
        assert first_diff is None, f"{what}: row {first_diff} differs from the straight run's"
        return want, consumed
    got_c, want_c = Counter(got), Counter(want)
    lost, repeated = want_c - got_c, got_c - want_c
    assert not lost and not repeated, f"{what}: {sum(lost.values())} rows lost, {sum(repeated.values())} repeated"
    if source_of is not None:
        for source in {source_of(r) for r in want}:
            mine = [r for r in got if source_of(r) == source]
            straight = [r for r in want if source_of(r) == source]
            assert mine == straight, f"{what}: source {source!r}'s rows are not in the straight run's order"
    return want, consumed
