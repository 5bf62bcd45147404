"""`llm.data`'s public names: importable, and listed by dir() although they load lazily."""

from __future__ import annotations

import llm.data


def test_dir_lists_every_lazily_exported_name() -> None:
    listed = dir(llm.data)
    assert set(llm.data.__all__) <= set(listed), sorted(set(llm.data.__all__) - set(listed))
    assert {"StreamingDataset", "CombinedStreamingDataset", "StreamingDataLoader", "map", "optimize"} <= set(listed)
    for name in llm.data.__all__:
        assert getattr(llm.data, name) is not None


def test_the_cli_help_says_info_and_verify_take_urls_too() -> None:
    from llm.cli.data import _parser as build_parser

    parser = build_parser()
    actions = next(a for a in parser._actions if a.dest == "command")
    for command in ("info", "verify"):
        [dataset] = [a for a in actions.choices[command]._actions if a.dest == "dataset"]
        assert "s3://" in dataset.help and "LitData" in dataset.help


def test_every_install_hint_names_our_distribution() -> None:
    """`llm` on PyPI is another project: hints say the name pyproject.toml gives (imported as `llm`)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    name = re.search(r'^name = "([^"]+)"', (root / "pyproject.toml").read_text(), re.M).group(1)
    assert name != "llm"
    files = [*root.joinpath("src").rglob("*.py"), *root.joinpath("docs").glob("*.md"), root / "README.md"]
    hints = [(p.name, m) for p in files for m in re.findall(r"pip install '?([A-Za-z0-9_.-]+)\[", p.read_text())]
    assert hints, "the walk found the install hints"
    assert all(found == name for _, found in hints), [h for h in hints if h[1] != name]
