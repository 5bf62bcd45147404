"""Object storage through obstore: S3-compatible stores (configured the AWS way), Google Cloud Storage and
Azure Blob Storage (configured as clouds.py reads them), obstore's retries, and every failure as one
sentence naming the endpoint, bucket (or container) and key.

The three stores differ only in how the client is built (`_client`) and in the words of the errors
(clouds.HINTS); everything above this module sees one `S3Config` and one `S3Objects` for all of them.

Retries are obstore's own (5xx, connection errors, resets and stalls, a GET body that breaks
mid-stream resumed from where it broke; exponential backoff with jitter). What stays here is
the classification (`call`): which failures are final, and the sentence a user reads.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from llm.data.storage.awsconfig import aws_sources, check_endpoint
from llm.data.storage.clouds import (
    AZURE_ALIASES,
    AZURE_OPTION_KEYS,
    GCS_ALIASES,
    GCS_OPTION_KEYS,
    HINTS,
    MISSING_BUCKET_CODES,
    CloudSettings,
    azure_settings,
    gcs_settings,
    normalize_options,
)
from llm.data.waiting import in_flight

T = TypeVar("T")

SHARED_OPTION_KEYS = ("retries", "backoff", "max_backoff", "timeout", "connect_timeout")  # every store
OPTION_KEYS = (
    "endpoint", "region", "access_key_id", "secret_access_key", "session_token", "profile",
)
_ALIASES = {"endpoint_url": "endpoint", "aws_access_key_id": "access_key_id",
            "aws_secret_access_key": "secret_access_key", "aws_session_token": "session_token", "region_name": "region"}


class StorageError(OSError):
    """Object storage failed; the message is one sentence naming the endpoint, bucket and key."""


class ObjectNotFound(StorageError, FileNotFoundError):
    """The object (or the bucket, see BucketNotFound) does not exist."""


class BucketNotFound(ObjectNotFound):
    """The bucket (Azure: container) itself does not exist: callers that treat a missing object as "empty" must not."""


@dataclass(frozen=True)
class S3Config:
    """Everything needed to reach one bucket (Azure: container) of any of the three stores; picklable, so
    worker processes rebuild the client. The S3 fields are used for s3://, `cloud` for gs:// and az://."""

    bucket: str
    endpoint: str | None = None
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)  # never in a traceback or a log
    session_token: str | None = field(default=None, repr=False)
    retries: int = 10  # with BACKOFF_BASE: a store down for ~5 s (5th percentile; ~20 s median) is waited out
    backoff: float = 0.2
    max_backoff: float = 10.0
    timeout: float = 300.0
    connect_timeout: float = 10.0
    scheme: str = "s3"  # s3, gs or az
    cloud: CloudSettings | None = field(default=None, repr=False)  # gs/az: obstore's config (it holds keys)

    @property
    def where(self) -> str:
        if self.cloud is not None:
            return self.cloud.where
        return self.endpoint or f"AWS S3 ({self.region})"

    @property
    def has_credentials(self) -> bool:
        return self.cloud.credentials if self.cloud is not None else bool(self.access_key_id)

    def url(self, key: str) -> str:
        return f"{self.scheme}://{self.bucket}/{key}"


def _aws_config(bucket: str, storage_options: dict) -> tuple[S3Config, dict[str, Any]]:
    """s3: storage_options, then AWS_* environment variables, then ~/.aws/credentials and ~/.aws/config."""
    opts = normalize_options(storage_options, OPTION_KEYS, _ALIASES, SHARED_OPTION_KEYS, "s3")
    sources = aws_sources(opts.get("profile"))
    aws = {key: value for key, (value, _) in sources.items()}
    values = {k: opts.get(k) or aws.get(k) for k in ("endpoint", "region", "access_key_id", "secret_access_key", "session_token")}
    if values["endpoint"]:
        check_endpoint(values["endpoint"], "storage_options['endpoint']" if opts.get("endpoint") else sources["endpoint"][1])
    return replace(S3Config(bucket=bucket), **{k: v for k, v in values.items() if v}), opts


