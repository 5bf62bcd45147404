"""Print the declared minimum of each named dependency in pyproject.toml as an exact pin, one a line.

`make test-min` installs these pins as pip constraints (numpy==1.24.0 ...), so the floors CI tests are
read off the one place they are declared and cannot drift from it. Usage: python .ci/floors.py numpy torch
"""

import re
import sys
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def floors(names: list[str]) -> list[str]:
    # [project]'s `dependencies = [...]` holds lines such as `"numpy>=1.24",` (the extras are not floors of
    # the package); a regex rather than tomllib, which Python 3.10 (requires-python's floor) lacks.
    block = re.search(r"^dependencies = \[(.*?)^\]", PYPROJECT.read_text(), re.M | re.S)
    found = dict(re.findall(r'^\s*"([A-Za-z0-9_.-]+)>=([0-9.]+)[",]', block.group(1) if block else "", re.M))
    pins = []
    for name in names:
        if name not in found:
            sys.exit(f"floors.py: pyproject.toml declares no '{name}>=' minimum")
        parts = found[name].split(".")
        pins.append(f"{name}=={'.'.join(parts + ['0'] * (3 - len(parts)))}")  # 1.24 -> 1.24.0, as pip names it
    return pins


if __name__ == "__main__":
    print("\n".join(floors(sys.argv[1:])))
