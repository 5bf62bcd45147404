"""PIL images as items: stored as their own file bytes (or lossless PNG), streamed with workers, resumed exactly."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from llm.data import StreamingDataLoader, StreamingDataset, optimize
from tests.resume import check_resume

N = 48


def _write_images(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(N):
        rng = np.random.default_rng(i)
        img = Image.fromarray(rng.integers(0, 255, (8 + i % 5, 12, 3), dtype=np.uint8))
        path = folder / f"{i:03d}.{'jpg' if i % 2 else 'png'}"
        img.save(path)
        paths.append(path)
    return paths


def _load(path: str) -> dict:
    return {"image": Image.open(path), "label": int(Path(path).stem), "path": path}


@pytest.fixture(scope="module")
def image_dataset(tmp_path_factory) -> tuple[Path, list[Path]]:
    root = tmp_path_factory.mktemp("images")
    paths = _write_images(root / "files")
    optimize(_load, [str(p) for p in paths], root / "ds", num_workers=2, chunk_size=10, progress=False)
    return root / "ds", paths


def test_images_are_stored_as_their_files_and_read_back_as_pil(image_dataset) -> None:
    folder, paths = image_dataset
    ds = StreamingDataset(folder)
    for i in (0, 1, 7):
        img = ds[i]["image"]
        assert isinstance(img, Image.Image) and img.format == ("JPEG" if i % 2 else "PNG")
        img.fp.seek(0)
        assert img.fp.read() == paths[i].read_bytes()  # the very file: no re-encoding, no quality lost
        assert np.array_equal(np.asarray(img), np.asarray(Image.open(paths[i])))


def test_an_image_made_in_memory_is_stored_losslessly_as_png(tmp_path: Path) -> None:
    pixels = np.random.default_rng(0).integers(0, 255, (5, 7, 4), dtype=np.uint8)
    modes = {"RGBA": Image.fromarray(pixels), "F": Image.fromarray(pixels[..., 0].astype(np.float32) / 3)}
    optimize(lambda m: {"img": modes[m]}, list(modes), tmp_path / "ds", num_workers=0, progress=False)
    ds = StreamingDataset(tmp_path / "ds")
    assert ds[0]["img"].format == "PNG" and np.array_equal(np.asarray(ds[0]["img"]), pixels)
    assert ds[1]["img"].mode == "F" and np.array_equal(np.asarray(ds[1]["img"]), np.asarray(modes["F"]))  # PNG cannot: kept exactly
    buf = io.BytesIO()
    ds[0]["img"].save(buf, "PNG")


def run_images(config: dict, state: dict | None, steps: int | None) -> tuple[list, dict]:
    """The resume helper's pipeline: batches of 5 decoded images (padded to 12x12) and labels."""
    ds = StreamingDataset(config["folder"], shuffle=True, seed=3)
    loader = StreamingDataLoader(ds, batch_size=5, num_workers=config["workers"], ledger=config.get("ledger"))
    if state is not None:
        loader.load_state_dict(state)
    out: list = []
    for batch in loader if steps != 0 else ():
        images = np.zeros((len(batch["image"]), 12, 12, 3), np.uint8)
        for k, img in enumerate(batch["image"]):
            arr = np.asarray(img)
            images[k, : arr.shape[0]] = arr
        out.append({"image": images, "label": batch["label"].numpy()})
        if steps is not None and len(out) >= steps:
            break
    return out, loader.state_dict()


def test_an_image_dataset_streams_with_2_workers_and_resumes_exactly(image_dataset) -> None:
    folder, _ = image_dataset
    reference = check_resume(run_images, {"folder": str(folder), "workers": 2}, stops=[0, 3, 7],
                             resume_configs=[{"folder": str(folder), "workers": 0}])
    labels = np.concatenate([step["label"] for step in reference])
    assert sorted(labels.tolist()) == list(range(N)) and labels.tolist() != list(range(N))
