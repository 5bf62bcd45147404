"""`llm-train` under DDP (torchrun, 2 gloo processes) where rank 1's data stalls: its first read of its own text object
gets no answer for a while (the fault proxy, in front of SeaweedFS, on rank 1's endpoint only). Rank 0, waiting in the
step's collective, names rank 1 with the partition and the request it waits for, before any collective times out;
the run then ends normally, and each logged step names the slowest data rank."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.storage.faultproxy import FaultProxy
from tests.training.test_ddp import _env, _kill_tree
from tests.training.test_trainer import tiny_tree

_RUN = textwrap.dedent(
    """
    import json, os, sys
    import torch
    torch.set_num_threads(1)
    from llm.training.core.loading import load_config
    from llm.training.trainer import Trainer

    if __name__ == "__main__":
        cfg_path, options, flag = sys.argv[1:4]
        rank = int(os.environ["RANK"])
        per_rank = json.loads(options)[rank]  # rank 1 reads through the fault proxy
        trainer = Trainer(load_config(cfg_path, {"data.storage_options": per_rank}), "stream_lm")
        if rank == 1:
            trainer.data.module.partitions()  # listed and cut: the proxy stalls the next GET, rank 1's first read
            open(flag, "w").close()
        trainer.fit()
        trainer.close()
    """
)


def _upstream(server) -> tuple[str, int]:
    host, port = server.endpoint.removeprefix("http://").split(":")
    return host, int(port)


@pytest.mark.timeout(400)
def test_a_rank_whose_data_stalls_is_named_by_the_rank_waiting_for_it(s3_server, tmp_path: Path) -> None:
    from llm.data.storage.objects import open_objects

    url = s3_server.url()
    objects = open_objects(url, s3_server.options())
    for name in ("a", "b"):  # one object per rank
        objects.put(f"{name}.jsonl", "".join(json.dumps({"text": f"{name} record {i} alpha beta gamma"}) + "\n"
                                             for i in range(400)).encode())
    flag = tmp_path / "rank1-reads"
    stalled: list[str] = []

    def plan(method: str, path: str, attempt: int) -> str:
        if flag.exists() and method == "GET" and path.endswith(".jsonl") and not stalled:
            stalled.append(path)
            return "stall"
        return "ok"

    proxy = FaultProxy(_upstream(s3_server), plan)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(tiny_tree(url, data={"steps_per_epoch": 3, "watchdog_s": 2},
                                            training={"log_interval_steps": 1})))
    options = [s3_server.options(), {**s3_server.options(retries=2, backoff=0.01, timeout=12),
                                     **s3_server.options_via(proxy.endpoint)}]
    script = tmp_path / "run.py"
    script.write_text(_RUN)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script), str(cfg),
           json.dumps(options), str(flag)]
    try:
        with subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) as proc:
            try:
                out, err = proc.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                _kill_tree(proc.pid)
                out, err = proc.communicate(timeout=30)
                raise AssertionError(f"the run hung\n{out}\n{err}") from None
    finally:
        proxy.close()
    assert proc.returncode == 0, out + err
    assert stalled, "rank 1's read went through the proxy"
    stalled_object = stalled[0].rsplit("/", 1)[1]
    lines = [line for line in (out + err).splitlines()
             if "data watchdog: rank 0 of 2 has waited" in line and "for the other ranks: data watchdog: rank 1 of 2:" in line]
    assert lines, f"rank 0 did not name rank 1:\n{out}\n{err}"
    assert "reads partition " in lines[0] and stalled_object in lines[0], lines[0]
    assert "in flight for" in lines[0] and f"reading {url}/{stalled_object}" in lines[0], lines[0]
    assert "| slowest data rank 1 (wait p99" in out, out  # the gathered waits name the rank that waited
