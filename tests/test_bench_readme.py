"""The README's benchmark table is rendered from a results JSON, and the committed one matches the run it cites."""

from __future__ import annotations

import json
from pathlib import Path

from bench import readme

ROOT = Path(__file__).resolve().parent.parent
MAIN_RUN = ROOT / "bench" / "results" / "20261202-1243-200mb.json"


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
