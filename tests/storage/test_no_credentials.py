"""Without any credentials a cloud client asks the cloud metadata address; the suite points it (AWS) and
the Google and Azure clients' proxy at a dead loopback port (tests/conftest.py), and opening a dataset then
fails in one sentence, within seconds, without a packet leaving loopback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.seaweed import LOOPBACK_ONLY

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
    # nothing but what the suite sets for every process: the dead metadata address, no keys, no ~/.aws;
    # one retry, as below: the default budget waits out a ~20 s outage, the metadata address included
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": os.pathsep.join(sys.path),
           "AWS_METADATA_ENDPOINT": os.environ["AWS_METADATA_ENDPOINT"], "LLM_STORAGE_RETRIES": "1"}
    proc = subprocess.run([sys.executable, "-c", _OPEN, "s3://some-bucket/ds"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=8)  # retrying a dead address would take far longer
    assert proc.returncode == 3, proc.stderr
    message = proc.stdout.strip()
    assert "\n" not in message and "s3://some-bucket/ds/index.json" in message
    assert "no AWS credentials" in message and "AWS_ACCESS_KEY_ID" in message


@pytest.mark.parametrize("url,extra,says", [
    ("gs://some-bucket/ds", {}, "no Google Cloud credentials are set: set GOOGLE_APPLICATION_CREDENTIALS"),
    ("az://some-container/ds", {"AZURE_STORAGE_ACCOUNT_NAME": "someaccount"},
     "no Azure credentials are set: set AZURE_STORAGE_CONNECTION_STRING"),
], ids=["gs", "az"])
def test_no_google_or_azure_credentials_fail_on_loopback_in_one_sentence(tmp_path: Path, url, extra, says):
    home = tmp_path / "home"
    home.mkdir()
    # The credential request goes to the metadata address through the client's proxy: the dead loopback port.
    # One retry: obstore retries a failed token request like any other (10 times, ~20 s, by default).
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": os.pathsep.join(sys.path), **LOOPBACK_ONLY,
           "LLM_STORAGE_RETRIES": "1", **extra}
    proc = subprocess.run([sys.executable, "-c", _OPEN, url], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 3, proc.stderr
    message = proc.stdout.strip()
    assert "\n" not in message and f"{url}/index.json" in message and says in message, message
    assert "(connection failed)" in message, message  # refused at 127.0.0.1:9, never an answer from outside


def test_an_azure_location_without_an_account_is_one_sentence_before_any_request(monkeypatch):
    from llm.data.storage.objects import open_objects

    for name in ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_CONNECTION_STRING",
                 "AZURE_STORAGE_USE_EMULATOR"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="az:// needs an Azure storage account: set AZURE_STORAGE_CONNECTION_STRING"):
        open_objects("az://container/ds")
