"""Read an `llm-train` YAML file, apply CLI overrides, and turn mistakes into one clear sentence."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from llm.training.core.axolotl import from_axolotl
from llm.training.core.axolotl_keys import SECTIONS, did_you_mean
from llm.training.core.config import TrainConfig
from llm.training.core.data_config import DatasetEntry, SourceEntry
from llm.training.core.errors import ConfigError, KeysError

__all__ = ["OPTIMIZED", "ConfigError", "build_config", "load_config", "parse_override", "read_yaml"]

OPTIMIZED = "optimized"  # data_source of token shards made by `llm-data optimize`


# a `datasets:` entry is one of these (pydantic names the member it tried in each error's loc: by
# class name for a plain union, by tag right after the list index for DataConfig's tagged union)
_UNION_MEMBERS = {"DatasetEntry": DatasetEntry, "SourceEntry": SourceEntry}
_TAGGED_MEMBERS = {"sft": DatasetEntry, "source": SourceEntry}


def _member_at(loc: tuple) -> int | None:
    """Where in `loc` the union member stands, if anywhere."""
    for i, part in enumerate(loc):
        if part in _UNION_MEMBERS or (part in _TAGGED_MEMBERS and i and isinstance(loc[i - 1], int)):
            return i
    return None


def _best_member(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each union-typed entry, only the errors of the member it fits best (the fewest errors), loc without it."""
    counts: dict[tuple, dict[str, int]] = {}
    for error in errors:
        loc = tuple(error.get("loc", ()))
        at = _member_at(loc)
        if at is not None:
            counts.setdefault(loc[:at], {}).setdefault(loc[at], 0)
            counts[loc[:at]][loc[at]] += 1
    best = {prefix: min(by_member, key=by_member.__getitem__) for prefix, by_member in counts.items()}
    kept = []
    for error in errors:
        loc = tuple(error.get("loc", ()))
        at = _member_at(loc)
        if at is None:
            kept.append(error)
        elif best[loc[:at]] == loc[at]:
            model = _UNION_MEMBERS.get(loc[at]) or _TAGGED_MEMBERS[loc[at]]
            kept.append({**error, "loc": loc[:at] + loc[at + 1:], "model": model})
    return kept


def _dotted(loc: Sequence[Any]) -> str:
    """('data', 'datasets', 0, 'path') -> 'data.datasets[0].path'."""
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):  # list[X], X | None, X | Y: the first model inside
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _section_model(loc: Sequence[Any]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = TrainConfig
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part)) if model is not None else None
        if field is None:
            return None
        model = _model_of(field.annotation)
    return model


def _unknown_keys(extra: list[dict[str, Any]], source: str) -> str:
    """Every unknown key of one section or entry, in one sentence with the valid keys (and a close match)."""
    where_loc = tuple(extra[0]["loc"][:-1])
    keys = [e["loc"] for e in extra if tuple(e["loc"][:-1]) == where_loc]
    model = extra[0].get("model") or _section_model(where_loc)
    valid = list(model.model_fields) if model is not None else []
    kind = "entry" if where_loc and isinstance(where_loc[-1], int) else "section"
    where = f"{kind} {_dotted(where_loc)!r}" if where_loc else "the top level"
    named = did_you_mean([_dotted(loc) for loc in keys], [str(loc[-1]) for loc in keys], valid, where, ", ".join(valid))
    return f"{source}: {named}"


def _describe_all(errors: list[dict[str, Any]], source: str) -> str:
    """A ValidationError's errors as one sentence: every unknown key of a section at once, else the first error."""
    errors = _best_member(errors)
    extra = [e for e in errors if e.get("type") == "extra_forbidden"]
    return _unknown_keys(extra, source) if extra else _describe(errors[0], source)


def _describe(error: dict[str, Any], source: str) -> str:
    """One pydantic error as one sentence naming the dotted key."""
    loc = list(error.get("loc", ()))
    key = _dotted(loc)
    kind = error.get("type", "")
    message = str(error.get("msg", "is invalid"))
    message = message.removeprefix("Value error, ")
    if kind in ("value_error", "assertion_error"):
        # Our validators already name the key in their sentence; prefix it only when they don't.
        named = not loc or str(loc[-1]) in message
        return f"{source}: {message}" if named else f"{source}: {key}: {message}"
    if kind == "missing":
        return f"{source}: key {key!r} is required"
    if "input" in error and error["input"] is None:
        return f"{source}: {key} cannot be null; give it a value or leave it out"
    return f"{source}: {key} = {error.get('input')!r} is invalid ({message})"


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
        config = TrainConfig.model_validate(tree)
    except ValidationError as exc:
        return _describe_all(exc.errors(), source)
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
