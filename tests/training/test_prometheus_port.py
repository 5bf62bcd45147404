"""`llm-train`'s `logging.prometheus_port`: scraped over loopback during a run, the batches, tokens and waits are
the ones the trainer took and a mixture's per-source counts those of metrics.jsonl and of the batches themselves;
a port in use is one line on stderr before any data is read."""

from __future__ import annotations

import json
import socket
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from llm.training.core.config import LoggingConfig
from llm.training.core.errors import ConfigError
from llm.training.core.loading import build_config
from llm.training.metrics import read_metrics
from llm.training.prometheus import serve_training_metrics
from llm.training.train import main as train_main
from llm.training.trainer import Trainer
from tests.data.text.test_token_mixing import count_by_source
from tests.scrape import by_source, scrape, value
from tests.training.test_tokens_by_source import mixture_tree
from tests.training.test_trainer import tiny_tree, write_corpus

LOOPBACK = "127.0.0.1"


def test_a_run_serves_what_the_trainer_took_and_each_sources_counts(tmp_path: Path) -> None:
    tree = mixture_tree(tmp_path)
    tree["logging"] = {"prometheus_port": 0, "prometheus_host": LOOPBACK}
    batches: list[dict] = []
    scraped: dict[int, dict] = {}

    def at_step(trainer: Trainer, batch: dict, loss: float) -> None:
        batches.append({k: v.numpy().copy() for k, v in batch.items()})
        if trainer.step in (3, 4):  # before and after the log step that counts the sources
            scraped[trainer.step] = scrape(trainer.prometheus.url)

    trainer = Trainer(build_config(tree), "stream_lm", log=lambda _: None, callbacks=[at_step])
    try:
        assert trainer.prometheus.url.startswith(f"http://{LOOPBACK}:")
        trainer.fit(stop_after=5)
    finally:
        port = trainer.prometheus.server.port
        trainer.close()
    for step, samples in scraped.items():
        assert value(samples, "llm_data_batches_total") == value(samples, "llm_data_wait_seconds_count") == step
        assert value(samples, "llm_data_tokens_total") == sum(b["input_ids"].size for b in batches[:step])
        p50, p99 = (value(samples, "llm_data_wait_seconds", quantile=q) for q in ("0.5", "0.99"))
        assert 0 < p50 <= p99 and value(samples, "llm_data_wait_seconds_sum") > 0
        assert value(samples, "llm_data_remote_bytes_total") == 0, "local text reads nothing remote"
    assert by_source(scraped[3], "llm_data_source_tokens_total") == {}, "no step was logged yet"
    record = next(r for r in read_metrics(tmp_path / "run") if r["step"] == 4)
    counted = count_by_source(batches[:4])
    tokens = by_source(scraped[4], "llm_data_source_tokens_total")
    assert tokens == record["tokens_by_source"] == {"short": counted["short"][0], "books": counted["long"][0]}
    assert by_source(scraped[4], "llm_data_source_samples_total") == record["samples_by_source"]
    probe = socket.socket()
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server binds: scraped connections linger
    probe.bind((LOOPBACK, port))  # close() freed the port
    probe.listen()
    probe.close()


def test_a_port_in_use_stops_llm_train_in_one_line_before_any_data_is_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    taken = socket.socket()
    taken.bind((LOOPBACK, 0))
    taken.listen()
    port = taken.getsockname()[1]
    corpus = write_corpus(tmp_path / "demo.txt", 200)
    tree = tiny_tree(corpus, data={"steps_per_epoch": 2}, checkpoint={"checkpoint_dir": "ck"},
                     logging={"prometheus_port": port, "prometheus_host": LOOPBACK})
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(tree))
    monkeypatch.chdir(tmp_path)
    try:
        assert train_main(["--task", "lm", "--config-path", "cfg.yaml"]) == 2
    finally:
        taken.close()
    assert capsys.readouterr().err == (f"llm-train: error: logging.prometheus_port {port} is in use on {LOOPBACK} "
                                       "(something already listens there); pick another port, or 0 for a free one\n")
    assert not (tmp_path / "ck").exists(), "nothing was prepared or written"


