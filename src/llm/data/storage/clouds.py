"""Google Cloud Storage (gs://) and Azure Blob Storage (az://) settings, the way each cloud's users have them.

obstore reads most variables itself (GOOGLE_*, AZURE_STORAGE_*); this adds what it does not read and
every check that would otherwise surface mid-request as a Rust error or panic:

* Azure: the connection string (`AZURE_STORAGE_CONNECTION_STRING` or `storage_options['connection_string']`),
  which every Azure SDK reads and obstore ignores; the Azure CLI's names `AZURE_STORAGE_ACCOUNT` and
  `AZURE_STORAGE_KEY`; an account name, which obstore needs before its first request.
* GCS: `STORAGE_EMULATOR_HOST` (the Google SDKs' emulator switch), and service-account files that exist
  and are JSON, named by their variable when they are not.

Each store's result is `CloudSettings`: obstore's config, where requests go (for the error sentences) and
whether any credential was given (without one the client asks the cloud's metadata address).
"""

from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from llm.data.storage.awsconfig import check_endpoint

AZURE_OPTION_KEYS = ("account_name", "account_key", "sas_token", "token", "client_id", "client_secret", "tenant_id",
                     "connection_string", "endpoint", "use_emulator")
GCS_OPTION_KEYS = ("service_account", "service_account_key", "application_credentials", "token", "endpoint", "anonymous")
AZURE_ALIASES = {"account_url": "endpoint", "sas_key": "sas_token", "bearer_token": "token",
                  "azure_storage_account_name": "account_name", "azure_storage_account_key": "account_key",
                  "azure_storage_connection_string": "connection_string", "azure_storage_sas_token": "sas_token"}
GCS_ALIASES = {"bearer_token": "token", "base_url": "endpoint", "google_application_credentials": "application_credentials",
                "token_file": "service_account", "skip_signature": "anonymous"}

# What each store's messages tell a user to check, by scheme.
HINTS = {
    "s3": {"bucket": "bucket", "keys": "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, ~/.aws/credentials, "
           "storage_options)", "endpoint": "AWS_ENDPOINT_URL"},
    "gs": {"bucket": "bucket", "keys": "GOOGLE_APPLICATION_CREDENTIALS or GOOGLE_SERVICE_ACCOUNT (a service-account "
           "JSON file), GOOGLE_BEARER_TOKEN, or storage_options", "endpoint": "GOOGLE_BASE_URL or STORAGE_EMULATOR_HOST"},
    "az": {"bucket": "container", "keys": "AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with "
           "AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_TOKEN or a service principal (AZURE_CLIENT_ID / "
           "AZURE_CLIENT_SECRET / AZURE_TENANT_ID), or storage_options",
           "endpoint": "AZURE_STORAGE_ENDPOINT or the connection string's BlobEndpoint"},
}
# The S3 error codes (and their Azure names) that mean the bucket itself is missing.
MISSING_BUCKET_CODES = ("NoSuchBucket", "ContainerNotFound")
_TRUE = ("1", "true", "yes", "on")
# Variables obstore reads as a credential (besides the ones handled here).
_AZURE_CREDENTIAL_ENV = ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ACCESS_KEY", "AZURE_STORAGE_MASTER_KEY",
                         "AZURE_STORAGE_SAS_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_TOKEN",
                         "AZURE_CLIENT_SECRET", "AZURE_STORAGE_CLIENT_SECRET", "AZURE_FEDERATED_TOKEN_FILE")
_GCS_CREDENTIAL_ENV = ("GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH", "GOOGLE_SERVICE_ACCOUNT_KEY",
                       "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_BEARER_TOKEN")
AZURITE_DEFAULT_URL = "http://127.0.0.1:10000"


