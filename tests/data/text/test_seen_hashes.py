"""The guide's dedup semantics: passes start from the persisted baseline; seen-hashes files in every layout."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llm.data.dedup import DedupTextSource, SeenFileError, normalize, text_digest
from llm.data.inputs.seen_file import read_seen_file
from llm.data.sources import LocalLineTextSource
from llm.data.text.stream import StreamingTextDataModule
from llm.training.core.config import DataConfig

LINES = ["alpha beta", "gamma", "alpha   beta", "delta", "gamma", "epsilon"]
UNIQUE = ["alpha beta", "gamma", "delta", "epsilon"]


def corpus(tmp_path: Path, lines=LINES, name="c.txt") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def source(path, seen=None, write=False, **kw) -> DedupTextSource:
    if not (seen and write):
        with pytest.warns(UserWarning, match="in-memory only"):
            return DedupTextSource(LocalLineTextSource(path), seen_hashes_path=seen, write_seen_hashes=write, **kw)
    return DedupTextSource(LocalLineTextSource(path), seen_hashes_path=seen, write_seen_hashes=write, **kw)


def test_every_pass_starts_from_the_persisted_baseline(tmp_path):
    src = source(corpus(tmp_path))
    assert list(src.iter_texts()) == UNIQUE
    assert list(src.iter_texts()) == UNIQUE  # not empty: the first pass's set is not carried over
    assert list(src) == UNIQUE and list(src.iter_texts(skip=2)) == UNIQUE[2:]


def test_write_seen_hashes_on_its_own_lets_a_second_process_skip(tmp_path):
    seen = tmp_path / "seen.bin"
    path = corpus(tmp_path)
    first = source(path, seen, write=True)
    it = first.iter_texts()
    assert [next(it), next(it)] == UNIQUE[:2]
    it.close()  # stopping early still persists what was yielded
    assert read_seen_file(seen, "sha256").count == 2
    assert list(first.iter_texts()) == UNIQUE  # this object's baseline is the file as it was when made
    second = source(path, seen, write=True)
    assert list(second.iter_texts()) == []  # a new process skips everything the first one yielded
    fresh = source(corpus(tmp_path, ["gamma", "zeta", "eta"], "d.txt"), seen, write=True)
    assert list(fresh.iter_texts()) == ["zeta", "eta"]


def test_ranks_other_than_zero_never_write(tmp_path):
    seen = tmp_path / "seen.bin"
    script = (
        "import sys, warnings; from llm.data.dedup import DedupTextSource; "
        "from llm.data.sources import LocalLineTextSource; "
        "s = DedupTextSource(LocalLineTextSource(sys.argv[1]), seen_hashes_path=sys.argv[2], write_seen_hashes=True); "
        "print(len(list(s.iter_texts())))"
    )
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2"}
    out = subprocess.run([sys.executable, "-c", script, str(corpus(tmp_path)), str(seen)], env=env,
                         capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == str(len(UNIQUE)) and not seen.exists()


def test_custom_normaliser_is_used_and_named(tmp_path):
    src = source(corpus(tmp_path, ["Hello", "hello", "HELLO there"]), normalize=str.lower)
    assert list(src.iter_texts()) == ["Hello", "HELLO there"]
    assert src.source_fingerprint()["normalize"] == "builtins.str.lower"
    default = source(corpus(tmp_path, ["a"], "x.txt"))
    assert default.source_fingerprint()["normalize"] == "collapse-whitespace"
    assert default.normalize is normalize


def test_unknown_hash_algo_names_the_valid_ones(tmp_path):
    with pytest.raises(ValueError, match="hash_algo 'sha257' is unsupported .*use one of: .*md5.*sha256.*xxh3_128$"):
        DedupTextSource(LocalLineTextSource(corpus(tmp_path)), hash_algo="sha257")
    with pytest.raises(ValueError, match="hash_algo 'sha257' is unsupported"):
        DataConfig(data_source="dedup_local", dataset_path="x.txt", hash_algo="sha257")


def _hex_file(path: Path, texts: list[str], digest=lambda t: hashlib.sha256(normalize(t).encode()).hexdigest()):
    path.write_text("".join(digest(t) + "  \n\n" for t in texts))  # trailing spaces and blank lines
    return path


def test_the_frameworks_hex_file_is_read_and_left_byte_identical(tmp_path):
    seen = _hex_file(tmp_path / "seen.txt", ["gamma", "delta"])
    before = seen.read_bytes()
    src = source(corpus(tmp_path), seen, write=False)
    assert list(src.iter_texts()) == ["alpha beta", "epsilon"]
    assert seen.read_bytes() == before
    # with writing on, appends stay in the framework's layout, so it can still read the file
    writer = source(corpus(tmp_path), seen, write=True)
    assert list(writer.iter_texts()) == ["alpha beta", "epsilon"]
    lines = [line.strip() for line in seen.read_text().splitlines() if line.strip()]
    assert lines == [_sha256_line(t) for t in ["gamma", "delta", "alpha beta", "epsilon"]]  # full length, not cut
    assert source(corpus(tmp_path), seen, write=False).committed_count == 4


def test_reset_cross_run_seen_forgets_earlier_runs_and_keeps_the_in_pass_dedup(tmp_path):
    seen = _hex_file(tmp_path / "seen.txt", ["gamma", "delta"])
    before = seen.read_bytes()
    src = source(corpus(tmp_path), seen, write=False)
    passing = src.iter_texts()
    assert next(passing) == "alpha beta"
    src.reset_cross_run_seen()
    assert list(passing) == ["epsilon"]  # the pass in progress keeps its sets
    assert list(src.iter_texts()) == UNIQUE  # the file's records are back, repeats within the pass still dropped
    assert seen.read_bytes() == before and src.committed_count == 2


def test_a_read_only_legacy_file_is_never_truncated(tmp_path):
    seen = tmp_path / "legacy.bin"
    seen.write_bytes(text_digest("gamma") + text_digest("delta") + b"\x07" * 5)  # a torn last digest
    before = seen.read_bytes()
    src = source(corpus(tmp_path), seen, write=False)
    assert list(src.iter_texts()) == ["alpha beta", "epsilon"]
    assert seen.read_bytes() == before


def test_a_state_for_a_read_only_file_reads_only_its_count(tmp_path):
    seen = tmp_path / "seen.bin"
    source(corpus(tmp_path, ["gamma", "delta", "zeta"], "old.txt"), seen, write=True).iter_texts().__next__()
    list(source(corpus(tmp_path, ["delta", "zeta"], "old2.txt"), seen, write=True).iter_texts())
    before = seen.read_bytes()
    reader = source(corpus(tmp_path), seen, write=False)
    reader.load_committed(1)  # a state that covered only the first commit
    assert seen.read_bytes() == before and reader.committed_count == 1
    assert list(reader.iter_texts()) == ["alpha beta", "delta", "epsilon"]


def _v2_file(path: Path, commits: list[list[str]], algo: str = "sha256") -> Path:
    """A seen-hashes file in our binary layout (v2), one block per commit."""
    from llm.data.inputs.seen_file import _HEADER, MAGIC, VERSION, encode

    blocks = [encode("v2", b"".join(text_digest(t, algo) for t in texts), 16) for texts in commits]
    path.write_bytes(_HEADER.pack(MAGIC, VERSION, 16, algo.encode()) + b"".join(blocks))
    return path


@pytest.mark.parametrize(
    "damage, message",
    [
        ("algo", "was written with hash_algo 'sha256', not 'md5'"),
        ("flip", "fails its checksum"),
        ("text", "is text but not one hex digest per line"),
        ("short line", "line 1 is not a hex digest of 32 or 64 characters"),
    ],
)
def test_damaged_or_foreign_files_are_named(tmp_path, damage, message):
    seen = _v2_file(tmp_path / "seen.bin", [["gamma", "delta"]])
    if damage == "flip":
        data = bytearray(seen.read_bytes())
        data[-3] ^= 0xFF
        seen.write_bytes(bytes(data))
    if damage == "text":
        seen.write_text("this is a diary, not a seen-hashes file\nmore words\n")
    if damage == "short line":
        seen.write_text("ab" * 20 + "\n" + hashlib.sha256(b"gamma").hexdigest() + "\n")
    algo = "md5" if damage == "algo" else "sha256"
    with pytest.raises(SeenFileError, match=message) as info:
        DedupTextSource(LocalLineTextSource(corpus(tmp_path)), algo, seen, write_seen_hashes=True)
    assert str(seen) in str(info.value)


def test_a_torn_block_of_the_binary_layout_is_ignored_and_cut_by_the_next_writer(tmp_path):
    seen = _v2_file(tmp_path / "seen.bin", [["gamma"]])
    good = seen.stat().st_size
    with open(seen, "ab") as f:
        f.write(b"\x05\x00\x00\x00" + b"\x01" * 30)  # a block that announces 5 digests, holds 1.9
    assert read_seen_file(seen, "sha256").count == 1
    list(source(corpus(tmp_path, ["delta"], "b.txt"), seen, write=True).iter_texts())
    parsed = read_seen_file(seen, "sha256")
    assert parsed.layout == "v2" and parsed.count == 2 and seen.stat().st_size == good + 12 + 16


def _sha256_line(text: str) -> str:
    return hashlib.sha256(normalize(text).encode()).hexdigest()


def test_a_new_seen_file_is_the_guides_full_length_hex_lines(tmp_path):
    seen = tmp_path / "checkpoints" / "c4_seen_hashes.txt"
    assert list(source(corpus(tmp_path), seen, write=True).iter_texts()) == UNIQUE
    assert seen.read_text() == "".join(_sha256_line(t) + "\n" for t in UNIQUE)
    xxh = tmp_path / "xxh.txt"
    list(source(corpus(tmp_path), xxh, write=True, hash_algo="xxh3_128").iter_texts())
    assert [len(line) for line in xxh.read_text().splitlines()] == [32] * 4


@pytest.mark.parametrize("torn", ["no newline", "wrong length"])
def test_a_torn_last_line_is_never_a_digest_and_the_next_writer_cuts_it(tmp_path, torn):
    seen = tmp_path / "seen.txt"
    whole = _sha256_line("gamma") + "\n"
    # a crash mid-append: the next line cut inside (its first 32 characters would even pass as a digest)
    tail = _sha256_line("delta")[:40] + ("" if torn == "no newline" else "\n")
    seen.write_text(whole + tail)
    assert read_seen_file(seen, "sha256", 32).count == 1
    assert list(source(corpus(tmp_path), seen, write=False).iter_texts()) == ["alpha beta", "delta", "epsilon"]
    list(source(corpus(tmp_path, ["zeta"], "z.txt"), seen, write=True).iter_texts())
    assert seen.read_text() == whole + _sha256_line("zeta") + "\n"


def test_a_binary_file_of_the_old_layouts_keeps_working(tmp_path):
    v2 = _v2_file(tmp_path / "seen.bin", [["gamma"], ["delta"]])
    assert list(source(corpus(tmp_path), v2, write=True).iter_texts()) == ["alpha beta", "epsilon"]
    parsed = read_seen_file(v2, "sha256")
    assert parsed.layout == "v2" and parsed.count == 4  # appended as a block of its own layout
    raw = tmp_path / "raw.bin"
    raw.write_bytes(text_digest("gamma"))
    assert list(source(corpus(tmp_path), raw, write=True).iter_texts()) == ["alpha beta", "delta", "epsilon"]
    assert raw.read_bytes() == b"".join(text_digest(t) for t in ["gamma", "alpha beta", "delta", "epsilon"])


def _module(path, seen, workers=0):
    data = DataConfig(data_source="dedup_local", dataset_path=str(path), max_seq_len=16, num_workers=workers,
                      seen_hashes_path=str(seen), write_seen_hashes=True, steps_per_epoch=5)
    return StreamingTextDataModule(data, batch_size=2)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_run_whose_every_record_was_seen_says_so(tmp_path, workers):
    path = corpus(tmp_path)
    seen = tmp_path / "seen.bin"
    list(source(path, seen, write=True).iter_texts())
    module = _module(path, seen, workers)
    with pytest.raises(ValueError, match=rf"^all 6 records are in the seen-hashes file {seen}; nothing is left to train on"):
        list(module.train_dataloader())


def test_a_second_pass_of_a_dedup_stream_says_it_was_consumed(tmp_path):
    data = DataConfig(data_source="dedup_local", dataset_path=str(corpus(tmp_path)), max_seq_len=8,
                      seen_hashes_path=str(tmp_path / "seen.bin"), write_seen_hashes=True, steps_per_epoch=50)
    module = StreamingTextDataModule(data, batch_size=2)
    with pytest.raises(ValueError, match=r"^all 6 records were consumed earlier in this run"):
        list(module.train_dataloader())


def _append_many(path: str, tag: int) -> None:
    from llm.data.inputs.seen_file import append_digests

    for k in range(40):
        append_digests(path, text_digest(f"writer {tag} commit {k} a") + text_digest(f"writer {tag} commit {k} b"), "sha256")


def test_two_writers_of_one_seen_file_lose_no_commit(tmp_path):
    import multiprocessing

    seen = tmp_path / "seen.bin"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(str(seen), t)) for t in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    lines = seen.read_text().split("\n")
    assert lines[-1] == "" and len(lines) == 2 * 40 * 2 + 1  # every line whole, none cut
    assert all(len(line) == 32 for line in lines[:-1]) and read_seen_file(seen, "sha256").count == 160
