"""ItemCodec: one item <-> one record, following a layout from `serializers.py` (compiled once)."""

from __future__ import annotations

import pickle
import struct
from typing import Any

import numpy as np

from llm.data.shards.format.fastdecode import compile_decoder
from llm.data.shards.format.serializers import (
    INT64_RANGE,
    StructureError,
    UnpicklableItem,
    check_layout,
    describe,
    dtype_name,
    encode_image,
    image_type,
    infer_layout,
    join_path,
    tensor_type,
    where,
)

_ALIGN = 16  # array payloads start 16-byte aligned in the record: numpy and torch views need no copy


class _Out:
    """What encoding one item produces: the fixed values, the payload parts and the running size."""

    __slots__ = ("fixed", "parts", "pos")

    def __init__(self, header: int):
        self.fixed: list[Any] = []
        self.parts: list[Any] = []
        self.pos = header

    def payload(self, data: Any, size: int, align: bool = False) -> None:
        if align and self.pos % _ALIGN:
            pad = -self.pos % _ALIGN
            self.parts.append(b"\0" * pad)
            self.pos += pad
        self.parts.append(data)
        self.pos += size


class _Node:
    layout: Any

    def mismatch(self, value: Any, path: str) -> StructureError:
        return StructureError(f"{where(path)} is {describe(infer_layout(value))}, the first item's is {describe(self.layout)}")


class _Scalar(_Node):
    def __init__(self, codec: ItemCodec, layout: str):
        self.layout = layout
        self.kind = {"int": int, "float": float, "bool": bool, "none": type(None)}[layout]
        code = {"int": "q", "float": "d", "bool": "?", "none": ""}[layout]
        self.index = codec.slot(code) if code else None

    def encode(self, value: Any, path: str, out: _Out) -> None:
        if type(value) is not self.kind:
            raise self.mismatch(value, path)
        if self.index is not None:
            if self.kind is int and not INT64_RANGE[0] <= value <= INT64_RANGE[1]:
                raise StructureError(f"{where(path)} is an int that does not fit in 64 bits ({value})")
            out.fixed.append(value)


class _Blob(_Node):
    """str, bytes, images and pickles: a length in the fixed part, the bytes as payload."""

    def __init__(self, codec: ItemCodec, layout: str):
        self.layout, self.index = layout, codec.slot("Q")

    def encode(self, value: Any, path: str, out: _Out) -> None:
        kind = self.layout
        if kind == "str":
            if type(value) is not str:
                raise self.mismatch(value, path)
            data = value.encode("utf-8", "surrogatepass")
        elif kind == "bytes":
            if type(value) is not bytes:
                raise self.mismatch(value, path)
            data = value
        elif kind == "image":
            image = image_type()
            if image is None or not isinstance(value, image):
                raise self.mismatch(value, path)
            data = encode_image(value)
        else:
            data = _pickled(value, path)
        out.fixed.append(len(data))
        out.payload(data, len(data))


def _pickled(value: Any, path: str) -> bytes:
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # TypeError, PicklingError, AttributeError...: whatever the object's reduce raises
        raise UnpicklableItem(f"{where(path)} ({type(value).__name__}) cannot be pickled ({type(e).__name__}: {e}); "
                              "return only picklable values from fn, or convert this one there") from None


def _uint8_view(arr: np.ndarray) -> Any:
    """The array's bytes without a copy when possible (memoryview refuses some dtypes, e.g. datetime)."""
    try:
        return memoryview(arr.reshape(-1).view(np.uint8))
    except (ValueError, TypeError):
        return arr.tobytes()


class _Array(_Node):
    """numpy arrays: shape (and the width of string dtypes) in the fixed part, raw bytes as payload."""

    def __init__(self, codec: ItemCodec, layout: dict):
        self.layout, self.name, self.ndim = layout, layout["ndarray"], layout["ndim"]
        self.flexible = self.name[-1] in "USV"
        self.dtype = None if self.flexible else np.dtype(self.name)
        self.index = codec.slot("q" * self.ndim + ("q" if self.flexible else ""), self.ndim + self.flexible)

    def encode(self, value: Any, path: str, out: _Out) -> None:
        if type(value) is not np.ndarray or value.ndim != self.ndim or (
            value.dtype != self.dtype if self.dtype is not None else dtype_name(value.dtype) != self.name
        ):
            raise self.mismatch(value, path)
        out.fixed.extend(value.shape)
        if self.flexible:  # the width in the dtype's own unit (characters for U, bytes for S and V)
            out.fixed.append(int(value.dtype.str[len(self.name) :]))
        if value.nbytes:
            out.payload(_uint8_view(np.ascontiguousarray(value)), value.nbytes, align=True)