@dataclass(frozen=True)
class CloudSettings:
    """obstore's config for one GCS bucket or Azure container, and what the error sentences need."""

    config: tuple[tuple[str, Any], ...] = field(repr=False)  # holds secrets
    where: str  # the endpoint, or the cloud's service by name
    endpoint: str | None  # an explicit endpoint (emulator, private link), else None
    credentials: bool  # a credential was given; without one the client asks the metadata address
    # The cloud's variables obstore reads by itself, as they were: part of the client cache's key, so a
    # process whose variables changed gets a new client, as it does for s3:// (whose keys are in S3Config).
    environment: tuple[tuple[str, str], ...] = field(default=(), repr=False)


def _environment(prefixes: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(prefixes)))


def _truthy(value: Any) -> bool:
    return value is True or str(value).strip().lower() in _TRUE


def normalize_options(options: dict, keys: tuple[str, ...], aliases: dict[str, str], shared: tuple[str, ...],
                      scheme: str) -> dict:
    """storage_options with aliases resolved; an unknown key is one error listing the known ones."""
    out = {}
    for key, value in options.items():
        key = aliases.get(key, key)
        if key not in keys and key not in shared:
            raise ValueError(f"unknown storage option {key!r} for {scheme}://; expected one of "
                             f"{', '.join((*keys, *shared))}")
        out[key] = value
    return out


def parse_connection_string(text: str, source: str) -> dict[str, Any]:
    """An Azure connection string (`AccountName=...;AccountKey=...;BlobEndpoint=...`) as obstore's config.

    Knows the account key, SAS and emulator forms; other services' endpoints (queues, tables) are ignored.
    A malformed one is named by its source, never quoted (it holds a key).
    """
    parts: dict[str, str] = {}
    for number, part in enumerate((p.strip() for p in text.strip().split(";")), 1):
        if not part:
            continue
        name, sep, value = part.partition("=")  # keys and SAS tokens contain '=': split at the first
        if not sep or not name.strip():
            raise ValueError(f"{source} is not an Azure connection string: part {number} is not Name=value "
                             "(expected AccountName=...;AccountKey=...;BlobEndpoint=...)")
        parts[name.strip().lower()] = value.strip()
    config: dict[str, Any] = {}
    if _truthy(parts.get("usedevelopmentstorage", "")):
        config["use_emulator"] = True
        proxy = parts.get("developmentstorageproxyuri")
        if proxy:
            config["endpoint"] = f"{proxy.rstrip('/')}/devstoreaccount1"
    if "accountname" in parts:
        config["account_name"] = parts["accountname"]
    if "accountkey" in parts:
        config["account_key"] = parts["accountkey"]
    if "sharedaccesssignature" in parts:
        config["sas_key"] = parts["sharedaccesssignature"].lstrip("?")
    if "blobendpoint" in parts:
        # the portal writes it with a trailing '/', which would double in front of the container
        config["endpoint"] = check_endpoint(parts["blobendpoint"], f"BlobEndpoint in {source}").rstrip("/")
    elif "accountname" in parts and "endpointsuffix" in parts:
        protocol = parts.get("defaultendpointsprotocol", "https")
        config["endpoint"] = f"{protocol}://{parts['accountname']}.blob.{parts['endpointsuffix']}"
    if "account_name" not in config and "endpoint" not in config and not config.get("use_emulator"):
        raise ValueError(f"{source} names no AccountName and no BlobEndpoint; expected "
                         "AccountName=...;AccountKey=...[;BlobEndpoint=...] (as the Azure portal shows it)")
    if "account_name" not in config and "endpoint" in config:  # BlobEndpoint=https://ACCOUNT.blob... or .../ACCOUNT
        if (account := _account_of(config["endpoint"])) is not None:
            config["account_name"] = account
    return config


