"""Whether the Hugging Face hub can be reached, asked once before a hub dataset opens: no retry loop.

`datasets.load_dataset` retries an unreachable hub for half a minute and more (1 + 2 + 4
+ 8 + 8 s of back-off per file) before it says so. One request through the hub
library's own session (its proxies and endpoint) tells the same thing at once: any
HTTP answer, even 401 or 404, means the hub is there (`datasets` then says what is
wrong); a refused or failed connection, an unknown host or a timeout means it is
not. `HF_HUB_OFFLINE=1` (or `HF_DATASETS_OFFLINE=1`) is not reachable either: a hub
dataset cannot be streamed from the local cache. Either way the error is one
sentence naming the keys of the local twin to set instead.
"""

from __future__ import annotations

from pathlib import Path

from llm.data.inputs.errors import InputError, one_line

_answered: set[str] = set()  # endpoints that answered in this process (a failure is asked again next time)

# The local twin of a hub dataset, by where its keys were written (HFStreamTextSource's `twin`).
LOCAL_TWIN = {
    "local": "data_source: local with dataset_path: a local .jsonl, .txt or .parquet file or folder, or keep "
             "data_source: hf with dataset_name: json and dataset_path: your .jsonl files "
             "(configs/streaming_c4_local.yaml does so on make demo's corpus)",
    "dedup_local": "data_source: dedup_local with dataset_path: a local .jsonl, .txt or .parquet file or folder, "
                   "or keep data_source: dedup_hf with dataset_name: json and dataset_path: your .jsonl files "
                   "(configs/streaming_c4_local.yaml does so on make demo's corpus)",
    "pretraining_dataset": "pretraining_dataset: - path: a local .jsonl, .txt or .parquet file or folder "
                           "(configs/axolotl_pretrain_demo.yaml does so)",
    "sft": "datasets: - path: a local .jsonl file of the same records, with the same type "
           "(configs/sft_local_demo.yaml does so)",
}


class HubUnreachable(InputError):
    """A hub dataset was asked for and the hub cannot be reached; the message names the local twin."""

    def __init__(self, dataset_name: str, why: str, twin: str = "local"):
        self.dataset_name, self.why, self.twin = dataset_name, why, twin
        super().__init__(self.sentence(twin))

    def __reduce__(self) -> tuple:  # rebuilt from its parts when it crosses from a DataLoader worker
        return type(self), (self.dataset_name, self.why, self.twin)

    def sentence(self, twin: str) -> str:
        """The error with the twin written in `twin`'s keys (a key of LOCAL_TWIN)."""
        return (f"{self.dataset_name} is a Hugging Face hub dataset and the hub cannot be reached ({self.why}); "
                f"to train on local files instead, set {LOCAL_TWIN.get(twin, LOCAL_TWIN['local'])}")


def is_hub_dataset(dataset_name: str) -> bool:
    """Whether `load_dataset(dataset_name)` would go to the hub: not a builder (json, text, ...) nor a local path."""
    try:  # the builders of the installed `datasets` (a private name: the common ones below if it moves)
        from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES as builders
    except ImportError:
        builders = ("json", "text", "csv", "parquet", "arrow", "pandas", "webdataset", "imagefolder", "audiofolder")
    return dataset_name not in builders and not Path(dataset_name).expanduser().exists()


def hub_unreachable_reason() -> str | None:
    """Why the hub cannot be reached (offline mode, or the first request failing), or None when it answers."""
    import datasets.config
    import huggingface_hub.constants as hub

    if hub.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    if datasets.config.HF_HUB_OFFLINE:  # datasets' own switch, read from HF_DATASETS_OFFLINE
        return "HF_DATASETS_OFFLINE is set"
    endpoint = hub.ENDPOINT.rstrip("/")
    if endpoint in _answered:
        return None
    why = _probe(endpoint, float(hub.HF_HUB_ETAG_TIMEOUT))
    if why is None:
        _answered.add(endpoint)
    return why


def _probe(endpoint: str, timeout: float) -> str | None:
    """One HEAD request, no retries; `timeout` is the hub library's own for a first request."""
    from huggingface_hub.utils import get_session

    try:
        get_session().head(f"{endpoint}/", timeout=timeout)  # the site itself: any mirror answers there
    except Exception as exc:  # noqa: BLE001 - the transport's errors differ by HTTP backend (httpx, requests)
        return f"connecting to {endpoint} failed: {one_line(exc)}"
    return None  # any answer, error statuses included: the hub is there


def check_hub_reachable(dataset_name: str, twin: str = "local") -> None:
    """Raise `HubUnreachable` at once when `dataset_name` is on the hub and the hub cannot be reached."""
    if not is_hub_dataset(dataset_name):
        return
    why = hub_unreachable_reason()
    if why is not None:
        raise HubUnreachable(dataset_name, why, twin)