def test_without_prometheus_client_llm_train_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # what an import of a missing library raises
    section = LoggingConfig(prometheus_port=0, prometheus_host=LOOPBACK)
    with pytest.raises(ConfigError, match=r"^logging\.prometheus_port needs the prometheus_client library: pip install "
                                          r"'llm-stream-data\[metrics\]' \(or pip install prometheus_client\), or remove "):
        serve_training_metrics(section, 0)
    assert serve_training_metrics(LoggingConfig(), 0) is None, "nothing to serve, nothing imported"


def test_the_section_is_checked_like_every_other(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = write_corpus(tmp_path / "demo.txt", 50)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(tiny_tree(corpus, logging={"prometheus_port": 70000})))
    monkeypatch.chdir(tmp_path)
    assert train_main(["--task", "lm", "--config-path", "cfg.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llm-train: error: cfg.yaml: logging.prometheus_port = 70000 is invalid (") and err.count("\n") == 1
    assert build_config(tiny_tree(corpus)).logging.prometheus_port is None, "not served unless asked"


# Trains like `llm-train` on 2 torchrun ranks; each rank scrapes itself, and rank 0 rank 1 too, at step 2 (rank 1
# cannot finish before rank 0's step 3 all-reduce, so its endpoint is still up).
_RUN = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, sys.argv[4])  # the repository, for tests.scrape
    import torch
    torch.set_num_threads(1)
    from llm.training.core.loading import load_config
    from llm.training.trainer import Trainer
    from tests.scrape import scrape

    cfg_path, out_dir, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rank = int(os.environ["RANK"])

    def at_step(trainer, batch, loss):
        if trainer.step == 2:
            seen = {str(r): [[name, sorted(labels), v] for (name, labels), v in scrape(
                f"http://127.0.0.1:{port + r}/metrics", rank=str(r)).items()] for r in ([0, 1] if rank == 0 else [1])}
            with open(f"{out_dir}/rank{rank}.json", "w") as f:
                json.dump({"url": trainer.prometheus.url, "seen": seen}, f)

    trainer = Trainer(load_config(cfg_path), "stream_lm", callbacks=[at_step])
    trainer.fit()
    trainer.close()
    """
)


@pytest.mark.slow  # two torchrun ranks training: `make test-all` / CI
@pytest.mark.timeout(400)
def test_under_ddp_each_rank_serves_on_port_plus_its_local_rank(tmp_path: Path) -> None:
    from tests.training.test_ddp import _torchrun

    probe = socket.create_server((LOOPBACK, 0))
    port = probe.getsockname()[1]
    probe.close()
    tree = tiny_tree(write_corpus(tmp_path / "demo.txt", 200), data={"steps_per_epoch": 4},
                     logging={"prometheus_port": port, "prometheus_host": LOOPBACK})
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(tree))
    (tmp_path / "run.py").write_text(_RUN)
    out = tmp_path / "out"
    out.mkdir()
    repo = Path(__file__).resolve().parents[2]
    _torchrun([str(tmp_path / "run.py"), str(tmp_path / "cfg.yaml"), str(out), str(port), str(repo)], tmp_path)
    for rank in range(2):
        got = json.loads((out / f"rank{rank}.json").read_text())
        assert got["url"] == f"http://{LOOPBACK}:{port + rank}/metrics"
        assert set(got["seen"]) == ({"0", "1"} if rank == 0 else {"1"})  # rank 0 read rank 1's endpoint too
        for samples in got["seen"].values():  # each labelled with the rank that served it (scrape checks)
            batches = [v for name, labels, v in samples if name == "llm_data_batches_total"]
            assert batches and batches[0] >= 2
        seen = {n: v for n, labels, v in got["seen"][str(rank)] if not labels}
        assert seen["llm_data_batches_total"] == 2 and seen["llm_data_tokens_total"] == 2 * 4 * 32
