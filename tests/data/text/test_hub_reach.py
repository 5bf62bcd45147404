"""An unreachable hub fails at once (one probe, no retry loop, load_dataset never called), naming the local twin."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

pytest.importorskip("datasets")

import datasets.config  # noqa: E402
import huggingface_hub.constants  # noqa: E402

from llm.data.inputs import hub_reach  # noqa: E402
from llm.data.inputs.hub_reach import HubUnreachable, is_hub_dataset  # noqa: E402
from llm.data.sources import HFStreamTextSource, build_text_source  # noqa: E402
from llm.training.core.config import DataConfig  # noqa: E402
from tests.hub import closed_port, watch_hub  # noqa: E402


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> dict:
    """Counters of hub probes and load_dataset calls (tests/hub.py)."""
    return watch_hub(monkeypatch)


def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{closed_port()}")


@pytest.mark.parametrize(("cut", "why", "probes"), [(offline, "(HF_HUB_OFFLINE is set)", 0),
                                                    (refused, "Connection refused", 1)])
@pytest.mark.parametrize(("source", "twin"), [
    ("hf", "set data_source: local with dataset_path: a local .jsonl, .txt or .parquet file or folder, or keep "
           "data_source: hf with dataset_name: json and dataset_path: your .jsonl files"),
    ("dedup_hf", "set data_source: dedup_local with dataset_path: a local .jsonl, .txt or .parquet file or "
                 "folder, or keep data_source: dedup_hf with dataset_name: json and dataset_path: your .jsonl files"),
])
def test_an_unreachable_hub_fails_at_once_naming_the_twin(hub, monkeypatch, tmp_path, cut, why, probes, source, twin):
    cut(monkeypatch)
    cfg = DataConfig(data_source=source, dataset_name="allenai/c4", dataset_config="en", steps_per_epoch=2,
                     seen_hashes_path=str(tmp_path / "seen"), write_seen_hashes=True)
    built = build_text_source(cfg)  # lazy: nothing is asked yet
    with pytest.raises(HubUnreachable) as err:
        built.partitions()
    message = str(err.value)
    assert message.startswith("allenai/c4 is a Hugging Face hub dataset and the hub cannot be reached")
    assert why in message and twin in message and "configs/streaming_c4_local.yaml" in message
    assert "\n" not in message
    assert hub == {"probe": probes, "load_dataset": 0}  # one request at most, never datasets' retry loop
    with pytest.raises(HubUnreachable):  # a failure is not remembered: the next open asks again
        built.partitions()
    assert hub["probe"] == 2 * probes


def test_the_sft_twin_is_written_in_datasets_keys(hub, monkeypatch):
    offline(monkeypatch)
    source = HFStreamTextSource("tatsu-lab/alpaca", text_column=None, twin="sft")
    with pytest.raises(HubUnreachable, match=r"set datasets: - path: a local \.jsonl file of the same records, "
                                             r"with the same type \(configs/sft_local_demo\.yaml does so\)$"):
        list(source.iter_texts())


class _NotFound(BaseHTTPRequestHandler):
    def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_any_http_answer_means_the_hub_is_there(hub, monkeypatch):
    server = HTTPServer(("127.0.0.1", 0), _NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        source = HFStreamTextSource("org/corpus")
        with pytest.raises(AssertionError, match="load_dataset must not run"):  # reached: datasets takes over
            source.partitions()
        with pytest.raises(AssertionError, match="load_dataset must not run"):
            source.partitions()
    finally:
        server.shutdown()
        server.server_close()
    assert hub == {"probe": 1, "load_dataset": 2}  # an endpoint that answered is asked once per process


def test_builders_and_local_paths_never_ask_the_hub(hub, monkeypatch, tmp_path):
    offline(monkeypatch)
    assert not is_hub_dataset("json") and not is_hub_dataset("parquet") and not is_hub_dataset(str(tmp_path))
    assert is_hub_dataset("allenai/c4") and is_hub_dataset(str(tmp_path / "missing"))
    monkeypatch.undo()  # the real load_dataset: json over a local file works offline
    data = tmp_path / "a.jsonl"
    data.write_text('{"text": "one"}\n{"text": "two"}\n')
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    source = HFStreamTextSource("json", data_files=str(data))
    assert list(source.iter_texts()) == ["one", "two"]


def test_the_twin_config_named_in_the_sentence_exists():
    repo = Path(__file__).resolve().parents[3]
    for twin in hub_reach.LOCAL_TWIN.values():
        named = twin.split("(", 1)[1].split(" ", 1)[0]
        assert (repo / named).is_file(), named


def test_a_mixture_entry_names_the_twin_of_its_own_source(hub, monkeypatch, tmp_path):
    offline(monkeypatch)
    local = tmp_path / "local.txt"
    local.write_text("one\n")
    cfg = DataConfig(datasets=[{"data_source": "local", "dataset_path": str(local)},
                               {"data_source": "dedup_hf", "dataset_name": "allenai/c4", "dataset_config": "en"}],
                     steps_per_epoch=2)
    with pytest.warns(UserWarning, match="in-memory only"):
        source = build_text_source(cfg)
    with pytest.raises(HubUnreachable, match="set data_source: dedup_local with dataset_path: .* keep "
                                             "data_source: dedup_hf with dataset_name: json"):
        source.partitions()
    assert hub["load_dataset"] == 0


def test_datasets_own_offline_switch_is_named(hub, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # what HF_DATASETS_OFFLINE=1 sets
    with pytest.raises(HubUnreachable, match=r"cannot be reached \(HF_DATASETS_OFFLINE is set\)"):
        HFStreamTextSource("allenai/c4", "en").partitions()
    assert hub == {"probe": 0, "load_dataset": 0}
