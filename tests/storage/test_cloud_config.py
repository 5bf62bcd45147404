"""gs:// and az:// locations and settings, without a server: each cloud's variables as its users set them,
the connection string obstore ignores, and every bad setting as one sentence naming where it came from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llm.data.storage.clouds import parse_connection_string
from llm.data.storage.paths import Location, parse_location
from llm.data.storage.s3 import proxy_options, resolve_config
from tests.storage.azurite import ACCOUNT, ACCOUNT_KEY
from tests.storage.conftest import STORE_VARIABLES

# ACCOUNT, ACCOUNT_KEY: the emulator's well-known account (Azurite only ever starts with --disableTelemetry)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for name in STORE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.config/gcloud credentials


@pytest.mark.parametrize("endpoint,account", [
    ("http://azurite:10000/devstoreaccount1", "devstoreaccount1"),  # the emulator by host name (compose, k8s)
    ("http://[::1]:10000/devstoreaccount1", "devstoreaccount1"),  # IPv6 loopback
    ("http://[fd00::5]:10000/devstoreaccount1/", "devstoreaccount1"),
    ("http://127.0.0.1:10000/devstoreaccount1", "devstoreaccount1"),
    ("http://localhost:10000/acct2", "acct2"),
    ("http://azurite.svc.cluster.local:10000/acct3", "acct3"),  # a dotted host name with the account in its path
    ("https://acct.blob.core.windows.net", "acct"),  # Azure: the account is the first host label
    ("https://acct.blob.core.windows.net/", "acct"),
    ("https://acct.privatelink.blob.core.windows.net", "acct"),
    ("https://acct.blob.core.chinacloudapi.cn", "acct"),
])
def test_the_account_of_an_azure_endpoint_in_every_host_form(monkeypatch, endpoint, account):
    options = {"endpoint": endpoint, "account_key": ACCOUNT_KEY}
    assert dict(resolve_config("c", options, "az").cloud.config)["account_name"] == account
    text = f"DefaultEndpointsProtocol=http;AccountKey={ACCOUNT_KEY};BlobEndpoint={endpoint};"
    assert parse_connection_string(text, "X")["account_name"] == account


def test_an_endpoint_that_names_no_account_is_one_sentence():
    with pytest.raises(ValueError, match=r"az:// needs an Azure storage account"):
        resolve_config("c", {"endpoint": "http://[::1]:10000", "account_key": ACCOUNT_KEY}, "az")


@pytest.mark.parametrize("text,expected", [
    ("gs://bucket/a/b/", Location("gs", "a/b", "bucket")),
    ("gcs://bucket/a", Location("gs", "a", "bucket")),
    ("az://container/a", Location("az", "a", "container")),
    ("azure://container", Location("az", "", "container")),
])
def test_gs_and_az_locations(text, expected):
    loc = parse_location(text)
    assert loc == expected and loc.is_object_store and loc.is_remote
    assert loc.url("index.json") == f"{expected.kind}://{expected.bucket}/{loc.key('index.json')}"


def test_bad_gs_and_az_locations_name_the_bucket_or_the_container():
    with pytest.raises(ValueError, match="names no container; expected az://container/prefix"):
        parse_location("az://")
    with pytest.raises(ValueError, match="'B!' is not a valid bucket name"):
        parse_location("gs://B!/x")


def test_the_connection_string_every_azure_sdk_reads(monkeypatch):
    text = f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};BlobEndpoint=http://127.0.0.1:10000/{ACCOUNT};"
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", text)
    config = resolve_config("c", scheme="az")
    cloud = dict(config.cloud.config)
    assert cloud == {"account_name": ACCOUNT, "account_key": ACCOUNT_KEY, "endpoint": f"http://127.0.0.1:10000/{ACCOUNT}"}
    assert config.where == f"http://127.0.0.1:10000/{ACCOUNT}" and config.has_credentials
    assert ACCOUNT_KEY not in repr(config) and ACCOUNT_KEY not in repr(config.cloud)
    # the portal's form: an endpoint suffix, no BlobEndpoint; and a SAS (its '=' and '&' kept whole)
    portal = parse_connection_string("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=a2V5;"
                                     "EndpointSuffix=core.windows.net", "X")
    assert portal["endpoint"] == "https://acct.blob.core.windows.net" and portal["account_key"] == "a2V5"
    sas = parse_connection_string("BlobEndpoint=https://acct.blob.core.windows.net/;SharedAccessSignature=sv=2022&sig=a%3D=", "X")
    assert sas == {"endpoint": "https://acct.blob.core.windows.net", "sas_key": "sv=2022&sig=a%3D=", "account_name": "acct"}
    assert parse_connection_string("UseDevelopmentStorage=true", "X") == {"use_emulator": True}


@pytest.mark.parametrize("text,message", [
    ("AccountName=a;AccountKey", "AZURE_STORAGE_CONNECTION_STRING is not an Azure connection string: part 2 is not Name=value"),
    ("AccountKey=abc", "AZURE_STORAGE_CONNECTION_STRING names no AccountName and no BlobEndpoint"),
    ("AccountName=a;BlobEndpoint=127.0.0.1:10000", "BlobEndpoint in AZURE_STORAGE_CONNECTION_STRING is '127.0.0.1:10000', "
     "not an endpoint URL"),
])
def test_a_bad_connection_string_is_one_sentence_that_never_quotes_the_key(monkeypatch, text, message):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", text)
    with pytest.raises(ValueError, match=message) as info:
        resolve_config("c", scheme="az")
    assert "abc" not in str(info.value) and "\n" not in str(info.value)


def test_azure_settings_come_from_options_then_the_connection_string_then_the_variables(monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "AccountName=fromstring;AccountKey=a2V5")
    assert dict(resolve_config("c", scheme="az").cloud.config)["account_name"] == "fromstring"
    options = {"account_name": "fromoptions", "sas_token": "?sv=1&sig=x"}  # the portal copies it with its '?'
    cloud = dict(resolve_config("c", options, "az").cloud.config)
    assert cloud == {"account_name": "fromoptions", "sas_key": "sv=1&sig=x"}
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", "cliname")  # the Azure CLI's names
    monkeypatch.setenv("AZURE_STORAGE_KEY", "a2V5")
    config = resolve_config("c", scheme="az")
    assert dict(config.cloud.config) == {"account_name": "cliname", "account_key": "a2V5"}
    assert config.where == "https://cliname.blob.core.windows.net"
    monkeypatch.delenv("AZURE_STORAGE_KEY")
    principal = {"client_id": "id", "client_secret": "s", "tenant_id": "t"}  # a service principal
    config = resolve_config("c", principal, "az")
    assert config.has_credentials and dict(config.cloud.config)["client_secret"] == "s"
    assert not resolve_config("c", scheme="az").has_credentials  # managed identity: asks the metadata address
    with pytest.raises(ValueError, match=r"unknown storage option 'account' for az://; expected one of account_name"):
        resolve_config("c", {"account": "x"}, "az")


def test_gcs_settings_service_account_files_and_the_emulator_host(monkeypatch, tmp_path):
    key = tmp_path / "sa.json"
    key.write_text(json.dumps({"gcs_base_url": "http://127.0.0.1:4443", "disable_oauth": True,
                               "client_email": "", "private_key": ""}))
    config = resolve_config("b", {"service_account": str(key)}, "gs")
    assert dict(config.cloud.config) == {"service_account": str(key), "base_url": "http://127.0.0.1:4443"}
    assert config.where == "http://127.0.0.1:4443" and config.has_credentials
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match=r"GOOGLE_APPLICATION_CREDENTIALS is '.*missing.json', which does not exist"):
        resolve_config("b", scheme="gs")
    (tmp_path / "bad.json").write_text("{not json")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match=r"'.*bad.json', which is not a JSON credentials file"):
        resolve_config("b", scheme="gs")
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:9023")  # the Google SDKs' form, no scheme
    config = resolve_config("b", scheme="gs")
    assert dict(config.cloud.config) == {"base_url": "http://127.0.0.1:9023", "skip_signature": True}
    monkeypatch.setenv("GOOGLE_BEARER_TOKEN", "tok")  # a token: requests are signed with it, not anonymous
    assert dict(resolve_config("b", scheme="gs").cloud.config) == {"base_url": "http://127.0.0.1:9023"}
    assert resolve_config("b", {"token": "t"}, "gs") != resolve_config("b", {"token": "u"}, "gs")  # one client each
    with pytest.raises(ValueError, match="storage_options\\['endpoint'\\] is 'x y', not an endpoint URL"):
        resolve_config("b", {"endpoint": "x y"}, "gs")


def test_each_clouds_proxy_variables_reach_its_client(monkeypatch):
    monkeypatch.setenv("GOOGLE_PROXY_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("GOOGLE_PROXY_EXCLUDES", "127.0.0.1,localhost")
    monkeypatch.setenv("AZURE_PROXY_URL", "http://127.0.0.1:8")
    monkeypatch.delenv("AZURE_PROXY_EXCLUDES", raising=False)
    assert proxy_options("gs") == {"proxy_url": "http://127.0.0.1:9", "proxy_excludes": "127.0.0.1,localhost"}
    assert proxy_options("az") == {"proxy_url": "http://127.0.0.1:8"}


def test_storage_options_for_a_local_folder_are_refused(tmp_path: Path):
    from llm.data.storage.objects import open_objects

    with pytest.raises(ValueError, match=r"storage_options apply to object stores \(s3://, gs://, az://\) only"):
        open_objects(f"local:{tmp_path}", {"token": "x"})
