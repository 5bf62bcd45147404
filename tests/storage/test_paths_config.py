"""Locations and credentials, without a server: URLs are never local paths, settings come the AWS way."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm.data.storage.paths import Location, parse_location
from llm.data.storage.s3 import resolve_config


@pytest.mark.parametrize("text,expected", [
    ("s3://bucket/a/b/", Location("s3", "a/b", "bucket")),
    ("s3://bucket", Location("s3", "", "bucket")),
    ("local:/mnt/share/ds", Location("local", "/mnt/share/ds")),
    ("data/ds", Location("file", "data/ds")),
    ("/abs/ds", Location("file", "/abs/ds")),
    ("file:///abs/ds", Location("file", "/abs/ds")),
])
def test_locations(text, expected):
    assert parse_location(text) == expected


def test_urls_round_trip_and_name_objects():
    loc = parse_location("s3://bucket/a/b")
    assert loc.url() == "s3://bucket/a/b" and loc.key("index.json") == "a/b/index.json"
    assert parse_location("s3://bucket").key("x") == "x"
    assert parse_location("local:/mnt/x").url("f") == "local:/mnt/x/f"


@pytest.mark.parametrize("text,message", [
    ("hdfs://bucket/ds", "unknown storage scheme 'hdfs://'"),
    ("https://host/ds", "unknown storage scheme 'https://'"),
    ("s3:/bucket/ds", "looks like a URL with scheme 's3' but no '//'"),
    ("s3://", "names no bucket"),
    ("s3://Bad_Bucket!/x", "not a valid bucket name"),
    ("s3://bucket/a/../b", "'..' part"),
    ("local:", "names no folder"),
])
def test_bad_locations_are_one_clear_error(text, message):
    with pytest.raises(ValueError, match=message):
        parse_location(text)


def test_an_unknown_scheme_never_becomes_a_local_folder(tmp_path, monkeypatch):
    from llm.data.shards.format.loaders import TokensLoader
    from llm.data.shards.prepare.optimize import optimize

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="unknown storage scheme 'hdfs://'"):
        optimize(lambda i: [1, 2, 3], [0], "hdfs://bucket/ds", item_loader=TokensLoader(), num_workers=0, progress=False)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def aws_home(tmp_path, monkeypatch) -> Path:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
                 "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
                 "LLM_STORAGE_RETRIES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    aws = tmp_path / ".aws"
    aws.mkdir()
    (aws / "credentials").write_text("[default]\naws_access_key_id = FILEKEY\naws_secret_access_key = FILESECRET\n"
                                     "[team]\naws_access_key_id = TEAMKEY\naws_secret_access_key = TEAMSECRET\n")
    (aws / "config").write_text("[default]\nregion = eu-west-1\nendpoint_url = http://files:9000\n"
                                "[profile team]\nregion = us-west-2\ns3 =\n  endpoint_url = http://team:9000\n")
    return tmp_path


def test_settings_come_from_the_aws_files(aws_home):
    c = resolve_config("b")
    assert (c.access_key_id, c.secret_access_key, c.region, c.endpoint) == ("FILEKEY", "FILESECRET", "eu-west-1", "http://files:9000")


def test_a_profile_is_chosen_by_aws_profile_or_storage_options(aws_home, monkeypatch):
    monkeypatch.setenv("AWS_PROFILE", "team")
    c = resolve_config("b")
    assert (c.access_key_id, c.region, c.endpoint) == ("TEAMKEY", "us-west-2", "http://team:9000")
    monkeypatch.delenv("AWS_PROFILE")
    assert resolve_config("b", {"profile": "team"}).access_key_id == "TEAMKEY"


def test_environment_beats_files_and_options_beat_both(aws_home, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ENVSECRET")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "ENVTOKEN")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://env:1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://env-s3:2")
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    c = resolve_config("b")
    assert (c.access_key_id, c.secret_access_key, c.session_token) == ("ENVKEY", "ENVSECRET", "ENVTOKEN")
    assert (c.endpoint, c.region) == ("http://env-s3:2", "ap-south-1")
    c = resolve_config("b", {"endpoint_url": "http://opt:3", "aws_access_key_id": "OPTKEY", "retries": "0"})
    assert (c.endpoint, c.access_key_id, c.retries) == ("http://opt:3", "OPTKEY", 0)


def test_bad_storage_options_name_the_key(aws_home):
    with pytest.raises(ValueError, match="unknown storage option 'endpont'"):
        resolve_config("b", {"endpont": "http://x"})
    with pytest.raises(ValueError, match="storage option 'retries' is 'many'"):
        resolve_config("b", {"retries": "many"})


def test_the_secret_and_the_session_token_never_appear_in_a_repr():
    from llm.data.storage.s3 import S3Config

    config = S3Config(bucket="b", access_key_id="AKIDEXAMPLE", secret_access_key="s3cr3t-value", session_token="t0ken-value")
    text = repr(config)
    assert "s3cr3t-value" not in text and "t0ken-value" not in text and "AKIDEXAMPLE" in text


def test_inline_comments_in_the_aws_files_are_stripped_as_the_aws_sdks_do(aws_home):
    # LitData's README: `endpoint_url = http://localhost:9000  # MinIO endpoint`
    (aws_home / ".aws" / "config").write_text("[default]\nregion = eu-west-1 ; Ireland\n"
                                              "endpoint_url = http://localhost:9000  # MinIO endpoint\n")
    c = resolve_config("b")
    assert (c.endpoint, c.region) == ("http://localhost:9000", "eu-west-1")


def test_a_malformed_endpoint_is_one_sentence_naming_the_variable_or_the_file_and_line(aws_home, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:8333 x")
    with pytest.raises(ValueError, match=r"^AWS_ENDPOINT_URL is 'http://127.0.0.1:8333 x', not an endpoint URL") as e:
        resolve_config("b")
    assert "\n" not in str(e.value)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    config = aws_home / ".aws" / "config"
    config.write_text("[default]\nregion = eu-west-1\n\nendpoint_url = localhost:9000/minio\n")
    with pytest.raises(ValueError, match=rf"^endpoint_url in {config} line 4 is 'localhost:9000/minio', not an endpoint"):
        resolve_config("b")
    with pytest.raises(ValueError, match=r"^storage_options\['endpoint'\] is 'http://:9000', not an endpoint"):
        resolve_config("b", {"endpoint": "http://:9000"})


def test_the_cli_says_a_malformed_endpoint_in_one_sentence_and_exits_2(aws_home, tmp_path):
    import os

    from tests.cli.helpers import first_error, run

    os.environ["AWS_ENDPOINT_URL"] = "http://127.0.0.1:8333 x"  # the subprocess inherits it; aws_home clears it after
    try:
        env_error = first_error(run("llm-data", "info", "s3://some-bucket/ds", cwd=tmp_path))
    finally:
        del os.environ["AWS_ENDPOINT_URL"]
    assert env_error.startswith("llm-data: error: AWS_ENDPOINT_URL is 'http://127.0.0.1:8333 x', not an endpoint URL")
    (aws_home / ".aws" / "config").write_text("[default]\nendpoint_url = http://local host:9000\n")
    file_error = first_error(run("llm-data", "info", "s3://some-bucket/ds", cwd=tmp_path))
    assert f"endpoint_url in {aws_home / '.aws' / 'config'} line 2 is 'http://local host:9000'" in file_error
