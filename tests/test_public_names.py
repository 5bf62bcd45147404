"""`llm.data`'s public names: importable, and listed by dir() although they load lazily."""

from __future__ import annotations

import llm.data


def test_dir_lists_every_lazily_exported_name() -> None:
    listed = dir(llm.data)
    assert set(llm.data.__all__) <= set(listed), sorted(set(llm.data.__all__) - set(listed))
    assert {"StreamingDataset", "CombinedStreamingDataset", "StreamingDataLoader", "map", "optimize"} <= set(listed)
    # the loader's named errors, catchable without knowing their modules
    assert issubclass(llm.data.MetricsPortError, OSError) and issubclass(llm.data.DataStallError, TimeoutError)
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


def test_litdatas_cloud_machines_are_one_sentence_pointing_to_the_ray_engine(tmp_path) -> None:
    import pytest

    ray = "to spread the work over several machines, pass engine='ray' (ray_address= names your Ray cluster; docs/items.md)"
    with pytest.raises(TypeError) as info:
        llm.data.optimize(str, [1, 2], str(tmp_path / "ds"), num_workers=0, num_nodes=2)
    assert str(info.value) == ("optimize: num_nodes= is LitData's way to run on Lightning AI's cloud machines, and "
                               f"llm.data runs on no cloud of its own; {ray}")
    with pytest.raises(TypeError) as info:
        llm.data.map(print, [1], str(tmp_path / "out"), num_nodes=2, machine="A10G")
    assert str(info.value).startswith("map: num_nodes= and machine= are LitData's way") and str(info.value).endswith(ray)
    assert not (tmp_path / "ds").exists() and not (tmp_path / "out").exists()  # refused before anything is written
    with pytest.raises(ImportError, match=r"^llm.data has no Machine: LitData's Machine picks .*engine='ray'"):
        from llm.data import Machine  # noqa: F401
    assert llm.data.optimize.__wrapped__.__name__ == "optimize"  # the refusal wraps the function, same name and signature
