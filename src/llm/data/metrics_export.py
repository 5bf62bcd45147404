"""Ingest figures served for Prometheus: `StreamingDataLoader(metrics_port=)` and `llm-train`'s `logging.prometheus_port`.

The standard `prometheus_client` library (the `metrics` extra) writes the text format and serves
it from a daemon thread. Nothing is counted per batch for it: a scrape calls the owner's figures
(`StreamingDataLoader.stats()`, or `llm-train`'s own window) through a custom collector, so a
loader that nobody scrapes costs nothing more than `stats()` already does.

Series (each with the label `rank`, this process's global rank):

* `llm_data_batches_total`, `llm_data_tokens_total` (token data only);
* `llm_data_wait_seconds`: a summary, quantiles 0.5, 0.95 and 0.99 (the p50/p95/p99 of `stats()`,
  within 6%), `_sum` (total wait) and `_count` (batches);
* `llm_data_remote_bytes_total`, `llm_data_remote_requests_total`, `llm_data_cache_hits_total`,
  `llm_data_cache_misses_total`, `llm_data_cache_evictions_total`;
* per source (label `source`): `llm_data_source_tokens_total`, `llm_data_source_samples_total` (the
  whole job's, the same on every rank), and, when the source is read in this process,
  `llm_data_source_remote_bytes_total` and the other remote counts of its own shard cache.

Counters start over when their window does (`stats(reset=True)`); Prometheus's `rate()` treats
that as a counter reset. docs/reliability.md ("Metrics a cluster can scrape") has the details.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

from llm.data.ingest_stats import PERCENTILES, REMOTE_KEYS
from llm.data.topology import current_topology

# 0.0.0.0: the point of the port is that a cluster's scraper (on another machine) reads it; the
# figures are counts and timings, nothing of the data itself. metrics_host="127.0.0.1" keeps it local.
DEFAULT_HOST = "0.0.0.0"
PREFIX = "llm_data"
Figures = Mapping[str, Any]
Sources = Mapping[str, Mapping[str, int]]


class MetricsPortError(OSError):
    """The metrics port cannot be served: in use, not allowed, or a host that is not this machine's."""


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ImportError("metrics_port needs the prometheus_client library: pip install "
                          "'llm-stream-data[metrics]' (or pip install prometheus_client)") from None
    return prometheus_client


def port_for_process(port: int, key: str = "metrics_port") -> tuple[int, str]:
    """(`port` + LOCAL_RANK under torchrun, so the processes of one machine each get their own, 0 staying 0: a free
    one; how an error names it)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"{key} must be an integer from 0 to 65535 (0: a free port), got {port!r}")
    raw = os.environ.get("LOCAL_RANK", "0") or "0"
    if not raw.isdigit():
        raise ValueError(f"LOCAL_RANK is {raw!r}, not a whole number >= 0; {key} is offset by it under torchrun")
    local = int(raw)
    if not port or not local:
        return port, f"{key} {port}"
    if port + local > 65535:
        raise ValueError(f"{key} {port} + local rank {local} is past 65535; pick a lower port")
    return port + local, f"{key} {port} + local rank {local} = port {port + local}"


def families(figures: Figures, sources: Sources, labels: Mapping[str, str]) -> list[Any]:
    """The metric families of one set of figures (`stats()`'s keys) and per-source counts."""
    from prometheus_client.core import CounterMetricFamily, SummaryMetricFamily

    names, values = list(labels), list(labels.values())

    def counter(name: str, doc: str, value: Any, extra: Mapping[str, str] | None = None) -> Any:
        family = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=names + list(extra or {}))
        family.add_metric(values + list((extra or {}).values()), float(value))
        return family

    out = [counter("batches", "Batches handed to the training loop.", figures["batches"])]
    if figures.get("tokens") is not None:
        out.append(counter("tokens", "Tokens in the batches handed to the training loop.", figures["tokens"]))
    wait = SummaryMetricFamily(f"{PREFIX}_wait_seconds", "How long the training loop waited for each batch "
                               "(quantiles within 6%).", labels=names)
    for q in PERCENTILES:
        ms = figures.get(f"wait_p{q}_ms")
        if ms is not None:  # none before the first batch
            wait.add_sample(f"{PREFIX}_wait_seconds", {**labels, "quantile": str(q / 100)}, ms / 1000)
    wait.add_metric(values, figures["batches"], figures["wait_s"])
    out.append(wait)
    for key in REMOTE_KEYS:
        out.append(counter(key, _REMOTE_DOCS[key], figures.get(key) or 0))
    out += _source_families(sources, names, values)
    return out


_REMOTE_DOCS = {
    "remote_bytes": "Bytes downloaded from object storage.",
    "remote_requests": "Shard requests (GETs) sent to object storage.",
    "cache_hits": "Shard reads served from the local cache.",
    "cache_misses": "Shard reads that had to download the shard.",
    "cache_evictions": "Shards removed from the local cache to make room.",
}
_SOURCE_DOCS = {"tokens": "Tokens handed out from each source, all ranks together.",
                "samples": "Samples handed out from each source, all ranks together.",
                **{key: f"{doc[:-1]}, this source's cache in this process." for key, doc in _REMOTE_DOCS.items()}}


