"""Which inputs there are and what they are: file kinds from names, file stamps, and expanding
files, globs, folders and `s3://` patterns (objects listed in storage) into a sorted list."""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path, PurePath, PurePosixPath

from llm.data.inputs.errors import InputError
from llm.data.storage.object_files import RemoteObject, expand_objects
from llm.data.storage.paths import parse_location

_KINDS = {".txt": "txt", ".text": "txt", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
_COMPRESSIONS = (".gz", ".zst")
_STAMP_BLOCK = 1 << 16

# An input: a local file, or an object listed in object storage (read by ranged GETs)
Input = Path | str | RemoteObject


def _pure(path: Input) -> PurePath:
    return path.pure if isinstance(path, RemoteObject) else Path(path)


def compression_of(path: Input) -> str | None:
    """'gz', 'zst' or None, from the file name."""
    suffix = _pure(path).suffix.lower()
    return suffix[1:] if suffix in _COMPRESSIONS else None


def input_kind(path: Input) -> str:
    """'jsonl', 'parquet' or 'txt', from the file name (compression suffix ignored).

    Anything that is not .jsonl/.json/.ndjson/.parquet is text with one record per
    line, whatever its extension (.txt, .csv, .py, none).
    """
    path = _pure(path)
    name = path.with_suffix("") if compression_of(path) else path
    return _KINDS.get(name.suffix.lower(), "txt")


@dataclass(frozen=True)
class FileStamp:
    """What a file looked like when it was listed: size, mtime, and a hash of its first and last 64 KiB."""

    size: int
    mtime_ns: int
    edges: str

    @classmethod
    def of(cls, path: Path | str) -> FileStamp:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            digest = hashlib.blake2b(f.read(_STAMP_BLOCK), digest_size=8)
            if st.st_size > _STAMP_BLOCK:
                f.seek(max(_STAMP_BLOCK, st.st_size - _STAMP_BLOCK))
                digest.update(f.read(_STAMP_BLOCK))
        return cls(st.st_size, st.st_mtime_ns, digest.hexdigest())

    def check(self, path: Path | str, when: str = "while it was read") -> None:
        """Raise when the file's size or mtime moved since the stamp: it changed under us."""
        try:
            st = os.stat(path)
        except OSError as e:
            raise InputError(f"{path}: input file disappeared {when} ({e.strerror or e})") from None
        if (st.st_size, st.st_mtime_ns) != (self.size, self.mtime_ns):
            raise InputError(
                f"{path}: input file changed {when} (size {self.size} -> {st.st_size} bytes, mtime moved: "
                f"{st.st_mtime_ns != self.mtime_ns}); the records read would mix old and new content: "
                "re-run once nothing writes to it"
            )



def _is_s3(pattern: str) -> bool:
    """An object-store pattern (s3://, gs://, az://, and the gcs:// / azure:// spellings)."""
    return pattern.split("://", 1)[0].lower() in ("s3", "gs", "gcs", "az", "azure") and "://" in pattern


def _local_pattern(pattern: str) -> str:
    """`local:/mnt/x` and `file:///x` are local paths here; `s3://` is refused (expand_sources reads it)."""
    if not pattern.startswith("local:") and "://" not in pattern:
        return pattern
    loc = parse_location(pattern)  # an unknown scheme is one error listing the valid forms
    if loc.is_object_store:
        raise InputError(f"{pattern}: object storage inputs are streamed (llm-train --task stream_lm, "
                         "data_source local); this command reads local files only")
    return loc.path


def expand_sources(patterns: list[str], storage_options: dict | None = None) -> list[Path | RemoteObject]:
    """`expand_inputs`, plus `s3://`, `gs://` and `az://` objects (a key, a prefix or a glob) after the local files, by key."""
    found = expand_inputs([p for p in patterns if not _is_s3(p)])
    objects: dict[str, RemoteObject] = {}
    for pattern in filter(_is_s3, patterns):
        for obj in expand_objects(pattern, storage_options, keep=_supported):
            objects.setdefault(obj.url, obj)
    remote = sorted(objects.values(), key=lambda o: (o.config.scheme, o.config.bucket, PurePosixPath(o.key)))
    return [*found, *remote]


def expand_inputs(patterns: list[str]) -> list[Path]:
    """Files, globs and folders to a sorted, de-duplicated list of supported input files."""
    found: list[Path] = []
    for pattern in map(_local_pattern, patterns):
        path = Path(pattern).expanduser()
        if path.is_dir():
            matches = [p for p in sorted(path.rglob("*")) if p.is_file() and _supported(p) and not _dedup_report(p, path)]
            if not matches:
                raise InputError(f"{path}: folder holds no .txt, .jsonl or .parquet input files")
        elif any(c in pattern for c in "*?["):
            matches = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
            if not matches:
                raise InputError(f"{pattern}: no files match this pattern")
        elif path.is_file():
            matches = [path]
        else:
            raise InputError(f"{path}: no such input file or folder")
        found.extend(matches)
    return sorted(dict.fromkeys(p.resolve() for p in found))


def refuse_inputs_in_output(inputs: list[str], output_dir: str | Path, what: str = "dataset") -> None:
    """Inputs and the output folder inside each other, refused in one sentence before anything is written or deleted.

    An input inside the output would be read back as input (optimize's own index.json matched by
    `*.json`) and deleted by an overwrite; an output inside an input folder, or in a glob's reach,
    is read as input by the next run over it (a rerun or a resume). `what` names the output.
    """
    out = Path(output_dir).expanduser().resolve()
    for pattern in inputs:
        if _is_s3(pattern):
            continue
        pattern = _local_pattern(pattern)
        path = Path(pattern).expanduser()
        magic = any(c in pattern for c in "*?[")
        # a glob keeps files only (expand_inputs): a folder it matches is not read
        matches = [Path(p) for p in glob.glob(str(path), recursive=True) if not os.path.isdir(p)] if magic else [path]
        for match in matches:
            resolved = match.resolve()
            if resolved == out or out in resolved.parents:
                raise ValueError(f"input {match} is inside the output folder {output_dir}; write the {what} "
                                 "elsewhere or narrow the input")
            if resolved.is_dir() and resolved in out.parents:
                raise ValueError(f"input folder {match} contains the output folder {output_dir}; write the {what} "
                                 "elsewhere")
        if magic and _glob_reaches(path, out):
            raise ValueError(f"input {pattern} matches files inside the output folder {output_dir}; write the {what} "
                             "elsewhere or narrow the input")


def _glob_reaches(pattern: Path, out: Path) -> bool:
    """Whether a glob can match a file inside the folder `out` (which need not exist yet)."""
    parts = pattern.absolute().parts
    static = next(i for i, part in enumerate(parts) if any(c in part for c in "*?["))
    try:  # the glob's fixed head resolved (symlinks), its magic tail matched against out's path below it
        rel = out.relative_to(Path(*parts[:static]).resolve()).parts
    except ValueError:
        return False
    for i, part in enumerate(parts[static:]):
        if part == "**" or i >= len(rel):
            return True  # out matched so far and the glob goes deeper, or any depth: files inside out match
        if not fnmatch.fnmatchcase(rel[i], part):
            return False
    return False  # the glob ends at out's depth or above: it names out itself (a folder, not read) or less


_DEDUP_REPORTS = ("dedup.json", "dedup-removed.jsonl")  # `llm-data dedup`'s report and removed list


def _dedup_report(path: Path, folder: Path) -> bool:
    """The report files at the top of a `llm-data dedup` output: not records, so a folder listing skips them."""
    return path.parent == folder and path.name in _DEDUP_REPORTS and (folder / "dedup.json").is_file()


def _supported(path: PurePath) -> bool:
    """Files picked up when a folder is given: the known text kinds (a named file may be anything)."""
    name = path.with_suffix("") if compression_of(path) else path
    return not path.name.startswith(".") and name.suffix.lower() in _KINDS
