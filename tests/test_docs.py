"""The docs checks: architecture.md names every module, relative links resolve, no citation of documents users lack."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
# [text](target) and ![alt](target), with an optional "title" after the target
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
# Internal documents users do not have (built from parts so this file does not cite them itself)
PRIVATE = ("docs/" + "DESIGN.md", "DESIGN" + ".md", "PEERS" + ".md")
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".ini", ".sh", ".json"}


def module_names(src: Path = ROOT / "src" / "llm") -> set[str]:
    """Every module as `folder/file.py` (`read/dataset.py`, `text/dataset.py`), packages' __init__ left out.

    The folder is part of the name so that two modules of one file name (a dataset in two
    wings) are each named, not one of them twice.
    """
    return {f"{path.parent.name}/{path.name}" for path in src.rglob("*.py") if path.stem != "__init__"}


def doc_pages(root: Path = ROOT) -> list[Path]:
    return sorted((root / "docs").glob("*.md")) + [root / "README.md"]


def relative_links(page: Path) -> list[str]:
    """The link targets of a Markdown page that point into the repository (not URLs, not anchors on the page)."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))  # code blocks show syntax, they do not link
    targets = (match.group(1) for match in LINK.finditer(text))
    return [t for t in targets if not re.match(r"^([a-z][a-z0-9+.-]*:|#)", t, re.I)]


def broken_links(pages: list[Path], root: Path = ROOT) -> list[str]:
    """`page: target` for every relative link whose file (the part before any #anchor) does not exist."""
    return [f"{page.relative_to(root)}: {target}" for page in pages for target in relative_links(page)
            if not (page.parent / target.split("#", 1)[0]).exists()]


def citations(roots: list[Path], skip: Path) -> list[str]:
    """`file:line` for every line under `roots` that cites a private document."""
    files = [p for r in roots for p in ([r] if r.is_file() else sorted(r.rglob("*")))
             if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts and p != skip]
    return [f"{p.relative_to(ROOT)}:{n}" for p in files
            for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
            if any(name in line for name in PRIVATE)]


def test_the_link_reader_sees_links_images_and_anchors_but_not_urls_or_code(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("x")
    page = tmp_path / "docs" / "b.md"
    page.write_text('[a](a.md#part) ![i](pic.png "t") [u](https://x.org/y.md) [s](#here) [m](mailto:a@b)\n'
                    "```\n[c](inside-code.md)\n```\n[up](../README.md)\n")
    assert relative_links(page) == ["a.md#part", "pic.png", "../README.md"]
    assert broken_links([page], tmp_path) == ["docs/b.md: pic.png", "docs/b.md: ../README.md"]


def test_architecture_names_every_module() -> None:
    names = module_names()
    assert "data/stage.py" in names and "read/dataset.py" in names  # the walk really found the package
    text = ARCHITECTURE.read_text(encoding="utf-8")
    missing = sorted(name for name in names if name not in text)
    assert not missing, f"docs/architecture.md does not name these modules (add a line for each): {missing}"


def test_relative_links_resolve() -> None:
    assert sum(len(relative_links(page)) for page in doc_pages()) > 10  # the reader really found the links
    assert not (found := broken_links(doc_pages())), f"links to files that do not exist: {found}"


def test_no_citation_of_documents_users_do_not_have() -> None:
    found = citations([ROOT / "docs", ROOT / "README.md", ROOT / "src", ROOT / "tests"], skip=Path(__file__).resolve())
    assert not found, f"these lines cite {' / '.join(PRIVATE[1:])}, which users do not have: {found}"
