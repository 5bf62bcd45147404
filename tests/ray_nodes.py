"""A Ray cluster of two raylets on one machine, started as two machines would start it: `ray start --head`,
then `ray start --address` for the second node (1 CPU each, usage stats off, loopback only). Each raylet
runs in the foreground (`--block`) as a child process, so stopping the cluster stops only ours. `scratch`: one
folder per raylet, its workers' `LLM_DEDUP_SCRATCH` (a node's own disk, as on machines that share none)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TwoRayletCluster:
    def __init__(self, cpus_per_node: int = 1, scratch: tuple[Path, Path] | None = None):
        self.cpus, self.scratch = cpus_per_node, scratch
        self.address = f"127.0.0.1:{_free_port()}"
        self.nodes: list[subprocess.Popen] = []

    def _start(self, *args: str) -> None:
        ray = str(Path(sys.executable).with_name("ray"))
        # Workers of both nodes import fn from the tests and llm from this checkout, as the driver does.
        path = os.pathsep.join([str(REPO), str(REPO / "src"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "PYTHONPATH": path}
        if self.scratch:
            env["LLM_DEDUP_SCRATCH"] = str(self.scratch[len(self.nodes)])
        cmd = [ray, "start", *args, "--node-ip-address", "127.0.0.1", "--num-cpus", str(self.cpus),
               "--disable-usage-stats", "--block"]
        self.nodes.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def start(self) -> None:
        import ray

        port = self.address.rsplit(":", 1)[1]
        self._start("--head", "--port", port, "--include-dashboard", "false")
        self._wait(lambda: ray.init(address=self.address, logging_level="ERROR", log_to_driver=False), "the head")
        self._start("--address", self.address)
        self._wait(lambda: self._check_two_alive(ray), "the second raylet")

    @staticmethod
    def _check_two_alive(ray) -> None:
        alive = sum(1 for node in ray.nodes() if node["Alive"])
        if alive < 2:
            raise RuntimeError(f"{alive} raylet alive")

    def _wait(self, attempt, what: str, limit_s: float = 90) -> None:
        deadline = time.monotonic() + limit_s
        while True:
            try:
                attempt()
                return
            except Exception as exc:  # ConnectionError and friends while a raylet comes up
                if any(p.poll() is not None for p in self.nodes) or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the Ray cluster at {self.address} did not start {what}: {exc}") from exc
                time.sleep(0.5)

    def stop(self) -> None:
        import ray

        ray.shutdown()
        for p in reversed(self.nodes):  # `ray start --block` stops its node's processes on SIGTERM
            p.terminate()
        for p in self.nodes:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
