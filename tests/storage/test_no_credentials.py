"""Without any credentials an S3 client asks the cloud metadata address; the suite points it at a dead
loopback port (tests/conftest.py), and opening a dataset then fails at once in one sentence."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_OPEN = """
import sys
from llm.data.shards.format.remote import load_manifest
from llm.data.storage.paths import parse_location
from llm.data.storage.s3 import StorageError
try:
    load_manifest(parse_location(sys.argv[1]))
except StorageError as e:
    print(e)
    sys.exit(3)
"""


def test_the_suite_never_points_a_client_at_the_metadata_address():
    for name in ("AWS_METADATA_ENDPOINT", "GOOGLE_PROXY_URL", "AZURE_PROXY_URL"):
        assert os.environ[name].startswith("http://127.0.0.1:"), name
    for name in ("GOOGLE_PROXY_EXCLUDES", "AZURE_PROXY_EXCLUDES"):
        assert os.environ[name] == "127.0.0.1,localhost"


def test_no_credentials_at_all_fails_at_once_in_one_sentence(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    # nothing but what the suite sets for every process: the dead metadata address, no keys, no ~/.aws
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": os.pathsep.join(sys.path),
           "AWS_METADATA_ENDPOINT": os.environ["AWS_METADATA_ENDPOINT"]}
    proc = subprocess.run([sys.executable, "-c", _OPEN, "s3://some-bucket/ds"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=8)  # retrying a dead address would take far longer
    assert proc.returncode == 3, proc.stderr
    message = proc.stdout.strip()
    assert "\n" not in message and "s3://some-bucket/ds/index.json" in message
    assert "no AWS credentials" in message and "AWS_ACCESS_KEY_ID" in message
