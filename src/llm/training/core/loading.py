"""Read an `llm-train` YAML file, apply CLI overrides, and turn mistakes into one clear sentence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from llm.training.core.axolotl import AXOLOTL_KEYS, from_axolotl
from llm.training.core.config import TrainConfig
from llm.training.core.errors import ConfigError

__all__ = ["OPTIMIZED", "ConfigError", "build_config", "load_config", "parse_override", "read_yaml"]

OPTIMIZED = "optimized"  # data_source of token shards made by `llm-data optimize`


def _describe(error: dict[str, Any], source: str) -> str:
    """One pydantic error as one sentence naming the dotted key."""
    loc = [str(part) for part in error.get("loc", ())]
    key = ".".join(loc)
    kind = error.get("type", "")
    if kind == "extra_forbidden":
        section = _section_model(loc[:-1])
        valid = ", ".join(section.model_fields) if section else ""
        where = f"section {'.'.join(loc[:-1])!r}" if len(loc) > 1 else "the top level"
        if len(loc) == 1:
            valid += " (sections) or Axolotl's " + ", ".join(AXOLOTL_KEYS)
        return f"{source}: unknown key {key!r} in {where}; valid keys are: {valid}"
    message = str(error.get("msg", "is invalid"))
    message = message.removeprefix("Value error, ")
    if kind in ("value_error", "assertion_error"):
        # Our validators already name the key in their sentence; prefix it only when they don't.
        named = not loc or loc[-1] in message
        return f"{source}: {message}" if named else f"{source}: {key}: {message}"
    if kind == "missing":
        return f"{source}: key {key!r} is required"
    if "input" in error and error["input"] is None:
        return f"{source}: {key} cannot be null; give it a value or leave it out"
    return f"{source}: {key} = {error.get('input')!r} is invalid ({message})"


def _section_model(loc: list[str]) -> Any:
    model: Any = TrainConfig
    for part in loc:
        field = model.model_fields.get(part)
        if field is None:
            return None
        model = field.annotation
    return model if isinstance(model, type) else None


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


def build_config(tree: dict[str, Any], overrides: dict[str, Any] | None = None, source: str = "config") -> TrainConfig:
    """Validate a config tree after applying dotted `overrides` (CLI flags win over YAML).

    An override of None sets the key to null (`--set checkpoint.checkpoint_dir=null`); a
    key that cannot be null is then an error naming it. Leave a key out to keep the YAML's.
    """
    overrides = overrides or {}
    # `--set sample_packing=true`: Axolotl's top-level keys are set before they are translated
    axolotl = {k: v for k, v in overrides.items() if k.split(".")[0] in AXOLOTL_KEYS}
    tree = dict(tree)
    for dotted, value in axolotl.items():
        _set_dotted(tree, dotted, value, source)
    tree = from_axolotl(tree, source)  # Axolotl's top-level keys (datasets, sequence_len, ...) into sections
    tree.setdefault("data", {})
    for dotted, value in overrides.items():
        if dotted not in axolotl:
            _set_dotted(tree, dotted, value, source)
    try:
        config = TrainConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(_describe(exc.errors()[0], source)) from None
    try:  # the dataset itself is required only now: a DataConfig may be built without it
        config.data.check_source()
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return config


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read, override and validate the YAML file at `path`."""
    return build_config(read_yaml(path), overrides, source=str(path))