def _source_families(sources: Sources, names: list[str], values: list[str]) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily

    for key, doc in _SOURCE_DOCS.items():
        rows = [(name, counts[key]) for name, counts in sources.items() if counts.get(key) is not None]
        if rows:
            family = CounterMetricFamily(f"{PREFIX}_source_{key}", doc, labels=[*names, "source"])
            for name, value in rows:
                family.add_metric([*values, name], float(value))
            yield family


class _Collector:
    """Reads the owner's figures at scrape time; the owner is held weakly, so serving never keeps it alive."""

    def __init__(self, owner: Any, labels: Mapping[str, str]):
        self._owner = weakref.ref(owner)
        self._labels = dict(labels)

    def describe(self) -> list[Any]:
        return []  # no figures are read at registration: only a scrape reads them

    def collect(self) -> list[Any]:
        owner = self._owner()
        if owner is None:
            return []
        return families(owner._metrics_figures(), owner._metrics_sources(), self._labels)


class MetricsServer:
    """An HTTP endpoint serving `/metrics` for one owner (a loader, or llm-train's figures) until closed."""

    def __init__(self, owner: Any, port: int, host: str = DEFAULT_HOST, what: str = "",
                 labels: Mapping[str, str] | None = None):
        """`owner` gives `_metrics_figures()` and `_metrics_sources()`; `port` as given (0: a free one); `what`:
        how an error names the port (`port_for_process`'s)."""
        what = what or f"metrics_port {port}"
        client = _client()
        if not isinstance(host, str) or not host:
            raise ValueError(f"the host for {what} must be an address such as 0.0.0.0 or 127.0.0.1, got {host!r}")
        registry = client.CollectorRegistry(auto_describe=False)
        registry.register(_Collector(owner, labels if labels is not None else {"rank": str(current_topology()[0])}))
        try:
            self._httpd, self._thread = client.start_http_server(port, addr=host, registry=registry)
        except OSError as e:
            raise MetricsPortError(_bind_error(e, what, host)) from None
        self.host, self.port = host, int(self._httpd.server_port)
        self._close = weakref.finalize(owner, _stop, self._httpd, self._thread)

    @property
    def url(self) -> str:
        """http://HOST:PORT/metrics, a wildcard host shown as this machine's name."""
        host = socket.gethostname() if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and free the port (also done when the owner is garbage-collected)."""
        self._close()


def _stop(httpd: Any, thread: threading.Thread) -> None:
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


def _bind_error(e: OSError, what: str, host: str) -> str:
    if e.errno == errno.EADDRINUSE:
        return f"{what} is in use on {host} (something already listens there); pick another port, or 0 for a free one"
    if e.errno == errno.EACCES:
        return f"{what} on {host} is not allowed for this user (ports below 1024 need privileges); pick one from 1024"
    if isinstance(e, socket.gaierror) or e.errno == errno.EADDRNOTAVAIL:
        return f"{what}: host {host!r} is not an address of this machine; use 0.0.0.0 (all) or 127.0.0.1 (this one only)"
    return f"{what} on {host} cannot be served: {e.strerror or e}"


class LoaderMetrics:
    """StreamingDataLoader's side: `metrics_port=` serves `stats()` and the per-source counts."""

    metrics_server: MetricsServer | None = None

    def serve_metrics(self, port: int | None, host: str = DEFAULT_HOST) -> None:
        """Serve this loader's figures on `port` (+ LOCAL_RANK under torchrun; 0: a free one, see `metrics_url`)."""
        if port is None:
            return
        self.close_metrics()
        port, what = port_for_process(port)
        self.metrics_server = MetricsServer(self, port, host, what)

    @property
    def metrics_url(self) -> str | None:
        """Where this loader's metrics are served (None: not served)."""
        return self.metrics_server.url if self.metrics_server is not None else None

    def close_metrics(self) -> None:
        """Stop serving metrics and free the port."""
        if self.metrics_server is not None:
            self.metrics_server.close()
            self.metrics_server = None

    def _metrics_figures(self) -> Figures:
        return self.stats()  # type: ignore[attr-defined]

    def _metrics_sources(self) -> dict[str, dict[str, int]]:
        counts = self.source_counts()  # type: ignore[attr-defined]
        for _ in range(3):  # the loop moves its cursor in several steps (an epoch's end): read until two reads agree
            again = self.source_counts()  # type: ignore[attr-defined]
            if again == counts:
                break
            counts = again
        counts = {name: dict(c) for name, c in counts.items()}
        if self.num_workers:  # type: ignore[attr-defined]
            return counts  # worker processes' remote counts arrive summed over sources: only the totals have them
        for name, remote in self.dataset.remote_counters_by_source().items():  # type: ignore[attr-defined]
            counts.setdefault(name, {}).update(remote)
        return counts
