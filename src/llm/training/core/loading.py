"""Read an `llm-train` YAML file, apply CLI overrides, and turn mistakes into one clear sentence."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from llm.training.core.axolotl import from_axolotl
from llm.training.core.axolotl_keys import SECTIONS
from llm.training.core.config import TrainConfig
from llm.training.core.errors import ConfigError, KeysError

__all__ = ["OPTIMIZED", "ConfigError", "build_config", "load_config", "parse_override", "read_yaml"]

OPTIMIZED = "optimized"  # data_source of token shards made by `llm-data optimize`


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any, source: str) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: cannot set {dotted!r} because {part!r} is not a section")
        node = child
    node[parts[-1]] = value


def parse_override(item: str) -> tuple[str, Any]:
    """`key.sub=value` (value parsed as YAML) to `("key.sub", value)`."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r} is not of the form section.key=value")
    try:
        return key.strip(), yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        return key.strip(), raw


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The YAML mapping in `path`, or a ConfigError naming the file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist; pass an existing YAML file to --config-path")
    try:
        tree = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"config file {p} is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if tree is None:
        tree = {}
    if not isinstance(tree, dict):
        raise ConfigError(f"config file {p} must hold a mapping with sections data/model/training/checkpoint")
    return tree


def build_config(
    tree: dict[str, Any],
    overrides: dict[str, Any] | None = None,
    source: str = "config",
    ignore_unsupported: bool = False,
    warn: Callable[[str], None] | None = None,
) -> TrainConfig:
    """Validate a config tree after applying dotted `overrides` (CLI flags win over YAML).

    An override of None sets the key to null (`--set checkpoint.checkpoint_dir=null`); a
    key that cannot be null is then an error naming it. Leave a key out to keep the YAML's.
    `ignore_unsupported` drops Axolotl keys llm-train lacks, naming them through `warn`.
    """
    overrides = overrides or {}
    # `--set sample_packing=true`: top-level (Axolotl) keys are set before they are translated
    axolotl = {k: v for k, v in overrides.items() if k.split(".")[0] not in SECTIONS}
    tree = dict(tree)
    for dotted, value in axolotl.items():
        _set_dotted(tree, dotted, value, source)
    # Axolotl's top-level keys (datasets, sequence_len, ...) into sections
    try:
        tree = from_axolotl(tree, source, ignore_unsupported, warn)
    except KeysError as exc:  # name what else is wrong in the same error: one run, every mistake
        more = _validate(_overridden(exc.rest or {}, overrides, axolotl, source), source)
        also = f"; and {more.removeprefix(source + ': ')}" if isinstance(more, str) else ""
        raise ConfigError(f"{exc}{also}") from None
    config = _validate(_overridden(tree, overrides, axolotl, source), source)
    if isinstance(config, str):
        raise ConfigError(config)
    return config


def _overridden(tree: dict[str, Any], overrides: dict[str, Any], done: dict[str, Any], source: str) -> dict[str, Any]:
    """`tree` with the section overrides (`data.x=...`) not yet applied (`done`: the top-level ones)."""
    tree = {k: (dict(v) if isinstance(v, dict) else v) for k, v in tree.items()}
    tree.setdefault("data", {})
    for dotted, value in overrides.items():
        if dotted not in done:
            _set_dotted(tree, dotted, value, source)
    return tree


def _validate(tree: dict[str, Any], source: str) -> TrainConfig | str:
    """The validated config, or the sentence saying what is wrong with it."""
    try:
        config = TrainConfig.validated(tree, source)
    except ConfigError as exc:
        return str(exc)
    try:  # the dataset itself is required only now: a DataConfig may be built without it
        config.data.check_source()
    except ValueError as exc:
        return f"{source}: {exc}"
    return config


def load_config(
    path: str | Path,
    overrides: dict[str, Any] | None = None,
    ignore_unsupported: bool = False,
    warn: Callable[[str], None] | None = None,
) -> TrainConfig:
    """Read, override and validate the YAML file at `path`."""
    return build_config(read_yaml(path), overrides, str(path), ignore_unsupported, warn)
