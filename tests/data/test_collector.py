"""`collector_paused()` holds the garbage collector off in its block and leaves it as it found it, errors included;
`keep_freed_memory()` makes a (local engine's) worker reuse the pages it frees instead of faulting in fresh ones."""

import gc
import re
import subprocess
import sys

import pytest

from llm.data.collector import collector_paused
from llm.data.tokenize.tokenizers import load_tokenizer


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_paused_in_the_block_and_left_as_found(enabled):
    (gc.enable if enabled else gc.disable)()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert gc.isenabled() is enabled
        with pytest.raises(KeyError), collector_paused():
            raise KeyError("x")
        assert gc.isenabled() is enabled
    finally:
        gc.enable()


def test_loading_a_tokenizer_leaves_the_collector_on_even_when_the_file_is_refused_by_name(tmp_path):
    assert gc.isenabled()
    load_tokenizer("simple")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=re.escape(f"tokenizer file {bad} is not a tokenizer.json")):
        load_tokenizer(str(bad))
    assert gc.isenabled()


# numpy temporaries of 8 MB made and freed again and again, as a batch loop does: the page faults it takes
_CHURN = """
import resource, numpy as np
def churn():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(30):
        x = np.ones(1 << 20, dtype=np.uint64)
        y = np.cumsum(x * 3)
        del x, y
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
"""


def _churn_faults(setup: str) -> int:
    code = _CHURN + setup + "\nprint(churn())"
    return int(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)


glibc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's (Linux)")


@glibc
def test_a_heap_that_keeps_freed_memory_takes_a_fraction_of_the_page_faults():
    as_is = _churn_faults("")
    kept = _churn_faults("from llm.data.collector import keep_freed_memory\nassert keep_freed_memory()")
    # 30 rounds of 16 MB: ~120k faults as glibc gives the pages back; kept, only the first round's ~4k
    assert kept * 5 < as_is, (kept, as_is)


_IN_WORKERS = """
from llm.data.jobs.local import run_local
from llm.data.jobs.tasks import Tasks

class Bar:
    desc = "churn"
    def update(self, n=1): pass
    def set_postfix(self, *args, **kwargs): pass

for keep in (True, False):
    faults = []
    run_local(Tasks(work=lambda task_id, report: churn(), count=1, on_done=lambda i, r: faults.append(r),
                    keep_freed_memory=keep), 1, Bar())
    print(faults[0])
"""


@glibc
def test_the_local_engines_workers_keep_freed_memory_when_their_tasks_ask():
    # in a fresh process: a parent whose glibc already raised its mmap threshold would fork workers that reuse
    # their pages anyway
    code = _CHURN + _IN_WORKERS
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    kept, as_is = int(out[0]), int(out[1])
    assert kept * 5 < as_is, (kept, as_is)  # asked for by the task only (dedup's)
