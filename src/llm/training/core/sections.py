"""`ConfigModel`, the base of every config section: pydantic's errors become one `ConfigError` sentence.

pydantic reports a mistake as "1 validation error for DataConfig ... [type=value_error,
input_value=...] For further information visit ...". A user who writes `DataConfig(max_seq_len=0)`
in Python should read what `llm-train` prints for the same key in a YAML file: one sentence
naming the key path. So building a section (`DataConfig(...)`, `TrainConfig.model_validate(...)`)
raises `ConfigError` (a ValueError, as pydantic's error was) with that sentence, and
`llm-train` asks for the same sentence with the file's name in front (`validated(tree, source)`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from llm.data.inputs.entries import SourceEntry
from llm.data.sft.settings import DatasetEntry
from llm.training.core.axolotl_keys import did_you_mean
from llm.training.core.errors import ConfigError

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


def dotted(loc: Sequence[Any]) -> str:
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


def _section_model(root: type[BaseModel], loc: Sequence[Any]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = root
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part)) if model is not None else None
        if field is None:
            return None
        model = _model_of(field.annotation)
    return model


def _unknown_keys(extra: list[dict[str, Any]], root: type[BaseModel]) -> str:
    """Every unknown key of one section or entry, in one sentence with the valid keys (and a close match)."""
    where_loc = tuple(extra[0]["loc"][:-1])
    keys = [e["loc"] for e in extra if tuple(e["loc"][:-1]) == where_loc]
    model = extra[0].get("model") or _section_model(root, where_loc)
    valid = list(model.model_fields) if model is not None else []
    kind = "entry" if where_loc and isinstance(where_loc[-1], int) else "section"
    where = f"in {kind} {dotted(where_loc)!r}" if where_loc else "at the top level"
    return did_you_mean([dotted(loc) for loc in keys], [str(loc[-1]) for loc in keys], valid, where, ", ".join(valid))


def _describe(error: dict[str, Any]) -> str:
    """One pydantic error as one sentence naming the dotted key."""
    loc = list(error.get("loc", ()))
    key = dotted(loc)
    kind = error.get("type", "")
    message = str(error.get("msg", "is invalid"))
    message = message.removeprefix("Value error, ")
    if kind in ("value_error", "assertion_error"):
        # Our validators already name the key in their sentence; prefix it only when they don't.
        named = not loc or str(loc[-1]) in message
        return message if named else f"{key}: {message}"
    if kind == "missing":
        return f"key {key!r} is required"
    if "input" in error and error["input"] is None:
        return f"{key} cannot be null; give it a value or leave it out"
    return f"{key} = {error.get('input')!r} is invalid ({message})"


def sentence(errors: list[dict[str, Any]], root: type[BaseModel], source: str | None = None) -> str:
    """A ValidationError's errors as one sentence: every unknown key of a section at once, else the first error.

    Key paths are relative to `root`, the model that was built; `source` (a file) goes in front.
    """
    errors = _best_member(errors)
    extra = [e for e in errors if e.get("type") == "extra_forbidden"]
    text = _unknown_keys(extra, root) if extra else _describe(errors[0])
    return f"{source}: {text}" if source else text


class ConfigModel(BaseModel):
    """A config section: building one with a mistake raises `ConfigError` with one sentence, not pydantic's text."""

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError(sentence(exc.errors(), type(self))) from None

    # pydantic calls a model's own __init__ for each nested section unless it is marked as the base one:
    # nested sections must fail inside the outer validation, so that the sentence names the whole key path
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Any:
        return cls.validated(obj, None, **kwargs)

    @classmethod
    def validated(cls, obj: Any, source: str | None, **kwargs: Any) -> Any:
        """`model_validate`, with a mistake's sentence naming `source` (the config file) in front."""
        try:
            return super().model_validate(obj, **kwargs)
        except ValidationError as exc:
            raise ConfigError(sentence(exc.errors(), cls, source)) from None