def _cloud_config(bucket: str, storage_options: dict, scheme: str) -> tuple[S3Config, dict[str, Any]]:
    """gs and az: storage_options, then each cloud's variables (clouds.py)."""
    keys, aliases, settings = (GCS_OPTION_KEYS, GCS_ALIASES, gcs_settings) if scheme == "gs" else \
        (AZURE_OPTION_KEYS, AZURE_ALIASES, azure_settings)
    opts = normalize_options(storage_options, keys, aliases, SHARED_OPTION_KEYS, scheme)
    cloud = settings(opts)
    return S3Config(bucket=bucket, endpoint=cloud.endpoint, scheme=scheme, cloud=cloud), opts


def resolve_config(bucket: str, storage_options: dict | None = None, scheme: str = "s3") -> S3Config:
    """The settings of one bucket (Azure: container) of an s3, gs or az store, with the shared retry numbers."""
    if scheme == "s3":
        config, opts = _aws_config(bucket, storage_options or {})
    elif scheme in ("gs", "az"):
        config, opts = _cloud_config(bucket, storage_options or {}, scheme)
    else:
        raise ValueError(f"unknown object store {scheme!r}; expected s3, gs or az")
    for key in SHARED_OPTION_KEYS:
        value = opts.get(key, os.environ.get("LLM_STORAGE_RETRIES") if key == "retries" else None)
        if value is None:
            continue
        try:
            number = int(value) if key == "retries" else float(value)
        except (TypeError, ValueError):
            raise ValueError(f"storage option {key!r} is {value!r}, expected a number") from None
        if number < 0:
            raise ValueError(f"storage option {key!r} is {value!r}, expected a number >= 0")
        config = replace(config, **{key: number})
    return config


_STORES: dict[tuple[int, S3Config], Any] = {}
# obstore's default: a retried request is not signed again, so its retries stop within this time
# (SigV4 signatures expire); a stall longer than it (timeout) is therefore not retried.
RETRY_TIMEOUT_S = 180.0
# obstore draws each wait uniformly between `backoff` and base x the last wait: base 3 with 10
# retries waits out a store restarting for ~5 s in 95% of draws (base 2 often gave up within 2 s).
BACKOFF_BASE = 3.0


_PROXY_PREFIX = {"s3": "AWS", "gs": "GOOGLE", "az": "AZURE"}


def proxy_options(scheme: str) -> dict[str, str]:
    """The store's proxy variables (AWS_PROXY_URL, GOOGLE_PROXY_EXCLUDES, ...) as client options.

    obstore reads them only when no client options are passed, and we always pass some (timeouts):
    without this, GOOGLE_PROXY_URL and AZURE_PROXY_URL would be ignored and a credential request would
    go straight to the cloud's metadata address (measured: it did)."""
    prefix = _PROXY_PREFIX[scheme]
    names = {"proxy_url": "PROXY_URL", "proxy_excludes": "PROXY_EXCLUDES", "proxy_ca_certificate": "PROXY_CA_CERTIFICATE"}
    return {key: os.environ[f"{prefix}_{name}"] for key, name in names.items() if os.environ.get(f"{prefix}_{name}")}


def _client(config: S3Config) -> Any:
    """One obstore client per process and config (a client made before a fork is not reused after it)."""
    key = (os.getpid(), config)
    store = _STORES.get(key)
    if store is None:
        from obstore.store import AzureStore, GCSStore, S3Store

        client_options = {
            "allow_http": config.where.startswith("http://"),
            "timeout": f"{max(config.timeout, 0.001)}s",
            "connect_timeout": f"{max(config.connect_timeout, 0.001)}s",
            **proxy_options(config.scheme),
        }
        retry_config = {"max_retries": config.retries, "retry_timeout": timedelta(seconds=RETRY_TIMEOUT_S),
                        "backoff": {"init_backoff": timedelta(seconds=config.backoff), "base": BACKOFF_BASE,
                                    "max_backoff": timedelta(seconds=config.max_backoff)}}
        if config.cloud is not None:
            kind = GCSStore if config.scheme == "gs" else AzureStore
            store = kind(config.bucket, config=dict(config.cloud.config), client_options=client_options,
                         retry_config=retry_config)
        else:
            kwargs: dict[str, Any] = {"region": config.region}
            if config.endpoint:
                kwargs["endpoint"] = config.endpoint
            for name in ("access_key_id", "secret_access_key", "session_token"):
                if getattr(config, name):
                    kwargs[name] = getattr(config, name)
            store = S3Store(config.bucket, client_options=client_options, retry_config=retry_config, **kwargs)
        _STORES[key] = store
    return store


