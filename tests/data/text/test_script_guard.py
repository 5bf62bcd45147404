"""A training script streaming s3:// text with DataLoader workers, run as a real script file.

Workers of an object-store source start from a forkserver, which re-imports the main script:
without `if __name__ == "__main__":` it either works (the same records as with the guard) or
stops before any worker starts with one sentence saying why the guard is needed, exit code 1,
never multiprocessing's bootstrap text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llm.data.storage.objects import open_objects
from tests.storage.conftest import s3_server  # noqa: F401  (the session's SeaweedFS fixture)

SRC = Path(__file__).resolve().parents[3] / "src"

_BODY = """
import json, sys
from llm.training.core.data_config import DataConfig
from llm.data.text.stream import StreamingTextDataModule

config = DataConfig(data_source="local", dataset_path=sys.argv[1], max_seq_len=16, num_workers=2,
                    storage_options=json.loads(sys.argv[2]))
module = StreamingTextDataModule(config, 4, rank=0, world_size=1, loop=False)
rows = [b["input_ids"].tolist() for b in module.train_dataloader()]
print(json.dumps(rows))
"""

_GUARDED = "def main():\n" + textwrap.indent(_BODY, "    ") + "\n\nif __name__ == '__main__':\n    main()\n"

GUARD_SENTENCE = (
    "bare.py starts DataLoader workers for object-store (s3://) text from its top-level code (line 9), and those "
    "workers start in a fresh interpreter that re-runs the script because the object-store client does not "
    'survive fork(): put the script\'s code in a function and call it under `if __name__ == "__main__":`'
)


def _run(tmp_path: Path, name: str, code: str, url: str, options: dict) -> subprocess.CompletedProcess:
    script = tmp_path / name
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(script), url, json.dumps(options)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)


@pytest.mark.timeout(300)
def test_a_script_without_the_main_guard_works_or_says_why_in_one_sentence(s3_server, tmp_path):  # noqa: F811
    url = s3_server.url()
    objects = open_objects(url, s3_server.options())
    for i in range(3):
        objects.put(f"part-{i}.txt", "".join(f"doc {i}-{n} alpha beta gamma\n" for n in range(40)).encode())
    guarded = _run(tmp_path, "guarded.py", _GUARDED, url, s3_server.options())
    assert guarded.returncode == 0, guarded.stderr[-3000:]
    want = json.loads(guarded.stdout)
    assert len(want) > 10

    bare = _run(tmp_path, "bare.py", _BODY, url, s3_server.options())
    assert "bootstrapping phase" not in bare.stderr and "exited unexpectedly" not in bare.stderr, bare.stderr[-3000:]
    if bare.returncode == 0:
        assert json.loads(bare.stdout) == want
    else:
        assert bare.returncode == 1
        lines = bare.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in bare.stderr, bare.stderr[-3000:]
        assert lines[0] == f"{tmp_path / 'bare.py'} {GUARD_SENTENCE.removeprefix('bare.py ')}"


@pytest.mark.parametrize("code, line, guarded", [
    ("import x\n\nif __name__ == '__main__':\n    run()\n", 4, True),
    ("if '__main__' == __name__:\n    run()\n", 2, True),
    ("run()\nif __name__ == '__main__':\n    pass\n", 1, False),  # started above the guard
    ("if __name__ == '__main__' and len(sys.argv) > 1:\n    run()\n", 2, True),
    ("if __name__ in ('__main__',):\n    run()\n", 2, True),
    ("if DEBUG:\n    run()\n", 2, False),
    ("def main():\n    run()\n\nmain()\n", 4, False),
    ("this is ( not python\n", 1, True),  # unreadable: multiprocessing decides
])
def test_the_guard_is_read_from_the_scripts_syntax(tmp_path, code, line, guarded):
    from llm.data.text.workers import _guarded

    script = tmp_path / "train.py"
    script.write_text(code)
    assert _guarded(str(script), line) is guarded


def test_no_check_outside_a_script(monkeypatch):
    """Under `-c`, an interactive session or `python -m package`, multiprocessing re-runs nothing."""
    import types

    from llm.data.text.workers import _reexecuted_main, require_main_guard

    bare = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", bare)
    assert _reexecuted_main() is None
    bare.__file__ = "/x/pkg/__main__.py"
    bare.__spec__ = types.SimpleNamespace(name="pkg.__main__")
    assert _reexecuted_main() is None
    bare.__spec__ = None
    assert _reexecuted_main() is bare
    require_main_guard()  # the script's top-level code is not on this call stack: nothing to say
