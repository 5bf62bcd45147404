"""LitData's image quick start: items are any picklable objects here, so PIL images go in and come out as they are.

Run: python examples/images.py   (needs Pillow; writes to a temporary folder)
"""

import tempfile

import numpy as np
import torch
from PIL import Image

from llm.data import StreamingDataLoader, StreamingDataset, optimize


def random_images(index):
    rng = np.random.default_rng(index)
    return {"index": index, "image": Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)),
            "class": int(rng.integers(10))}


def to_tensors(samples):
    """PIL images are not collated by default: turn them into a uint8 NCHW tensor."""
    images = torch.stack([torch.from_numpy(np.array(s["image"])).permute(2, 0, 1) for s in samples])
    return {"image": images, "class": torch.tensor([s["class"] for s in samples])}


def main(root: str) -> None:
    optimize(fn=random_images, inputs=list(range(200)), output_dir=f"{root}/images", num_workers=2,
             chunk_bytes="256KB", progress=False)
    dataset = StreamingDataset(f"{root}/images", shuffle=True)
    image = dataset[50]["image"]
    assert isinstance(image, Image.Image) and image.size == (32, 32)
    loader = StreamingDataLoader(dataset, batch_size=32, num_workers=2, collate_fn=to_tensors)
    batch = next(iter(loader))
    assert batch["image"].shape == (32, 3, 32, 32)
    print("dataset[50]:", image, "| first batch:", tuple(batch["image"].shape))


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as root:
        main(root)