_STATUS = re.compile(r"non-2xx status code: (\d{3})")  # obstore's wording; a key in its URL is %-encoded
_CODE = re.compile(r"<Code>([^<]+)</Code>")


def http_status(error: BaseException) -> int | None:
    """The HTTP status of a failed request, or None when no answer came (refused, reset, timed out)."""
    found = _STATUS.search(str(error))
    return int(found.group(1)) if found else None


def s3_error_code(error: BaseException) -> str | None:
    """The S3 error code (`NoSuchBucket`, `NoSuchKey`, ...) from the response body obstore quotes.

    obstore exposes neither the status nor the body as attributes, only in its text; this reads the
    protocol's `<Code>` element, never the message's words (which hold the user's URL).
    """
    found = _CODE.search(str(error))
    return found.group(1) if found else None


def _summary(error: BaseException) -> str:
    text, status, code = str(error), http_status(error), s3_error_code(error)
    if status:
        return f"HTTP {status}" + (f" {code}" if code else "")
    for kind in ("Connect", "Timeout", "Request", "Body", "Decode"):
        if f"kind: {kind}" in text:
            return {"Connect": "connection failed", "Timeout": "timed out"}.get(kind, f"{kind.lower()} error")
    return text.splitlines()[0][:200] if text else type(error).__name__


def is_transient(error: BaseException) -> bool:
    """Worth another try: server errors, throttling, resets and timeouts; never 403/404/412."""
    from obstore import exceptions as ox

    final = (ox.NotFoundError, ox.PermissionDeniedError, ox.UnauthenticatedError, ox.AlreadyExistsError,
             ox.PreconditionError, ox.NotSupportedError, ox.InvalidPathError, ox.UnknownConfigurationKeyError)
    if isinstance(error, final):
        return False
    if not isinstance(error, ox.BaseError):
        return isinstance(error, (ConnectionError, TimeoutError))
    code = http_status(error)
    if code is not None:
        return code >= 500 or code in (408, 429)
    return True  # no status: the connection failed, was reset or timed out


