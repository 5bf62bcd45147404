"""LitData's item serializers, decode side: the leaf formats its `optimize` writes by default."""

from __future__ import annotations

import io
import pickle
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

# LitData's dtype tables (litdata/constants.py): the index is what a data_format like
# "no_header_tensor:16" or a tensor header stores.
TORCH_DTYPES = [
    torch.float32, torch.float, torch.float64, torch.double, torch.complex64, torch.cfloat,
    torch.complex128, torch.cdouble, torch.float16, torch.half, torch.bfloat16, torch.uint8,
    torch.int8, torch.int16, torch.short, torch.int32, torch.int, torch.int64, torch.long,
    torch.bool, torch.uint16,
]
NUMPY_DTYPES = [np.dtype(t) for t in (
    np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64, np.complex64, np.complex128, bool, object, bytes, str, np.void,
)]


def token_dtype(data_format: str) -> np.dtype:
    """The numpy dtype of a TokensLoader dataset's `no_header_tensor:N` / `no_header_numpy:N`."""
    name, _, index = data_format.partition(":")
    if name == "no_header_tensor":
        dtype = TORCH_DTYPES[int(index)]
        if dtype == torch.bfloat16:
            raise ValueError("bfloat16 tokens cannot be read as token ids")
        return torch.empty(0, dtype=dtype).numpy().dtype
    if name == "no_header_numpy":
        return NUMPY_DTYPES[int(index)]
    raise ValueError(f"token data format {data_format!r} is not one LitData's TokensLoader writes")


def _tensor(data: bytes) -> torch.Tensor:
    dtype_index, rank = struct.unpack_from(">II", data, 0)
    shape = struct.unpack_from(f">{rank}I", data, 8)
    dtype = TORCH_DTYPES[dtype_index]
    body = bytearray(data[8 + 4 * rank:])
    if not body:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(body, dtype=dtype).reshape(shape)


def _numpy(data: bytes) -> np.ndarray:
    dtype = NUMPY_DTYPES[struct.unpack_from("<I", data, 0)[0]]
    rank = struct.unpack_from("<I", data, 4)[0]
    shape = struct.unpack_from(f"<{rank}I", data, 8)
    return np.frombuffer(data[8 + 4 * rank:], dtype=dtype).copy().reshape(shape)


def _pil(data: bytes) -> Any:
    from PIL import Image

    width, height, mode_size = struct.unpack_from("<III", data, 0)
    mode = data[12:12 + mode_size].decode("utf-8")
    return Image.frombytes(mode, (width, height), data[12 + mode_size:])


def _jpeg(data: bytes) -> torch.Tensor:
    # LitData decodes with torchvision (or Pillow for EXIF-rotated files) to an RGB CHW uint8
    # tensor; Pillow gives the same layout (pixel values can differ by the decoder build).
    from PIL import Image, ImageOps

    image = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    return torch.from_numpy(np.asarray(image.convert("RGB")).copy()).permute(2, 0, 1).contiguous()


def _no_header_tensor(index: str) -> Callable[[bytes], torch.Tensor]:
    dtype = TORCH_DTYPES[int(index)]

    def decode(data: bytes) -> torch.Tensor:
        return torch.frombuffer(bytearray(data), dtype=dtype) if data else torch.empty((0,), dtype=dtype)

    return decode


def _no_header_numpy(index: str) -> Callable[[bytes], np.ndarray]:
    dtype = NUMPY_DTYPES[int(index)]
    return lambda data: np.frombuffer(data, dtype=dtype).copy()


_PLAIN: dict[str, Callable[[bytes], Any]] = {
    "str": lambda d: d.decode("utf-8"),
    "text": lambda d: d.decode("utf-8"),
    "bool": lambda d: d[0] != 0,
    "int": lambda d: struct.unpack("<q", d)[0],
    "float": lambda d: struct.unpack("<d", d)[0],
    "bytes": bytes,
    "numpy": _numpy,
    "tensor": _tensor,
    "pickle": pickle.loads,
    "pil": _pil,
    "jpeg": _jpeg,
}


def leaf_decoder(data_format: str) -> Callable[[bytes], Any]:
    """The decoder of one leaf format, or a ValueError naming it and the way out."""
    name, _, arg = data_format.partition(":")
    if name == "no_header_tensor":
        return _no_header_tensor(arg)
    if name == "no_header_numpy":
        return _no_header_numpy(arg)
    if name in _PLAIN:
        return _PLAIN[name]
    raise ValueError(
        f"LitData leaf format {data_format!r} is not read directly; rewrite the folder with "
        "`llm-data convert SRC DST` (it reads through litdata itself) and stream DST"
    )


def unflatten(spec_json: str) -> Callable[[list[Any]], Any]:
    """Leaves -> the item's structure, from the index's `data_spec` (torch pytree JSON)."""
    from torch.utils import _pytree

    spec = _pytree.treespec_loads(spec_json)
    return lambda leaves: _pytree.tree_unflatten(leaves, spec)
