"""An error raised in a DataLoader worker process reaches the caller as itself.

torch re-raises a worker's exception as a new one of its class whose message is the whole
worker traceback ("Caught ShardError in DataLoader worker process 0. Original Traceback
..."), and falls back to a RuntimeError when the class takes other arguments. Our errors
are one sentence for the user, so the worker side catches its error and sends the exception
object itself, in the place of its next item, and the main process raises it. The worker's
traceback stays available as the raised error's `__cause__` (a `WorkerTraceback`), for
whoever debugs, while `str(error)` is the sentence alone.
"""

from __future__ import annotations

import pickle
import traceback
from dataclasses import dataclass
from typing import NoReturn


class WorkerTraceback(Exception):
    """Where an error sent from a worker process was raised: its traceback there, as text."""


@dataclass(frozen=True)
class SentError:
    """An exception on its way from a worker process, with the worker's traceback as text."""

    error: Exception
    traceback: str


def send(error: Exception, where: str) -> SentError | None:
    """`error` packed for the trip to the main process; None when it would not arrive as itself
    (it does not pickle, or comes back as another class or message), so that the caller re-raises
    it and torch's wrapper, which at least carries the text, takes over."""
    try:
        back = pickle.loads(pickle.dumps(error))
    except Exception:
        return None
    if type(back) is not type(error) or str(back) != str(error):
        return None
    return SentError(error, f"in {where}:\n" + "".join(traceback.format_exception(error)).rstrip())


def reraise(sent: SentError) -> NoReturn:
    """Raise the worker's error in this process, its worker traceback chained as the cause."""
    raise sent.error from WorkerTraceback(sent.traceback)
