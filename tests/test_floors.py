"""`make test-min` installs pyproject.toml's declared minimums, as .ci/floors.py reads them off it."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _floors_module():
    spec = importlib.util.spec_from_file_location("ci_floors", ROOT / ".ci" / "floors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib, the reference parser, came in Python 3.11")
def test_the_pins_are_the_declared_minimums_of_the_package() -> None:
    import tomllib
    from packaging.requirements import Requirement

    declared = {}
    for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        requirement = Requirement(line)
        declared[requirement.name] = next(s.version for s in requirement.specifier if s.operator == ">=")
    pins = _floors_module().floors(["numpy", "pyarrow", "torch"])
    assert len(pins) == 3
    for pin in pins:
        name, version = pin.split("==")
        assert version.split(".")[:len(declared[name].split("."))] == declared[name].split("."), (pin, declared[name])
        assert len(version.split(".")) == 3  # 1.24 -> 1.24.0: the release pip installs for ==1.24


def test_a_dependency_without_a_declared_minimum_is_refused() -> None:
    with pytest.raises(SystemExit, match="declares no 'tiktoken>=' minimum"):  # an extra's, not the package's
        _floors_module().floors(["tiktoken"])