class _NpScalar(_Node):
    def __init__(self, codec: ItemCodec, layout: dict):
        self.layout, self.dtype = layout, np.dtype(layout["npscalar"])
        self.index = codec.slot(f"{self.dtype.itemsize}s")

    def encode(self, value: Any, path: str, out: _Out) -> None:
        if not isinstance(value, np.generic) or value.dtype != self.dtype:
            raise self.mismatch(value, path)
        out.fixed.append(value.tobytes())


class _Tensor(_Node):
    def __init__(self, codec: ItemCodec, layout: dict):
        self.layout, self.name, self.ndim = layout, layout["tensor"], layout["ndim"]
        self.index = codec.slot("q" * self.ndim, self.ndim)

    def encode(self, value: Any, path: str, out: _Out) -> None:
        tensor = tensor_type()
        if tensor is None or not isinstance(value, tensor) or value.dim() != self.ndim or (
            str(value.dtype).removeprefix("torch.") != self.name
        ):
            raise self.mismatch(value, path)
        import torch

        out.fixed.extend(value.shape)
        flat = value.detach().cpu().contiguous().reshape(-1)
        if flat.numel():
            data = flat.view(torch.uint8).numpy()
            out.payload(memoryview(data), data.nbytes, align=True)


class _Dict(_Node):
    def __init__(self, codec: ItemCodec, layout: dict):
        self.layout = layout
        self.fields = [(key, codec.build(node)) for key, node in layout["dict"]]
        self.keys = {key for key, _ in self.fields}

    def encode(self, value: Any, path: str, out: _Out) -> None:
        if type(value) is not dict or value.keys() != self.keys:
            raise self.mismatch(value, path)
        for key, node in self.fields:
            node.encode(value[key], join_path(path, key), out)


class _Sequence(_Node):
    def __init__(self, codec: ItemCodec, layout: dict):
        self.layout = layout
        (kind, nodes), *_ = layout.items()
        self.kind = list if kind == "list" else tuple
        self.nodes = [codec.build(node) for node in nodes]

    def encode(self, value: Any, path: str, out: _Out) -> None:
        if type(value) is not self.kind or len(value) != len(self.nodes):
            raise self.mismatch(value, path)
        for i, (node, v) in enumerate(zip(self.nodes, value)):
            node.encode(v, join_path(path, i), out)


_NODES = {"dict": _Dict, "list": _Sequence, "tuple": _Sequence, "ndarray": _Array, "npscalar": _NpScalar,
          "tensor": _Tensor}


class ItemCodec:
    """Encodes items of one layout to records and back; built from the first item or a manifest."""

    def __init__(self, layout: Any):
        check_layout(layout)
        self.layout = layout
        self._codes: list[str] = ["<"]
        self._count = 0
        self.root = self.build(layout)
        self.fixed = struct.Struct("".join(self._codes))
        self._decode = compile_decoder(self.root, self.fixed)

    def __getstate__(self) -> dict:
        return {"layout": self.layout}  # compiled structs do not pickle: rebuilt from the layout

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["layout"])

    @classmethod
    def for_item(cls, item: Any) -> ItemCodec:
        return cls(infer_layout(item))

    def slot(self, code: str, values: int = 1) -> int:
        """Reserve `values` fixed values (struct `code`); returns the index of the first."""
        self._codes.append(code)
        self._count += values
        return self._count - values

    def build(self, layout: Any) -> Any:
        if isinstance(layout, str):
            return _Scalar(self, layout) if layout in ("int", "float", "bool", "none") else _Blob(self, layout)
        return _NODES[next(iter(layout))](self, layout)

    def encode(self, item: Any) -> bytes:
        """The item's record; StructureError (naming the field) when it does not fit the layout."""
        out = _Out(self.fixed.size)
        self.root.encode(item, "", out)
        return b"".join([self.fixed.pack(*out.fixed), *out.parts])

    def decode(self, record: bytes | bytearray | memoryview) -> Any:
        """The item of one record (arrays and tensors are views of one private, writable copy)."""
        buf = record if isinstance(record, bytearray) else bytearray(record)
        item, used = self._decode(buf)
        if used != len(buf):  # also catches a payload that ran past the end (it was cut short)
            raise ValueError(f"the record has {len(buf)} bytes, its layout accounts for {used}")
        return item
