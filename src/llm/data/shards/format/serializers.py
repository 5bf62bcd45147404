"""Item serializers: a layout inferred from the first item, then every item packed as one record.

The layout (JSON, stored in the manifest as `item_layout`) is a tree: dicts with string
keys, lists and tuples are structure; the leaves are `int`, `float`, `bool`, `none`,
`str`, `bytes`, `image` (a PIL image), `pickle` (anything else), `{"ndarray": dtype,
"ndim": k}`, `{"npscalar": dtype}` and `{"tensor": dtype, "ndim": k}`.

A record is one little-endian struct holding every fixed-size value (numbers, array
shapes, the lengths of variable-size values), then the variable-size payloads in leaf
order; array and tensor payloads are raw bytes at 16-byte aligned offsets, so decoding
one is a `frombuffer` view, never a pickle. Decoding needs only the record's bytes.
"""

from __future__ import annotations

import io
import pickle
import sys
from typing import Any

import numpy as np

LEAVES = ("int", "float", "bool", "none", "str", "bytes", "image", "pickle")
TENSOR_DTYPES = (
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128", "uint8", "int8", "int16",
    "int32", "int64", "uint16", "uint32", "uint64", "bool",
)
_MAX_DEPTH = 64
INT64_RANGE = (-(1 << 63), (1 << 63) - 1)


class StructureError(ValueError):
    """An item whose structure differs from the first item's; names the field path."""


class UnpicklableItem(StructureError):
    """A value stored as a pickle (the last resort) that cannot be pickled; names the field path."""


def join_path(path: str, key: object) -> str:
    if isinstance(key, str):
        return f"{path}.{key}" if path else key
    return f"{path}[{key}]"


def where(path: str) -> str:
    return f"field '{path}'" if path else "the item"


# ---- layout inference ------------------------------------------------------------------------


def _raw_dtype(dtype: np.dtype) -> bool:
    """Dtypes stored as raw bytes: no objects, no structured fields."""
    return not dtype.hasobject and dtype.fields is None and dtype.subdtype is None


def dtype_name(dtype: np.dtype) -> str:
    # Strings and raw voids vary in width from item to item: the layout keeps the kind, each
    # record its itemsize.
    return dtype.str.rstrip("0123456789") if dtype.kind in "USV" else dtype.str


def tensor_type() -> Any:
    torch = sys.modules.get("torch")  # never imported here: a tensor can only exist if torch is loaded
    return torch.Tensor if torch is not None else None


def image_type() -> Any:
    image = sys.modules.get("PIL.Image")
    return image.Image if image is not None else None


def infer_layout(value: object) -> Any:
    """The layout of one item (the first one): what every later item must match."""
    kind = type(value)
    simple = {bool: "bool", int: "int", float: "float", str: "str", bytes: "bytes", type(None): "none"}.get(kind)
    if simple is not None:
        return "pickle" if kind is int and not INT64_RANGE[0] <= value <= INT64_RANGE[1] else simple
    if kind is dict and all(type(k) is str for k in value):
        return {"dict": [[k, infer_layout(v)] for k, v in value.items()]}
    if kind in (list, tuple):
        return {kind.__name__: [infer_layout(v) for v in value]}
    if kind is np.ndarray and _raw_dtype(value.dtype):
        return {"ndarray": dtype_name(value.dtype), "ndim": value.ndim}
    if isinstance(value, np.generic) and _raw_dtype(value.dtype) and value.dtype.kind not in "USV":
        return {"npscalar": value.dtype.str}
    tensor = tensor_type()
    if tensor is not None and isinstance(value, tensor):
        name = str(value.dtype).removeprefix("torch.")
        if name in TENSOR_DTYPES and str(value.layout) == "torch.strided" and not value.is_quantized:
            return {"tensor": name, "ndim": value.dim()}
    image = image_type()
    if image is not None and isinstance(value, image):
        return "image"
    return "pickle"


def describe(layout: Any) -> str:
    """A layout node in words, for error messages."""
    if isinstance(layout, str):
        return {"none": "None", "image": "a PIL image", "pickle": "a pickled object"}.get(layout, layout)
    (kind, value), *_ = layout.items()
    if kind == "dict":
        return f"a dict with keys {[k for k, _ in value]}"
    if kind in ("list", "tuple"):
        return f"a {kind} of {len(value)}"
    if kind == "npscalar":
        return f"a numpy {np.dtype(value).name} scalar"
    dtype = np.dtype(value).name if kind == "ndarray" else value
    return f"a {dtype} {'array' if kind == 'ndarray' else 'tensor'} of {layout['ndim']} dims"


