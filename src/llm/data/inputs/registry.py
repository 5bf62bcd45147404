"""Source names (`data_source`) to factories `cfg -> TextSource`: the built-ins and registered custom sources.

The registry imports every source (local, hf, dedup), so no source module needs
another: there is no import circle between them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from llm.data.inputs.dedup import DedupTextSource
from llm.data.inputs.entries import SourceEntry
from llm.data.inputs.hf import HFStreamTextSource
from llm.data.inputs.local import LocalLineTextSource
from llm.data.inputs.mixture import DedupMixture
from llm.data.inputs.source import TextSource

SourceFactory = Callable[[Any], TextSource]


class SourceRegistry:
    """Names to factories; each knows the extra config keys its source reads, when it says so."""

    def __init__(self) -> None:
        self._factories: dict[str, SourceFactory] = {}
        self._keys: dict[str, frozenset[str] | None] = {}
        self._builtin: set[str] = set()

    def register(self, name: str, factory: SourceFactory | type[TextSource], config_keys: Iterable[str] | None = None) -> None:
        """Register `factory` (a callable `cfg -> TextSource`, or a TextSource class) under `name`.

        The extra `data:` keys the source reads are `config_keys`, else the class's own
        `config_keys` (a class is built with those keys as keyword arguments). A factory
        that declares none (the guide's one-line lambda) is checked when it is built:
        a key it did not read, or one it read but the config lacks, is an error then.
        """
        if isinstance(factory, type) and issubclass(factory, TextSource):
            cls = factory
            keys = tuple(config_keys) if config_keys is not None else cls.config_keys
            factory = lambda cfg: cls(**{k: getattr(cfg, k) for k in keys})  # noqa: E731
            config_keys = keys
        self._factories[name] = factory
        self._keys[name] = frozenset(config_keys) if config_keys is not None else None

    def unregister(self, name: str) -> None:
        """Remove a custom source (tests use it to leave the registry as they found it)."""
        if name in self._builtin:
            raise ValueError(f"data_source {name!r} is built in and cannot be unregistered")
        self._factories.pop(name, None)
        self._keys.pop(name, None)

    def _register_builtin(self, name: str, factory: SourceFactory) -> None:
        self._factories[name] = factory
        self._keys[name] = frozenset()
        self._builtin.add(name)

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def names(self) -> list[str]:
        return list(self._factories)

    def custom_names(self) -> list[str]:
        return [n for n in self._factories if n not in self._builtin]

    def declared_keys(self, name: str) -> frozenset[str] | None:
        """Extra config keys allowed for `name`; None: not declared, checked when the source is built."""
        return self._keys.get(name, frozenset())

    def build(self, cfg: Any) -> TextSource:
        """The source named by `cfg.data_source`; a missing or unknown key is a ValueError naming it.

        A config listing text sources in `datasets` is their mixture (`mixing.py`).
        """
        entries = cfg.datasets
        if entries:
            return self._mixture(cfg, entries)
        name = cfg.data_source
        factory = self._factories.get(name)
        if factory is None:
            raise ValueError(f"data_source {name!r} is not registered; use one of: {', '.join(self.names())}")
        if self._keys.get(name) is not None:
            return factory(cfg)
        recorder = _KeyRecorder(cfg)
        source = factory(recorder)
        extra = set(cfg.model_extra or {})
        unread = sorted(extra - recorder.read)
        if unread:
            read = ", ".join(sorted(extra & recorder.read)) or "none"
            raise ValueError(
                f"unknown data key {unread[0]!r}: data_source {name!r} does not read it (it reads: {read})"
            )
        return source


    def _mixture(self, cfg: Any, entries: list[Any]) -> TextSource:
        sources, deduplicated = [], set()
        for i, entry in enumerate(entries):
            keys = _source_keys(i, entry)
            if keys["data_source"].startswith("dedup_"):  # deduplicated by the mixture's one seen-set
                deduplicated.add(i)
                keys["data_source"] = keys["data_source"][len("dedup_"):]
            one = cfg.model_copy(update={**keys, "datasets": None})
            try:
                sources.append(self.build(one))
            except ValueError as e:
                raise ValueError(f"datasets[{i}]: {e}") from None
            if i in deduplicated and isinstance(sources[-1], HFStreamTextSource):
                sources[-1].twin = "dedup_local"  # the entry says dedup_hf: its twin is dedup_local
        mixture = cfg.mixture().build(sources)
        if not deduplicated:
            return mixture
        return DedupMixture(
            mixture, deduplicated, hash_algo=cfg.hash_algo, seen_hashes_path=cfg.seen_hashes_path,
            write_seen_hashes=cfg.write_seen_hashes,
        )


class _KeyRecorder:
    """A config stand-in that records which keys a factory reads, and names a missing one."""

    def __init__(self, cfg: Any):
        self._cfg = cfg
        self.read: set[str] = set()

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__"):
            raise AttributeError(key)
        self.read.add(key)
        try:
            return getattr(self._cfg, key)
        except AttributeError:
            raise ValueError(
                f"data key {key!r} is required by data_source {self._cfg.data_source!r}; add it to the data: section"
            ) from None

    def extra(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return self._cfg.extra(key, default)


def _source_keys(i: int, entry: Any) -> dict[str, Any]:
    """A mixture entry's source keys; a bare `{path}` entry (the SFT word) is a local text source."""
    if isinstance(entry, SourceEntry):
        return entry.model_dump(exclude={"name"})  # the name is the accounting's, not the source's
    if entry.model_fields_set <= {"path", "name"}:  # `name`: the entry's name in the accounting
        return SourceEntry(dataset_path=entry.path).model_dump(exclude={"name"})
    raise ValueError(
        f"datasets[{i}] has fine-tuning keys (path, type): use --task sft, or give text sources "
        "(data_source, path / dataset_path / dataset_name) to mix them for stream_lm"
    )


def _require(cfg: Any, key: str) -> Any:
    value = getattr(cfg, key)
    if not value:
        raise ValueError(f"{key} is required when data_source={cfg.data_source!r}")
    return value


def _local(cfg: Any) -> TextSource:
    return LocalLineTextSource(_require(cfg, "dataset_path"), cfg.text_column, storage_options=cfg.storage_options)


def _hf(cfg: Any) -> TextSource:
    # dataset_path with an HF source = data_files, e.g. dataset_name 'json' over local files.
    # twin: an unreachable hub names the local source of the same kind (dedup_hf -> dedup_local).
    return HFStreamTextSource(
        _require(cfg, "dataset_name"), cfg.dataset_config, cfg.dataset_split, cfg.text_column,
        data_files=cfg.dataset_path or None, twin="dedup_local" if cfg.data_source == "dedup_hf" else "local",
    )


def _dedup(inner: SourceFactory) -> SourceFactory:
    return lambda cfg: DedupTextSource(inner(cfg), cfg.hash_algo, cfg.seen_hashes_path, cfg.write_seen_hashes)


SOURCE_REGISTRY = SourceRegistry()
SOURCE_REGISTRY._register_builtin("local", _local)
SOURCE_REGISTRY._register_builtin("hf", _hf)
SOURCE_REGISTRY._register_builtin("dedup_local", _dedup(_local))
SOURCE_REGISTRY._register_builtin("dedup_hf", _dedup(_hf))


def build_text_source(cfg: Any) -> TextSource:
    """The text source a `DataConfig` describes (`SOURCE_REGISTRY.build`)."""
    return SOURCE_REGISTRY.build(cfg)
