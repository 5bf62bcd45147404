"""Read a metrics endpoint as Prometheus would: an HTTP GET on loopback, parsed by prometheus_client's own parser."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str, rank: str | None = None) -> dict[tuple[str, frozenset], float]:
    """{(sample name, its labels but `rank`): value} of one scrape; every sample carries a `rank` label (`rank`: this one)."""
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode("utf-8")
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            assert "rank" in labels and rank in (None, labels["rank"]), sample
            del labels["rank"]
            out[sample.name, frozenset(labels.items())] = sample.value
    return out


def value(samples: dict[tuple[str, frozenset], float], name: str, **labels: str) -> float:
    return samples[name, frozenset(labels.items())]


def by_source(samples: dict[tuple[str, frozenset], float], name: str) -> dict[str, float]:
    """{source: value} of a per-source series."""
    return {dict(labels)["source"]: v for (n, labels), v in samples.items() if n == name}
