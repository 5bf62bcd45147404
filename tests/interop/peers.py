"""Import the peers (litdata, MosaicML streaming) for the interop tests, or skip with the reason."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path

import pytest


def litdata():
    """The litdata package, or skip (install: `pip install --no-deps litdata`, see pyproject's bench extra)."""
    return pytest.importorskip("litdata", reason="litdata is not installed (`pip install --no-deps litdata`)")


def _stub_torchvision() -> None:
    # MosaicML streaming imports torchvision at package import for its vision datasets only; the
    # PyPI torchvision wheel does not load against a CPU torch it was not built with. MDS reading
    # and writing never touch it, so a stand-in module is enough for these tests.
    tv = types.ModuleType("torchvision")
    datasets = types.ModuleType("torchvision.datasets")
    datasets.VisionDataset = object
    datasets.CIFAR10 = object
    transforms = types.ModuleType("torchvision.transforms")
    functional = types.ModuleType("torchvision.transforms.functional")
    functional.to_tensor = lambda x: x
    tv.datasets, tv.transforms, transforms.functional = datasets, transforms, functional
    for module in (tv, datasets, transforms, functional):  # transformers probes find_spec("torchvision")
        module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)
    sys.modules.update({"torchvision": tv, "torchvision.datasets": datasets,
                        "torchvision.transforms": transforms, "torchvision.transforms.functional": functional})


def mosaic():
    """The MosaicML `streaming` package, or skip with the reason."""
    if importlib.util.find_spec("streaming") is None:
        pytest.skip("mosaicml-streaming is not installed (`pip install --no-deps mosaicml-streaming "
                    "transformers zstd Brotli python-snappy catalogue`)")
    try:
        import torchvision  # noqa: F401
    except Exception:
        _stub_torchvision()
    try:
        import streaming
    except ImportError as e:
        pytest.skip(f"mosaicml-streaming does not import here ({e})")
    return streaming


def lit_write(out: Path, fn, n: int, **kwargs) -> Path:
    """Write with litdata's own chunk writer, in this process (what each `litdata.optimize` worker runs,
    then its index merge), so the fixtures take milliseconds instead of a worker pool's seconds."""
    litdata()
    from litdata.streaming.writer import BinaryWriter

    out.mkdir(parents=True)
    writer = BinaryWriter(str(out), **kwargs)
    for i in range(n):
        writer[i] = fn(i)
    writer.done()
    writer.merge(1)
    return out


def mds_write(out: Path, compression: str | None, n: int = 80) -> Path:
    """`n` samples of every MDS column kind, written by MosaicML's MDSWriter with sha1 and xxh64 hashes."""
    from tests.interop.samples import MDS_COLUMNS, mds_sample

    streaming = mosaic()
    with streaming.MDSWriter(out=str(out), columns=MDS_COLUMNS, compression=compression, size_limit=3000,
                             hashes=["sha1", "xxh64"]) as writer:
        for i in range(n):
            writer.write(mds_sample(i))
    return out
