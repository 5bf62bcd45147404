"""How a text stream's DataLoader workers start: forked, or from a forkserver for object storage;
how deep their queue is, and how wide its pipe.

obstore's runtime hangs in a process forked after the parent used it (listing the objects
did), so workers of a source in object storage start from a forkserver. Such workers
re-run the main script; a script that starts them from its top-level code without
`if __name__ == "__main__":` would start them again in each worker, and multiprocessing
kills it with its bootstrap text. `require_main_guard` says so in one sentence first.
"""

from __future__ import annotations

import ast
import fcntl
import multiprocessing
import sys
from multiprocessing.context import BaseContext
from types import FrameType, ModuleType
from typing import Any

from torch.utils.data import DataLoader

from llm.data.text.ring import MessageRing
from llm.data.text.wire import windows_bytes
from llm.data.watchdog import Watchdog


class MainGuardError(SystemExit):
    """The main script starts object-store workers from unguarded top-level code.

    A SystemExit: the script exits with code 1 and the one sentence, never a traceback,
    which is all a script that cannot run as written needs to show.
    """


def _is_main_guard(node: ast.stmt) -> bool:
    """A top-level `if` that tests `__name__` against "__main__" (`==`, `in`, combined with `and`, ...).

    Lenient on purpose: a guard written some other way is let through, and multiprocessing
    has the last word, so a script that works is never stopped.
    """
    if not isinstance(node, ast.If):
        return False
    parts = list(ast.walk(node.test))
    return (any(isinstance(p, ast.Name) and p.id == "__name__" for p in parts)
            and any(isinstance(p, ast.Constant) and p.value == "__main__" for p in parts))


def _guarded(path: str, line: int) -> bool:
    """Whether `line` of the script at `path` lies inside a top-level main guard (unreadable: assume so)."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return True  # nothing to go on: let multiprocessing decide
    return any(_is_main_guard(n) and n.lineno <= line <= (n.end_lineno or n.lineno) for n in tree.body)


def _reexecuted_main() -> ModuleType | None:
    """The main module when a spawned/forkserver child re-runs it (a script or `-m module`), else None."""
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__file__", None) is None:
        return None  # an interactive session or `-c`: nothing is re-run
    name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    if name == "__main__" or name.endswith(".__main__"):
        return None  # `python -m package`: multiprocessing does not re-run a package's __main__
    return main


def _top_level_line(main: ModuleType, frame: FrameType | None) -> int | None:
    """The line of the main script's top-level code on the current call stack, if it is there."""
    while frame is not None:
        if frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>":
            return frame.f_lineno
        frame = frame.f_back
    return None


def require_main_guard() -> None:
    """Raise MainGuardError when workers that re-run the main script are started from its unguarded top level."""
    main = _reexecuted_main()
    if main is None:
        return
    line = _top_level_line(main, sys._getframe(1))
    if line is None or _guarded(main.__file__, line):  # type: ignore[arg-type]
        return
    raise MainGuardError(
        f"{main.__file__} starts DataLoader workers for object-store (s3://) text from its top-level code "
        f"(line {line}), and those workers start in a fresh interpreter that re-runs the script because the "
        "object-store client does not survive fork(): put the script's code in a function and call it "
        "under `if __name__ == \"__main__\":`"
    )


# Pipe capacity asked for the workers' queues (Linux's default ceiling, /proc/sys/fs/pipe-max-size).
# Why: a message of ~256k tokens is 512 KB or more; through a 64 KB pipe the worker's feeder thread and
# the main process take turns eight times a message, each turn a wake-up and a context switch. On two
# cores this took 10% of the steady stream's time (bench onthefly).
PIPE_BYTES = 1 << 20
# Tokens a worker may have ready ahead of the main process (DataLoader's prefetch_factor, in messages).
# Why: at the DataLoader's default of 2 messages, a worker stalls whenever the main process is late by
# two messages, and on a machine with as many workers as cores it is late often: at 8 messages of
# ~128k tokens the on-the-fly stream ran 25% faster on 2 cores. The state is exact whatever the depth
# (a batch's cursors apply when it is handed over); what is read ahead is dropped at an epoch's end.
AHEAD_TOKENS = 1 << 20