def first_difference(a: Any, b: Any, path: str = "") -> tuple[str, str, str] | None:
    """(field path, b in words, a in words) where layout b first differs from layout a, or None."""
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys() and len(a) == 1:
        kind = next(iter(a))
        if kind == "dict" and [k for k, _ in a[kind]] == [k for k, _ in b[kind]]:
            for (key, x), (_, y) in zip(a[kind], b[kind]):
                if (found := first_difference(x, y, join_path(path, key))) is not None:
                    return found
            return None
        if kind in ("list", "tuple") and len(a[kind]) == len(b[kind]):
            for i, (x, y) in enumerate(zip(a[kind], b[kind])):
                if (found := first_difference(x, y, join_path(path, i))) is not None:
                    return found
            return None
    return None if a == b else (path, describe(b), describe(a))


def check_layout(layout: Any, depth: int = 0) -> None:
    """A layout read from a manifest: every node well formed (raises ValueError naming the node)."""
    if depth > _MAX_DEPTH:
        raise ValueError(f"is nested deeper than {_MAX_DEPTH} levels")
    if isinstance(layout, str):
        if layout not in LEAVES:
            raise ValueError(f"has an unknown leaf {layout!r}")
        return
    if not isinstance(layout, dict) or not layout:
        raise ValueError(f"has a node {layout!r}, expected a leaf name or an object")
    kind = next(iter(layout))
    value = layout[kind]
    expected_keys = {"ndarray": {"ndarray", "ndim"}, "tensor": {"tensor", "ndim"}}.get(kind, {kind})
    if set(layout) != expected_keys:
        raise ValueError(f"has a node with keys {sorted(layout)}")
    if kind == "dict":
        if not isinstance(value, list) or not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in value):
            raise ValueError("has a dict node that is not a list of [key, node] pairs")
        if len({p[0] for p in value}) != len(value):
            raise ValueError("has a dict node with a repeated key")
        for _, node in value:
            check_layout(node, depth + 1)
    elif kind in ("list", "tuple"):
        if not isinstance(value, list):
            raise ValueError(f"has a {kind} node that is not a list")
        for node in value:
            check_layout(node, depth + 1)
    elif kind in ("ndarray", "npscalar"):
        try:
            dtype = np.dtype(value) if isinstance(value, str) else None
        except (TypeError, ValueError):
            dtype = None
        if dtype is None or not _raw_dtype(dtype) or (kind == "npscalar" and dtype.kind in "USV"):
            raise ValueError(f"has an {kind} node with dtype {value!r}")
    elif kind == "tensor":
        if value not in TENSOR_DTYPES:
            raise ValueError(f"has a tensor node with dtype {value!r}")
    else:
        raise ValueError(f"has an unknown node {kind!r}")
    ndim = layout.get("ndim", 0)
    if isinstance(ndim, bool) or not isinstance(ndim, int) or not 0 <= ndim <= 32:
        raise ValueError(f"has an {kind} node with ndim {ndim!r}")


# ---- images ----------------------------------------------------------------------------------


def _image_source_bytes(img: Any) -> bytes | None:
    """The file an image was opened from, when it is still readable and still describes it."""
    if not img.format:
        return None
    data = None
    name = getattr(img, "filename", None)
    fp = getattr(img, "fp", None)
    try:
        if name:
            with open(name, "rb") as f:
                data = f.read()
        elif fp is not None and hasattr(fp, "seek"):
            here = fp.tell()
            fp.seek(0)
            data = fp.read()
            fp.seek(here)
    except (OSError, ValueError):
        return None
    if not data:
        return None
    from PIL import Image

    try:  # only the header is parsed: the file must still be this image's size and mode
        head = Image.open(io.BytesIO(data))
    except Exception:
        return None
    return data if head.size == img.size and head.mode == img.mode else None


def encode_image(img: Any) -> bytes:
    """Tag 0 + the encoded file (its own JPEG/PNG... bytes, else lossless PNG); tag 1 + a pickle."""
    data = _image_source_bytes(img)
    if data is not None:
        return b"\0" + data
    buf = io.BytesIO()
    buf.write(b"\0")
    try:
        img.save(buf, format="PNG")
    except (OSError, KeyError, ValueError):  # a mode PNG cannot hold (CMYK, F, ...): keep it exactly
        return b"\1" + pickle.dumps(img, protocol=pickle.HIGHEST_PROTOCOL)
    return buf.getvalue()


def decode_image(data: memoryview) -> Any:
    from PIL import Image

    if data[0] == 1:
        return pickle.loads(data[1:])
    return Image.open(io.BytesIO(data[1:]))  # decoded lazily, on first access to its pixels
