"""README.md's Python snippets: each compiles, every name they use is imported or defined (read top to
bottom, as a reader does: a later snippet may use an earlier one's imports), and the self-contained ones run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
FINDING = re.compile(r":(\d+):\d+: F821 (.*)$")


def snippets(page: Path) -> list[str]:
    """The ```python blocks of a Markdown page, in order."""
    return PYTHON_BLOCK.findall(page.read_text(encoding="utf-8"))


def undefined_names(blocks: list[str], folder: Path) -> list[str]:
    """`block N, line M: Undefined name `x``: ruff's F821 over the blocks joined in order."""
    pytest.importorskip("ruff", reason="ruff is part of the dev extra (pip install -e '.[dev]')")
    script = folder / "snippets.py"
    script.write_text("".join(blocks), encoding="utf-8")
    starts = [0]
    for block in blocks:
        starts.append(starts[-1] + block.count("\n"))
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F821",
                           "--output-format", "concise", str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1), done.stderr  # 1: findings; anything else: ruff itself failed
    found = []
    for line in done.stdout.splitlines():
        if match := FINDING.search(line):
            at = int(match.group(1))
            number = next(i for i in range(len(blocks)) if starts[i] < at <= starts[i + 1])
            found.append(f"block {number + 1}, line {at - starts[number]}: {match.group(2)}")
    return found


def test_the_check_names_a_snippet_that_forgets_an_import(tmp_path: Path) -> None:
    forgot = ["def name(path):\n    return os.path.basename(path)\n"]
    assert undefined_names(forgot, tmp_path) == ["block 1, line 2: Undefined name `os`"]
    # a name imported by an earlier block is defined for a later one, as for a reader going down the page
    assert undefined_names(["import os\n", *forgot], tmp_path) == []


def test_every_readme_snippet_compiles_and_defines_every_name_it_uses(tmp_path: Path) -> None:
    blocks = snippets(README)
    assert len(blocks) >= 3, "the README's python blocks were not found"
    for number, block in enumerate(blocks, 1):
        compile(block, f"README.md python block {number}", "exec")  # a SyntaxError names the block
    assert not (found := undefined_names(blocks, tmp_path)), f"README.md uses names it never defines: {found}"


def test_the_self_contained_readme_snippets_run(tmp_path: Path) -> None:
    """A block that needs nothing else (no `...` placeholder, no server URL, no name from an earlier block) runs as written."""
    runnable = [b for b in snippets(README) if "..." not in b and "://" not in b and not undefined_names([b], tmp_path)]
    assert runnable, "no README snippet is self-contained (the items example was)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    for number, block in enumerate(runnable, 1):
        folder = tmp_path / f"block{number}"
        folder.mkdir()
        done = subprocess.run([sys.executable, "-c", block], cwd=folder, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"README snippet failed:\n{block}\n{done.stderr[-3000:]}"
        assert any(folder.iterdir()), "the snippet wrote nothing where it said"
