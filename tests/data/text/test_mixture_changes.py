"""Sources added to or removed from a text mixture on resume (`data.mixture_changes: allow`, issue 35).

Rows never mix partitions and each file is one partition with its own letters
(`test_elastic.py`), so every partition's rows are a fixed sequence whatever the mixing:
kept sources must continue theirs exactly, a new source must start at its beginning, a
removed one stops, and nothing is lost or repeated.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from llm.data.stage import StateError
from llm.data.text.stream import StreamingTextDataModule
from tests.data.text.test_elastic import corpora, data_config, partition_of, rows, run
from tests.resume import check_refused_state_changes_nothing, take_steps

ALLOW = {"mixture_changes": "allow"}


def by_partition(steps: list[dict]) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = defaultdict(list)
    for step in steps:
        for row in rows(step):
            out[partition_of(row)].append(row)
    return out


def chain(first: dict, steps: int, second: dict) -> tuple[list[dict], list[dict], dict]:
    head, state = run(first, None, steps)
    tail, after = run(second, state, None)
    return head, tail, after


def test_without_the_option_another_source_list_is_refused_naming_it(tmp_path):
    paths = corpora(tmp_path)
    _, state = run({"paths": paths, "batch": 8}, None, 4)
    three = StreamingTextDataModule(data_config({"paths": paths, "sources": ["short", "long", "extra"]}), 8, loop=False)
    with pytest.raises(StateError, match=r"^stream source fingerprint mismatch: the mixture's sources changed \(2 saved, "
                                         r"3 now, or other data\); set data.mixture_changes: allow to add or remove "
                                         r"sources on resume"):
        three.load_state_dict(state)


@pytest.mark.parametrize("topology", [{}, {"world": 2, "workers": 2}])
def test_an_added_source_starts_at_its_beginning_and_the_kept_ones_continue(tmp_path, topology):
    paths = corpora(tmp_path)
    first = {"paths": paths, "batch": 8, **topology}
    second = {"paths": paths, "batch": 4, "sources": ["short", "long", "extra"], "extra": ALLOW}
    head, tail, after = chain(first, 6, second)
    straight, _ = run({"paths": paths, "batch": 8, "sources": ["short", "long", "extra"]}, None, None)
    got, want = by_partition(head + tail), by_partition(straight)
    assert got == want  # every partition whole and in its own order: nothing lost, repeated or skipped
    assert set(by_partition(head)) <= set(range(8)) and {8, 9} <= set(by_partition(tail))
    # the new source's shares count from the resume: it does not "pay back" the steps it missed
    first_rows = [partition_of(r) >= 8 for step in tail[:10] for r in rows(step)]
    assert 0.1 < sum(first_rows) / len(first_rows) < 0.6
    assert set(after["consumed"]["0"]) == {"short", "long", "extra"}


def test_a_removed_source_stops_and_keeps_its_counts(tmp_path):
    paths = corpora(tmp_path)
    three = {"paths": paths, "batch": 8, "sources": ["short", "long", "extra"]}
    head, tail, after = chain(three, 6, {"paths": paths, "batch": 12, "sources": ["short", "long"], "extra": ALLOW})
    straight = by_partition(run(three, None, None)[0])
    got = by_partition(head + tail)
    assert all(got[p] == straight[p] for p in range(8))  # the kept sources: whole, in order
    for p in (8, 9):  # the removed one: what it gave before the resume, nothing after
        assert got[p] == straight[p][: len(got[p])] and not any(partition_of(r) == p for s in tail for r in rows(s))
    extra_rows = sum(1 for s in head for r in rows(s) if partition_of(r) >= 8)
    assert after["consumed"]["0"]["extra"][1] == extra_rows > 0  # still in the per-source accounting


def test_a_single_source_may_become_a_mixture(tmp_path):
    paths = corpora(tmp_path)
    # matched by name: a single source is named by its path's stem, here '*' (of short/*.txt)
    head, tail, _ = chain({"paths": paths, "batch": 8, "sources": ["short"]}, 5,
                          {"paths": paths, "batch": 8, "sources": ["short", "long"], "names": {"short": "*"},
                           "extra": ALLOW})
    straight = by_partition(run({"paths": paths, "batch": 8}, None, None)[0])
    assert by_partition(head + tail) == straight


@pytest.mark.parametrize("entries, message", [
    ([("short", "short"), ("long", "long"), ("extra", "long")],
     r"^datasets\[2\] has the name 'long', like datasets\[1\]; give each source its own name"),
    ([("short", "short"), ("extra", "long")],
     r"^datasets\[1\] \('long'\) holds other data than the source of that name in the data state; give the changed "
     r"data a new name \(it then starts at its beginning\), or resume with the data the state was saved with$"),
    ([("short", "short"), ("long", "books"), ("extra", "extra")],
     r"^datasets\[1\] \('books'\) holds the data of 'long' in the data state under another name; name it 'long' to "
     r"continue it, or leave it out$"),
])
def test_an_ambiguous_source_is_refused_in_one_sentence_naming_it(tmp_path, entries, message):
    paths = corpora(tmp_path)
    _, state = run({"paths": paths, "batch": 8}, None, 4)
    data = data_config({"paths": paths, "sources": [path for path, _ in entries], "extra": ALLOW})
    data = data.model_copy(update={"datasets": [e.model_copy(update={"name": name})
                                                for e, (_, name) in zip(data.datasets, entries)]})
    with pytest.raises(StateError, match=message):
        StreamingTextDataModule(data, 8, loop=False).load_state_dict(state)


def test_a_state_that_does_not_name_its_sources_cannot_be_matched(tmp_path):
    paths = corpora(tmp_path)
    _, state = run({"paths": paths, "batch": 8}, None, 4)
    old = {**{k: v for k, v in state.items() if k != "sources"}, "version": 2}
    three = StreamingTextDataModule(data_config({"paths": paths, "sources": ["short", "long", "extra"], "extra": ALLOW}),
                                    8, loop=False)
    with pytest.raises(StateError, match=r"^the data state \(version 2\) does not name its sources, so mixture_changes: "
                                         r"allow cannot match them"):
        three.load_state_dict(old)


def test_mixture_changes_is_checked_in_the_config(tmp_path):
    with pytest.raises(ValueError, match="mixture_changes 'sometimes' is not known; use allow"):
        data_config({"paths": corpora(tmp_path), "extra": {"mixture_changes": "sometimes"}})


def test_the_kept_rows_count_as_the_straight_runs(tmp_path):
    """The per-source accounting after an added source: each kept source's rows once, the new one's from zero."""
    paths = corpora(tmp_path)
    head, tail, after = chain({"paths": paths, "batch": 8}, 6,
                              {"paths": paths, "batch": 8, "sources": ["short", "long", "extra"], "extra": ALLOW})
    counted = Counter("short" if p < 4 else "long" if p < 8 else "extra"
                      for s in head + tail for p in map(partition_of, rows(s)))
    assert {k: v[1] for k, v in after["consumed"]["0"].items()} == dict(counted)


def test_a_state_taken_right_after_a_change_of_sources_resumes(tmp_path):
    paths = corpora(tmp_path)
    _, state = run({"paths": paths, "batch": 8}, None, 4)
    three = {"paths": paths, "batch": 8, "sources": ["short", "long", "extra"], "extra": ALLOW}
    module = StreamingTextDataModule(data_config(three), 8, loop=False)
    module.load_state_dict(state)
    again = StreamingTextDataModule(data_config(three), 8, loop=False)
    again.load_state_dict(module.state_dict())  # its segment and anchors are whole: the shares start at the resume
    assert again.state_dict()["mix"]["anchors"] == module.state_dict()["mix"]["anchors"] != {}


def test_a_refused_source_change_changes_nothing(tmp_path):
    paths = corpora(tmp_path)
    _, state = run({"paths": paths, "batch": 8}, None, 4)
    swapped = {"paths": paths, "sources": ["short", "extra"], "names": {"extra": "long"}, "extra": ALLOW}
    check_refused_state_changes_nothing(StreamingTextDataModule(data_config(swapped), 8, loop=False), state,
                                        lambda m: take_steps(m.train_dataloader(), 12),
                                        StreamingTextDataModule(data_config(swapped), 8, loop=False))


@pytest.mark.filterwarnings("ignore:DedupTextSource is running with in-memory only state")
def test_a_deduplicated_mixture_may_gain_a_source(tmp_path):
    paths = corpora(tmp_path)

    def module(sources: list[str], **extra: object) -> StreamingTextDataModule:
        data = data_config({"paths": paths, "sources": sources, "extra": extra})
        entries = [e.model_copy(update={"data_source": "dedup_local"}) for e in data.datasets]
        return StreamingTextDataModule(data.model_copy(update={"datasets": entries}), 8, loop=False)

    first = module(["short", "long"])
    head = take_steps(first.train_dataloader(), 5)
    grown = module(["short", "long", "extra"], **ALLOW)
    grown.load_state_dict(first.state_dict())
    tail = take_steps(grown.train_dataloader())
    assert by_partition(head + tail) == by_partition(take_steps(module(["short", "long", "extra"]).train_dataloader()))


def test_a_mixture_may_become_a_single_source(tmp_path):
    paths = corpora(tmp_path)
    two = {"paths": paths, "batch": 8, "names": {"short": "*"}}  # the single source's name: its path's stem
    head, tail, after = chain(two, 5, {"paths": paths, "batch": 8, "sources": ["short"], "extra": ALLOW})
    got, straight = by_partition(head + tail), by_partition(run(two, None, None)[0])
    assert all(got[p] == straight[p] for p in range(4))  # short: whole, in order
    assert all(got[p] == straight[p][: len(got[p])] for p in range(4, 8))  # long: what it gave, then no more
    assert set(after["consumed"]["0"]) == {"*", "long"}
