"""The standard AWS settings: AWS_* environment variables, then the profile in ~/.aws/credentials
and ~/.aws/config (AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE, AWS_PROFILE), each with where it came from.

Our own small reader, not botocore's or obstore's: botocore is not a runtime dependency, and it keeps
inline comments in values (`endpoint_url = http://localhost:9000  # MinIO endpoint`, as LitData's
README writes it, becomes an endpoint with a comment in it), while obstore reads only the
environment. Here a `#` or `;` after whitespace starts a comment, as the AWS SDKs' shared-config
format (Rust, Kotlin, Java) reads these files. Every value keeps its source, so a bad one is named
by its variable, or by its file and line.
"""

from __future__ import annotations

import configparser
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

_ENV = {
    "access_key_id": ("AWS_ACCESS_KEY_ID",),
    "secret_access_key": ("AWS_SECRET_ACCESS_KEY",),
    "session_token": ("AWS_SESSION_TOKEN",),
    "endpoint": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
}
_FILE_KEYS = {"aws_access_key_id": "access_key_id", "aws_secret_access_key": "secret_access_key",
              "aws_session_token": "session_token", "endpoint_url": "endpoint", "region": "region"}
_INLINE_COMMENT = re.compile(r"\s[#;].*$")

Sourced = dict[str, tuple[str, str]]  # setting -> (value, where it came from: a variable, or "KEY in FILE line N")


def _line_of(path: Path, key: str) -> int | None:
    """The line of `key = ...` in `path` (the last one, as configparser keeps the last); None when not found."""
    pattern = re.compile(rf"^\s*{re.escape(key)}\s*=", re.IGNORECASE)
    found = None
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if pattern.match(line):
            found = number
    return found


def _where(path: Path, key: str) -> str:
    line = _line_of(path, key)
    return f"{key} in {path}" + (f" line {line}" if line else "")


def _read(path: Path, section: str) -> Sourced:
    if not path.is_file():
        return {}
    parser = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=("#", ";"))
    try:
        parser.read(path)
    except configparser.Error as e:
        raise ValueError(f"cannot read the AWS settings file {path}: {e}") from None
    if not parser.has_section(section):
        return {}
    found: Sourced = {}
    for key, value in parser.items(section):
        if key in _FILE_KEYS and value.strip():
            found[_FILE_KEYS[key]] = (value.strip(), _where(path, key))
        elif key == "s3":  # nested "s3 =\n  endpoint_url = ..." block of ~/.aws/config
            for line in value.splitlines():
                name, _, nested = _INLINE_COMMENT.sub("", line).partition("=")
                if name.strip() == "endpoint_url" and nested.strip():
                    found.setdefault("endpoint", (nested.strip(), _where(path, "endpoint_url")))
    return found


def aws_sources(profile: str | None = None) -> Sourced:
    """Settings for one profile with their sources; the environment wins over the files, as with the AWS CLI."""
    profile = profile or os.environ.get("AWS_PROFILE") or "default"
    home = Path(os.path.expanduser("~"))
    creds = Path(os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials")
    config = Path(os.environ.get("AWS_CONFIG_FILE") or home / ".aws" / "config")
    settings: Sourced = {}
    settings.update(_read(config, profile if profile == "default" else f"profile {profile}"))
    settings.update(_read(creds, profile))
    env_keys: Sourced = {}
    for key, names in _ENV.items():
        for name in names:
            if os.environ.get(name):
                env_keys[key] = (os.environ[name], name)
                break
    if "access_key_id" in env_keys:  # keys from the environment come as a set: no mixing with a file's
        for key in ("access_key_id", "secret_access_key", "session_token"):
            settings.pop(key, None)
    settings.update(env_keys)
    return settings


def check_endpoint(value: str, source: str) -> str:
    """`value` if it is an http(s) URL the client can use; else one sentence naming `source`.

    The client (obstore) panics on a malformed URI mid-request, with a Rust backtrace; this catches it first.
    """
    parts = urlsplit(value) if not re.search(r"\s", value) else None
    try:
        port_ok = parts is not None and (parts.port is None or parts.port > 0)
    except ValueError:  # a port that is not a number or out of range
        port_ok = False
    if not (parts and parts.scheme in ("http", "https") and parts.hostname and port_ok
            and not parts.query and not parts.fragment):
        raise ValueError(f"{source} is {value!r}, not an endpoint URL; expected http://HOST:PORT or https://HOST "
                         "(e.g. http://127.0.0.1:9000), with no spaces or comments in it")
    return value