# Credentials the client finds by itself besides the metadata address (web identity, ECS containers).
_OTHER_CREDENTIALS = ("AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                      "AWS_CONTAINER_CREDENTIALS_FULL_URI")
_ANSWERED: set[S3Config] = set()  # configs whose requests have succeeded in this process (or before its fork)


def _unproven_credentials(config: S3Config, error: BaseException) -> bool:
    """No credentials set, none that worked yet, and no HTTP answer: the client was asking the metadata address
    (AWS_METADATA_ENDPOINT, default 169.254.169.254) for them. Asked once, as the AWS CLI does: off a cloud
    machine nothing answers there, and retrying would only make the user wait."""
    if config.has_credentials or config in _ANSWERED or http_status(error) is not None:
        return False
    return config.scheme != "s3" or not any(os.environ.get(name) for name in _OTHER_CREDENTIALS)


def explain(error: BaseException, config: S3Config, key: str, action: str, attempts: int = 1) -> StorageError:
    """The one sentence a user sees for a failed request."""
    from obstore import exceptions as ox

    url = config.url(key)
    what = _summary(error)
    hints = HINTS[config.scheme]
    if _unproven_credentials(config, error):
        cloud = {"s3": "AWS", "gs": "Google Cloud", "az": "Azure"}[config.scheme]
        metadata = os.environ.get("AWS_METADATA_ENDPOINT") if config.scheme == "s3" else None
        return StorageError(
            f"{action} {url} at {config.where} failed ({what}) and no {cloud} credentials are set: set {hints['keys']}; "
            f"without them the client asks the cloud metadata address ({metadata or 'http://169.254.169.254'}), "
            "which answers only on a cloud machine"
        )
    if isinstance(error, (ox.PermissionDeniedError, ox.UnauthenticatedError)) or http_status(error) in (401, 403):
        return StorageError(
            f"access denied ({what}) to {url} at {config.where}: check {hints['keys']} "
            f"and the {hints['bucket']}'s permissions"
        )
    if isinstance(error, (FileNotFoundError, ox.NotFoundError)) or http_status(error) == 404:
        if s3_error_code(error) in MISSING_BUCKET_CODES:
            return BucketNotFound(
                f"{hints['bucket']} {config.bucket!r} does not exist at {config.where} (while reading {url}): "
                f"check the {hints['bucket']} name and the endpoint ({hints['endpoint']})"
            )
        return ObjectNotFound(f"{url} does not exist at {config.where}: check the path")
    if attempts != 1:  # 0: retried for RETRY_TIMEOUT_S
        hint = f"check that the endpoint is up and reachable ({hints['endpoint']})" if "connection" in what else \
            "the store kept failing; try again later or raise storage_options['retries']"
        tried = f"{attempts} attempts" if attempts else f"retrying for {RETRY_TIMEOUT_S:.0f} s"
        return StorageError(f"{action} {url} at {config.where} failed after {tried} ({what}): {hint}")
    return StorageError(f"{action} {url} at {config.where} failed ({what})")


def call(config: S3Config, key: str, action: str, fn: Callable[[], T]) -> T:
    """Run `fn` (obstore retries transient failures inside it); a failure becomes one StorageError sentence."""
    start = time.monotonic()
    try:
        with in_flight(f"{action} {config.url(key)}"):  # what the data watchdog names (llm/data/waiting.py)
            result = fn()
    except (StorageError, FileExistsError):
        raise
    except Exception as e:  # obstore raises its own exception types
        if not is_transient(e) or _unproven_credentials(config, e):
            raise explain(e, config, key, action) from None
        # obstore retried it, until its count or its time ran out
        attempts = config.retries + 1 if time.monotonic() - start < RETRY_TIMEOUT_S else 0
        raise explain(e, config, key, action, attempts) from None
    _ANSWERED.add(config)
    return result


class S3Objects:
    """The objects under one s3://, gs:// or az:// prefix, by name relative to it."""

    def __init__(self, config: S3Config, prefix: str):
        self.config, self.prefix = config, prefix

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def url(self, name: str = "") -> str:
        return self.config.url(self.key(name) if name else self.prefix).rstrip("/")

    def get(self, name: str) -> bytes:
        import obstore

        key = self.key(name)
        return call(self.config, key, "reading", lambda: bytes(obstore.get(_client(self.config), key).bytes()))

    def get_into(self, name: str, sink: Callable[[int], Any]) -> None:
        """Stream the object into `sink(1)`'s writer (obstore resumes a broken body itself)."""
        import obstore

        key = self.key(name)

        def fetch() -> None:
            write = sink(1)
            for chunk in obstore.get(_client(self.config), key).stream(min_chunk_size=1 << 20):
                write(memoryview(chunk))

        call(self.config, key, "reading", fetch)

    def put(self, name: str, data: bytes | Path, create: bool = False) -> None:
        """Write an object (a file is sent in parts); `create=True` fails if it exists (AlreadyExists)."""
        import obstore
        from obstore import exceptions as ox

        key = self.key(name)
        payload = Path(data) if isinstance(data, Path) else data

        def send() -> None:
            try:
                obstore.put(_client(self.config), key, payload, mode="create" if create else "overwrite")
            except (ox.AlreadyExistsError, ox.PreconditionError):
                raise FileExistsError(f"{self.url(name)} already exists") from None

        call(self.config, key, "writing", send)

    def delete(self, name: str) -> None:
        """Remove an object; one already gone is fine (S3 answers 204 there, GCS and Azure 404)."""
        import obstore

        key = self.key(name)
        try:
            call(self.config, key, "deleting", lambda: obstore.delete(_client(self.config), key))
        except BucketNotFound:
            raise
        except ObjectNotFound:
            pass

    def list(self) -> dict[str, int]:
        """name -> size of every object directly under the prefix."""
        import obstore

        prefix = self.prefix + "/" if self.prefix else ""

        def run() -> dict[str, int]:
            out = {}
            for batch in obstore.list(_client(self.config), prefix or None):
                for meta in batch:
                    name = meta["path"][len(prefix):]
                    if "/" not in name:
                        out[name] = int(meta["size"])
            return out

        return call(self.config, prefix, "listing", run)
