"""The README's benchmark table and targets paragraph are rendered from results JSONs, and the committed ones
match the run they cite and the newest scale runs in bench/results/."""

from __future__ import annotations

import json
from pathlib import Path

from bench import readme, readme_targets
from bench.results import RESULTS

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The main run the README cites (its targets paragraph names the file); `python -m bench` rewrites both.
MAIN_RUN = RESULTS / (readme_targets.cited_run(README.read_text()) or "the README names no main run")


def test_the_readme_table_is_the_one_the_cited_run_renders() -> None:
    text = (ROOT / "README.md").read_text()
    results = json.loads(MAIN_RUN.read_text())
    assert f"{readme.START}\n{readme.table(results)}\n{readme.END}" in text


def test_rewrite_replaces_only_between_the_markers_and_follows_the_numbers(tmp_path: Path) -> None:
    results = json.loads(MAIN_RUN.read_text())
    for row in results["scenarios"]["prepare"]:
        if row["who"] == "litdata":  # LitData twice as fast as in the run: our ratio halves
            row["mb_per_s"] = {**row["mb_per_s"], "median": row["mb_per_s"]["median"] * 2}
    page = tmp_path / "README.md"
    page.write_text(f"# x\n\nbefore\n{readme.START}\nold table\n{readme.END}\nafter\n")
    assert readme.rewrite(page, results)
    new = page.read_text()
    assert new.startswith("# x\n\nbefore\n") and new.endswith(f"{readme.END}\nafter\n") and "old table" not in new
    # the prepare ratio follows the numbers: half the cited run's (as rounded in the table)
    cited = _prepare_ratio(readme.table(json.loads(MAIN_RUN.read_text())))
    assert abs(_prepare_ratio(new) - cited / 2) <= 0.06, (cited, new)
    no_markers = tmp_path / "OTHER.md"
    no_markers.write_text("no table here\n")
    assert not readme.rewrite(no_markers, results) and no_markers.read_text() == "no table here\n"


def _prepare_ratio(table: str) -> float:
    """The "Nx faster" of the table's prepare row."""
    row = next(line for line in table.splitlines() if line.startswith("| prepare (text to shards"))
    return float(row.split("|")[2].strip().split("x")[0])


def test_the_readme_targets_paragraph_is_the_one_the_newest_results_render() -> None:
    """Fails when a newer huge / huge-shards run lands in bench/results/ (or the main run changes) and the README
    still quotes the old numbers: `python -m bench --report-only bench/results/<main run>.json` renders it again."""
    text = README.read_text()
    assert MAIN_RUN.is_file(), f"the README's targets paragraph cites {MAIN_RUN.name}, which bench/results/ lacks"
    expected = readme_targets.paragraph(json.loads(MAIN_RUN.read_text()), MAIN_RUN.name, readme_targets.side_runs())
    assert f"{readme_targets.START}\n{expected}\n{readme_targets.END}" in text, (
        "README.md's targets paragraph disagrees with bench/results/; re-render it with "
        f"python -m bench --report-only bench/results/{MAIN_RUN.name}")
    assert "Still short of our own targets" not in text  # the hand-written paragraph of an older round


def test_the_targets_paragraph_follows_the_newest_side_run_and_the_main_runs_verdicts(tmp_path: Path) -> None:
    for name in ("huge-20261202.json", "huge-shards-20261202.json"):
        (tmp_path / name).write_text((RESULTS / name).read_text())
    results = json.loads(MAIN_RUN.read_text())
    before = readme_targets.paragraph(results, MAIN_RUN.name, readme_targets.side_runs(tmp_path))
    assert "bench/results/huge-shards-20261202.json" in before and "bench/results/huge-20261202.json" in before
    newer = json.loads((RESULTS / "huge-shards-20261202.json").read_text())
    newer["checks"]["start_ms 5000/50"] = {"ratio": 4.2, "pass": False}  # a later run: 5,000 shards got slow
    (tmp_path / "huge-shards-20261203.json").write_text(json.dumps(newer))
    after = readme_targets.paragraph(results, MAIN_RUN.name, readme_targets.side_runs(tmp_path))
    assert "huge-shards-20261203.json" in after and "first batch 4.2x (**short**)" in after
    assert "huge-20261202.json" in after  # huge-<date> is not taken for huge-shards-<date>, nor the other way
    for row in results["scenarios"]["prepare"]:
        if row["who"] == "litdata":  # LitData 10x faster: the prepare target is short now
            row["mb_per_s"] = {**row["mb_per_s"], "median": row["mb_per_s"]["median"] * 10}
    slower = readme_targets.paragraph(results, MAIN_RUN.name, readme_targets.side_runs(tmp_path))
    assert "short: prepare: ours / LitData (MB/s), GPT-2 vocabulary 0.768 (goal >= 6)" in slower


def test_rewrite_with_the_source_renders_the_targets_paragraph_again(tmp_path: Path) -> None:
    page = tmp_path / "README.md"
    page.write_text(f"{readme.START}\nold\n{readme.END}\n\n{readme_targets.START}\nold targets\n{readme_targets.END}\nend\n")
    results = json.loads(MAIN_RUN.read_text())
    assert readme.rewrite(page, results, MAIN_RUN.name)
    new = page.read_text()
    assert "\nold\n" not in new and "old targets" not in new and new.endswith(f"{readme_targets.END}\nend\n")
    assert readme_targets.cited_run(new) == MAIN_RUN.name
