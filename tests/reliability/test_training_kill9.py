"""kill -9 `llm-train --task stream_lm` at seeded steps (2 DataLoader workers; 2 torchrun ranks) and inside a
checkpoint write (also of a deduplicated run), resumed from `latest` each time (from scratch when there is
none): the same batches, documents and final weights as an uninterrupted run. `python -m bench.soak` runs
the long version."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.soak import kill_chain, seeded_kills


@pytest.mark.timeout(400)
@pytest.mark.slow  # end to end; `make test-all` and CI run it
def test_kill_9_with_two_workers_at_seeded_steps_and_inside_a_save(tmp_path: Path) -> None:
    kills = seeded_kills(seed=3, steps=12, count=3)
    modes = ["step", "save", "step"]  # the middle kill lands inside a checkpoint write
    result = kill_chain(tmp_path, kills, ranks=1, workers=2, modes=modes)
    assert len(result.resumed_at) == 3 and result.steps == 12
    assert result.documents > 40  # the comparison covers real, whole documents
    assert result.documents_lost == result.documents_repeated == 0


@pytest.mark.timeout(500)
@pytest.mark.slow  # end to end; `make test-all` and CI run it
def test_kill_9_with_two_ranks_at_seeded_steps(tmp_path: Path) -> None:
    result = kill_chain(tmp_path, seeded_kills(seed=5, steps=12, count=2), ranks=2, workers=0)
    assert len(result.resumed_at) == 2 and result.steps == 12
    assert result.documents > 40 and result.documents_lost == result.documents_repeated == 0


@pytest.mark.timeout(400)
@pytest.mark.slow  # end to end; `make test-all` and CI run it
def test_kill_9_of_a_dedup_run_inside_its_first_save_and_before_a_save_publishes(tmp_path: Path) -> None:
    # killed inside the first checkpoint write (the restart starts from scratch: the digests of the steps
    # it redoes must not be in the seen-hashes file), then once step 6's checkpoint is in place but its
    # digests are not in the file (the resume appends them)
    result = kill_chain(tmp_path, [1, 5], ranks=1, workers=0, modes=["save", "publish"], dedup=True)
    assert result.resumed_at == [6] and result.steps == 12
    assert result.documents > 40 and result.documents_lost == result.documents_repeated == 0
    assert (tmp_path / "chain" / "seen_hashes.txt").read_text() == (tmp_path / "ref" / "seen_hashes.txt").read_text()
