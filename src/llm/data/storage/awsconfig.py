"""The standard AWS settings: AWS_* environment variables, then the profile in ~/.aws/credentials
and ~/.aws/config (AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE, AWS_PROFILE), as the AWS CLI reads them."""

from __future__ import annotations

import configparser
import os
from pathlib import Path

_ENV = {
    "access_key_id": ("AWS_ACCESS_KEY_ID",),
    "secret_access_key": ("AWS_SECRET_ACCESS_KEY",),
    "session_token": ("AWS_SESSION_TOKEN",),
    "endpoint": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
}
_FILE_KEYS = {"aws_access_key_id": "access_key_id", "aws_secret_access_key": "secret_access_key",
              "aws_session_token": "session_token", "endpoint_url": "endpoint", "region": "region"}


def _read(path: Path, section: str) -> dict[str, str]:
    if not path.is_file():
        return {}
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path)
    except configparser.Error as e:
        raise ValueError(f"cannot read the AWS settings file {path}: {e}") from None
    if not parser.has_section(section):
        return {}
    found = {}
    for key, value in parser.items(section):
        if key in _FILE_KEYS and value.strip():
            found[_FILE_KEYS[key]] = value.strip()
        elif key == "s3":  # nested "s3 =\n  endpoint_url = ..." block of ~/.aws/config
            for line in value.splitlines():
                name, _, nested = line.partition("=")
                if name.strip() == "endpoint_url" and nested.strip():
                    found.setdefault("endpoint", nested.strip())
    return found


def aws_settings(profile: str | None = None) -> dict[str, str]:
    """Settings for one profile; the environment wins over the files, as with the AWS CLI."""
    profile = profile or os.environ.get("AWS_PROFILE") or "default"
    home = Path(os.path.expanduser("~"))
    creds = Path(os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials")
    config = Path(os.environ.get("AWS_CONFIG_FILE") or home / ".aws" / "config")
    settings: dict[str, str] = {}
    settings.update(_read(config, profile if profile == "default" else f"profile {profile}"))
    settings.update(_read(creds, profile))
    env_keys = {}
    for key, names in _ENV.items():
        for name in names:
            if os.environ.get(name):
                env_keys[key] = os.environ[name]
                break
    if "access_key_id" in env_keys:  # keys from the environment come as a set: no mixing with a file's
        for key in ("access_key_id", "secret_access_key", "session_token"):
            settings.pop(key, None)
    settings.update(env_keys)
    return settings
