"""LitData's Lightning-cloud names (`optimize(num_nodes=, machine=)`, `map(...)`, `Machine`): one sentence pointing to engine="ray".

LitData spreads a job over several machines by starting them on Lightning AI's cloud (`num_nodes=2,
machine=Machine.A10G`, from a Studio). llm.data starts nothing on any cloud: work beyond one machine
runs on a Ray cluster of the user's own (docs/items.md, "The Ray engine").
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

CLOUD_ARGUMENTS = ("num_nodes", "machine")
RAY_INSTEAD = ("llm.data runs on no cloud of its own; to spread the work over several machines, pass engine='ray' "
               "(ray_address= names your Ray cluster; docs/items.md)")

F = TypeVar("F", bound=Callable[..., Any])


def machine_import_error() -> ImportError:
    """What `from llm.data import Machine` raises (LitData's `litdata.Machine`)."""
    return ImportError(f"llm.data has no Machine: LitData's Machine picks a Lightning AI cloud machine, and {RAY_INSTEAD}")


def refuse_cloud_arguments(fn: F) -> F:
    """`fn` refusing LitData's num_nodes= and machine= in one sentence (Python's own error would only name them)."""

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        given = [name for name in CLOUD_ARGUMENTS if name in kwargs]
        if given:
            names = " and ".join(f"{name}=" for name in given)
            raise TypeError(f"{fn.__name__}: {names} {'is' if len(given) == 1 else 'are'} LitData's way to run on "
                            f"Lightning AI's cloud machines, and {RAY_INSTEAD}")
        return fn(*args, **kwargs)

    return checked  # type: ignore[return-value]
