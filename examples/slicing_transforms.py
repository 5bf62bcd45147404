"""LitData's random access, slicing and transforms with `llm.data` in place of `litdata`.

    print(len(dataset)); print(dataset[42]); print(dataset[:])       # access any item, slice the dataset
    class ImagenetStreamingDataset(StreamingDataset):                 # transform by subclassing
        def __getitem__(self, index):
            image = super().__getitem__(index)
            return F.resize(image, (224, 224))
    dataset = StreamingDataset(data_dir, transform=transform_fn)      # or pass transform=

Either way the transform runs in the loader's workers (threads or processes): batches take the
per-sample path, one Python call per sample (see docs/optimized-shards.md, "Dataset features").

Run: python examples/slicing_transforms.py
"""

import tempfile

import torch
import torch.nn.functional as F

from llm.data import StreamingDataLoader, StreamingDataset, optimize


def make_image(index):
    return {"index": index, "image": torch.full((3, 8, 8), index % 256, dtype=torch.uint8)}


class ResizedStreamingDataset(StreamingDataset):
    def __getitem__(self, index):
        item = super().__getitem__(index)
        image = F.interpolate(item["image"][None].float(), size=(4, 4), mode="nearest")[0]
        return {"index": item["index"], "image": image / 255}


def to_label(item):
    return {"image": item["image"].float(), "label": item["index"] % 10}


def main(root: str) -> None:
    optimize(fn=make_image, inputs=list(range(300)), output_dir=f"{root}/images", chunk_bytes="16KB",
             num_workers=2, progress=False)

    dataset = StreamingDataset(f"{root}/images")
    print("len:", len(dataset), "| dataset[42]['index']:", dataset[42]["index"], "| dataset[-1]['index']:", dataset[-1]["index"])
    assert [item["index"] for item in dataset[:]] == list(range(300))  # a list, like LitData's dataset[:]
    assert [item["index"] for item in dataset[10:20:5]] == [10, 15]

    resized = ResizedStreamingDataset(f"{root}/images", shuffle=True)
    assert resized[7]["image"].shape == (3, 4, 4) and [x["index"] for x in resized[:3]] == [0, 1, 2]
    for backend in ("processes", "threads"):
        loader = StreamingDataLoader(resized, batch_size=32, num_workers=2, worker_backend=backend)
        shapes = {tuple(batch["image"].shape[1:]) for batch in loader}
        assert shapes == {(3, 4, 4)}, shapes
    print("subclass with __getitem__: batches of", shapes.pop(), "images, in worker processes and threads")

    labelled = StreamingDataset(f"{root}/images", transform=to_label)
    batch = next(iter(StreamingDataLoader(labelled, batch_size=16, num_workers=2)))
    assert batch["label"].tolist() == [i % 10 for i in range(16)]
    print("transform=to_label: labels of the first batch", batch["label"][:8].tolist())


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as root:
        main(root)