def _account_of(endpoint: str) -> str | None:
    """The account an endpoint URL names, or None when it names none.

    Azure's own hosts (`ACCOUNT.blob.core.windows.net`, private links, sovereign clouds) name it
    in their first label. Everything else that has a path is emulator-style (Azurite and proxies
    put the account first in the path), whatever the host's form: an IP, `localhost`, a host
    name (`http://blob-emulator:10000/devstoreaccount1`) or IPv6 (`http://[::1]:10000/...`), parsed by
    urllib so a bracketed address is not cut at its colons.
    """
    try:
        parts = urlsplit(endpoint)
        host = parts.hostname or ""
    except ValueError:  # e.g. an unclosed IPv6 bracket: check_endpoint names such an endpoint
        return None
    labels = host.split(".")
    if len(labels) > 2 and "blob" in labels[1:]:
        return labels[0]
    segment = parts.path.strip("/").split("/")[0]
    if segment:
        return segment
    try:
        ipaddress.ip_address(host)
        return None  # an address names no account
    except ValueError:
        pass
    return labels[0] if len(labels) > 1 else None  # a custom domain: its first label, as before


def azure_settings(options: dict) -> CloudSettings:
    """storage_options, else AZURE_STORAGE_CONNECTION_STRING, then the AZURE_* variables obstore reads itself."""
    env = os.environ
    given = {k: v for k, v in options.items() if k in AZURE_OPTION_KEYS and v not in (None, "")}
    config: dict[str, Any] = {}
    if "connection_string" in given:
        config.update(parse_connection_string(str(given.pop("connection_string")), "storage_options['connection_string']"))
    elif not ({"account_name", "endpoint", "use_emulator"} & set(given)) and env.get("AZURE_STORAGE_CONNECTION_STRING"):
        config.update(parse_connection_string(env["AZURE_STORAGE_CONNECTION_STRING"], "AZURE_STORAGE_CONNECTION_STRING"))
    renamed = {"sas_token": "sas_key", "token": "bearer_token"}
    for key, value in given.items():
        config[renamed.get(key, key)] = value
    if "sas_key" in config:
        config["sas_key"] = str(config["sas_key"]).lstrip("?")
    if "use_emulator" in config:
        config["use_emulator"] = _truthy(config["use_emulator"])
    # The Azure CLI's names, which obstore does not read.
    if "account_name" not in config and not env.get("AZURE_STORAGE_ACCOUNT_NAME") and env.get("AZURE_STORAGE_ACCOUNT"):
        config["account_name"] = env["AZURE_STORAGE_ACCOUNT"]
    if "account_key" not in config and not any(env.get(n) for n in _AZURE_CREDENTIAL_ENV[:3]) and env.get("AZURE_STORAGE_KEY"):
        config["account_key"] = env["AZURE_STORAGE_KEY"]
    emulator = _truthy(config.get("use_emulator", env.get("AZURE_STORAGE_USE_EMULATOR", "")))
    if "endpoint" in config:
        config["endpoint"] = check_endpoint(str(config["endpoint"]), "storage_options['endpoint']").rstrip("/")
        if (account := env.get("AZURE_STORAGE_ACCOUNT_NAME") or _account_of(config["endpoint"])) is not None:
            config.setdefault("account_name", account)
    elif env.get("AZURE_STORAGE_ENDPOINT") or env.get("AZURE_ENDPOINT"):
        name = "AZURE_STORAGE_ENDPOINT" if env.get("AZURE_STORAGE_ENDPOINT") else "AZURE_ENDPOINT"
        config["endpoint"] = check_endpoint(env[name], name)
    account = config.get("account_name") or env.get("AZURE_STORAGE_ACCOUNT_NAME")
    if emulator:
        account = account or "devstoreaccount1"  # the emulator's well-known account
    if not account:
        raise ValueError("az:// needs an Azure storage account: set AZURE_STORAGE_CONNECTION_STRING, or "
                         "AZURE_STORAGE_ACCOUNT_NAME (with AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_TOKEN or a "
                         "service principal), or storage_options={'account_name': ...}")
    config["account_name"] = account
    endpoint = config.get("endpoint")
    if endpoint:
        where = str(endpoint)
    elif emulator:
        where = f"{env.get('AZURITE_BLOB_STORAGE_URL') or AZURITE_DEFAULT_URL}/{account}"
    else:
        where = f"https://{account}.blob.core.windows.net"
    credentials = emulator or any(config.get(k) for k in ("account_key", "sas_key", "bearer_token", "client_secret")) \
        or any(env.get(n) for n in _AZURE_CREDENTIAL_ENV) or _truthy(env.get("AZURE_USE_AZURE_CLI", ""))
    return CloudSettings(tuple(sorted(config.items())), where, endpoint, bool(credentials), _environment(("AZURE",)))