def widen_pipe(queue: Any, size: int = PIPE_BYTES) -> None:
    """Ask for a `size`-byte pipe under a multiprocessing queue; where that is refused (another OS, a
    lower ceiling, the user's pipe quota), the queue keeps its pipe: only slower."""
    try:
        fcntl.fcntl(queue._reader.fileno(), fcntl.F_SETPIPE_SZ, size)
    except (AttributeError, OSError, ValueError):
        pass


def wide_pipe_context(method: str | None) -> BaseContext:
    """A multiprocessing context like `method`'s (None: the default start method) whose queues have wide
    pipes (`widen_pipe`): the DataLoader makes its queues from the context it is given."""
    base = multiprocessing.get_context(method or multiprocessing.get_start_method())

    class WidePipes(type(base)):  # type: ignore[misc]
        def Queue(self, maxsize: int = 0) -> Any:  # noqa: N802 (multiprocessing's name)
            queue = super().Queue(maxsize)
            widen_pipe(queue)
            return queue

    return WidePipes()


def messages_ahead(message_tokens: int, workers: int, batches_a_message: int, epoch_steps: int | None) -> int:
    """The DataLoader's `prefetch_factor`: about `AHEAD_TOKENS` per worker, 2 to 8 messages, and in a
    short epoch (`epoch_steps` batches) no more than a quarter of it read ahead, but never below 2."""
    ahead = max(2, min(8, -(-AHEAD_TOKENS // max(1, message_tokens))))
    if epoch_steps is not None:
        ahead = min(ahead, max(2, epoch_steps // (4 * workers * max(1, batches_a_message))))
    return ahead


# The most a message ring may map (text/ring.py): past it (huge batches of long sequences), the pipe.
RING_MAX_BYTES = 1 << 30


def message_ring(workers: int, ahead: int, message_bytes: int, context: BaseContext) -> MessageRing | None:
    """Shared slots for the workers' messages: as many as a worker may have ahead, the one the main process
    opens, and one spare. None (the pipe) when they would map more than `RING_MAX_BYTES` or the OS refuses."""
    slots = ahead + 2
    if workers * slots * message_bytes > RING_MAX_BYTES:
        return None
    try:
        return MessageRing(workers, slots, message_bytes, context)
    except OSError:  # no shared memory for it (a container's limits): the pipe is only slower
        return None


def text_loader(ds: Any, num_workers: int, object_store: bool, collate_fn: Any, watch: Watchdog | None = None,
                epoch_steps: int | None = None) -> DataLoader:
    """The DataLoader over whole batches of `ds` (a StreamingTextDataset); object-store workers start from a
    forkserver (checked first).

    `watch`: the module's data watchdog; its workers report what they read into its slots (llm/data/waiting.py).
    `epoch_steps`: the batches of an epoch, when it has a length (`messages_ahead`)."""
    fresh = num_workers > 0 and object_store
    if fresh:
        require_main_guard()
    kwargs: dict[str, Any] = {}
    if num_workers > 0:
        group = max(1, ds.group)
        message_tokens = group * ds.batch_size * (ds.max_seq_len + 1)
        kwargs["prefetch_factor"] = messages_ahead(message_tokens, num_workers, group, epoch_steps)
        kwargs["multiprocessing_context"] = context = wide_pipe_context("forkserver" if fresh else None)
        if ds.group > 0 and context.get_start_method() == "fork":  # forked workers inherit the shared mapping
            ds.ring = message_ring(num_workers, kwargs["prefetch_factor"],
                                   windows_bytes(ds.group * ds.batch_size, ds.max_seq_len, ds.tokenizer.vocab_size), context)
    if watch is not None and watch.slots is not None and num_workers > 0:
        kwargs["worker_init_fn"] = watch.slots.hook(None)
        watch.loader_kwargs(kwargs, processes=True)
    return DataLoader(ds, batch_size=None, num_workers=num_workers, collate_fn=collate_fn, **kwargs)
