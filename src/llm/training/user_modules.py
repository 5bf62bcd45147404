"""Users' own modules imported before a run's config is read: custom text sources register themselves there.

The guide registers a custom source from Python (`SOURCE_REGISTRY.register("s3", ...)`);
`llm-train --import my_sources` (or the YAML's top-level `import_modules: [my_sources]`,
as Axolotl's `plugins:` names code to load) runs that registration before the config's
`data_source` is checked. A module is looked up on `sys.path` with the config file's
folder and the working directory in front, so a `my_sources.py` beside the YAML works.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llm.training.core.errors import ConfigError

CONFIG_KEY = "import_modules"


def modules_to_import(tree: dict[str, Any], flags: Sequence[str], config_path: str) -> list[str]:
    """The modules of `--import` then of the YAML's `import_modules:` (removed from `tree`), each once."""
    listed = tree.pop(CONFIG_KEY, None) or []
    if isinstance(listed, str):
        listed = [listed]
    if not isinstance(listed, list) or not all(isinstance(name, str) and name for name in listed):
        raise ConfigError(f"{config_path}: key '{CONFIG_KEY}' is {listed!r}, expected a list of module names "
                          "such as [my_sources]")
    return list(dict.fromkeys([*flags, *listed]))


def import_user_modules(names: Sequence[str], config_path: str) -> None:
    """Import each module by name; a missing module or one that fails is one sentence naming it."""
    for folder in (Path.cwd(), Path(config_path).resolve().parent):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and name.split(".")[0] != exc.name.split(".")[0]:
                raise ConfigError(f"module {name!r} (--import / {CONFIG_KEY}) imports {exc.name!r}, which is not "
                                  "installed") from None
            raise ConfigError(f"module {name!r} (--import / {CONFIG_KEY}) was not found beside {config_path}, in "
                              "the working directory or on sys.path; give its importable name (my_sources for "
                              "my_sources.py)") from None
        except Exception as exc:  # the user's module raised while importing: name it, keep the cause short
            raise ConfigError(f"module {name!r} (--import / {CONFIG_KEY}) failed while importing: "
                              f"{type(exc).__name__}: {exc}") from None