def _json_file(path: str, source: str) -> dict:
    """A credentials file that exists and holds a JSON object, else one sentence naming `source`."""
    file = Path(os.path.expanduser(path))
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise ValueError(f"{source} is {path!r}, which does not exist; expected a service-account JSON file "
                         "(Google Cloud console: IAM > Service accounts > Keys)") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{source} is {path!r}, which is not a JSON credentials file ({type(e).__name__})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{source} is {path!r}, which holds JSON but not a credentials object")
    return data


def gcs_settings(options: dict) -> CloudSettings:
    """storage_options, then GOOGLE_* variables (obstore reads them too) and STORAGE_EMULATOR_HOST."""
    env = os.environ
    given = {k: v for k, v in options.items() if k in GCS_OPTION_KEYS and v not in (None, "")}
    config: dict[str, Any] = {}
    base_url: str | None = None
    for key, source in (("service_account", "storage_options['service_account']"),
                        ("application_credentials", "storage_options['application_credentials']")):
        if key in given:
            data = _json_file(str(given[key]), source)
            config[key] = str(Path(os.path.expanduser(str(given[key]))))
            base_url = base_url or data.get("gcs_base_url")
    if "service_account_key" in given:
        try:
            data = json.loads(str(given["service_account_key"]))
        except ValueError:
            raise ValueError("storage_options['service_account_key'] is not JSON; expected the service-account "
                             "key file's contents") from None
        config["service_account_key"] = str(given["service_account_key"])
        base_url = base_url or (data.get("gcs_base_url") if isinstance(data, dict) else None)
    if "token" in given:
        config["bearer_token"] = str(given["token"])
    if _truthy(given.get("anonymous", "")):
        config["skip_signature"] = True
    explicit = bool(config)
    if not explicit:  # the variables obstore reads, checked here so a wrong path is named by its variable
        for name in ("GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH", "GOOGLE_APPLICATION_CREDENTIALS"):
            if env.get(name):
                base_url = base_url or _json_file(env[name], name).get("gcs_base_url")
                break
    if "endpoint" in given:
        base_url = check_endpoint(str(given["endpoint"]), "storage_options['endpoint']")
    elif env.get("GOOGLE_BASE_URL"):
        base_url = check_endpoint(env["GOOGLE_BASE_URL"], "GOOGLE_BASE_URL")
    elif env.get("STORAGE_EMULATOR_HOST") and not base_url:
        host = env["STORAGE_EMULATOR_HOST"]
        base_url = check_endpoint(host if "://" in host else f"http://{host}", "STORAGE_EMULATOR_HOST")
        if not explicit and not any(env.get(n) for n in _GCS_CREDENTIAL_ENV):
            config["skip_signature"] = True  # as the Google SDKs do with an emulator: unsigned requests
    if base_url:
        config["base_url"] = base_url.rstrip("/")
    well_known = Path(os.path.expanduser("~/.config/gcloud/application_default_credentials.json"))
    credentials = explicit or bool(config.get("skip_signature")) or any(env.get(n) for n in _GCS_CREDENTIAL_ENV) \
        or well_known.is_file()
    where = config.get("base_url") or "Google Cloud Storage"
    return CloudSettings(tuple(sorted(config.items())), where, config.get("base_url"), bool(credentials),
                         _environment(("GOOGLE_", "STORAGE_EMULATOR_HOST")))
