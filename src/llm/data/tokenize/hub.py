"""A Hugging Face hub tokenizer name (`gpt2`, `EleutherAI/gpt-neox-20b`) found in the local hub cache, never downloaded.

`llm-data optimize --tokenizer NAME` and `llm-train`'s `data.tokenizer_path: NAME` both reach
`load_tokenizer`, which asks `hub_tokenizer_file`; a name the cache lacks is `missing_sentence`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# A repository id: NAME or ORG/NAME (the hub's own rule, without its length limits).
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def looks_like_repo_id(spec: str) -> bool:
    """Whether `spec` could name a hub repository (a relative path of one or two parts could too)."""
    return bool(_REPO_ID.match(spec)) and not spec.endswith((".json", ".tiktoken")) and ".." not in spec


def hub_cache_dir() -> Path:
    """The hub cache as huggingface_hub finds it, read now: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def hub_tokenizer_file(repo_id: str, filename: str = "tokenizer.json") -> Path | None:
    """The cached `filename` of model repository `repo_id`, or None: no network is used.

    huggingface_hub's `try_to_load_from_cache` (the snapshot `refs/main` names) when it is
    installed; else, or for a repository cached at another revision only, the newest snapshot
    holding the file (`models--ORG--NAME/snapshots/*/tokenizer.json`).
    """
    if not looks_like_repo_id(repo_id):
        return None
    cache = hub_cache_dir()
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        try_to_load_from_cache = None
    if try_to_load_from_cache is not None:
        try:
            found = try_to_load_from_cache(repo_id, filename, cache_dir=str(cache))
        except Exception:  # a name huggingface_hub refuses as a repository id: not in its cache either
            found = None
        if isinstance(found, str) and Path(found).is_file():  # else None, or its "known to be absent" marker
            return Path(found)
    snapshots = cache / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    candidates = [p for p in snapshots.glob(f"*/{filename}") if p.is_file()]
    return max(candidates, key=lambda p: p.stat().st_mtime) if candidates else None


def missing_sentence(spec: str) -> str:
    """The one sentence for a tokenizer name that is neither a file here nor in the local hub cache."""
    return (
        f"tokenizer {spec!r} is neither a file here nor a Hugging Face tokenizer in the local hub cache "
        f"{hub_cache_dir()} (nothing is downloaded): on a machine with network run `hf download {spec} "
        "tokenizer.json` (older huggingface_hub: `huggingface-cli download`), copy the file it prints here and give "
        "its path where you gave the name, or set $HF_HUB_CACHE to a copied hub cache"
    )
