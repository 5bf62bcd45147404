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
