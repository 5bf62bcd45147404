"""A record decoder generated for one layout: straight-line Python instead of a walk over nodes.

Decoding runs once per item read, so its overhead is the reader's: a generated function with
the layout's slots and dtypes as constants is about twice as fast as calling a method per
node. Only integers and names we make go into the source; every value from the manifest
(keys, dtypes) is passed in as a bound constant, never pasted into code.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from llm.data.shards.format.serializers import decode_image

_ALIGN = 16


class _Gen:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.consts: dict[str, Any] = {}
        self.n = 0

    def const(self, value: Any) -> str:
        name = f"K{len(self.consts)}"
        self.consts[name] = value
        return name

    def var(self) -> str:
        self.n += 1
        return f"x{self.n}"

    def emit(self, line: str, indent: int = 1) -> None:
        self.lines.append("    " * indent + line)


def _array(g: _Gen, node: Any, out: str, torch_tensor: bool) -> None:
    i, ndim = node.index, node.ndim
    shape = "(" + "".join(f"v[{i + d}], " for d in range(ndim)) + ")"
    if torch_tensor:
        import torch

        dtype = g.const(getattr(torch, node.name))
        itemsize = getattr(torch, node.name).itemsize
    elif node.flexible:  # string widths vary per record: the dtype is built from the stored width
        dtype = g.var()
        g.emit(f"{dtype} = DTYPE({g.const(node.name)} + str(v[{i + ndim}]))")
        itemsize = None
    else:
        dtype = g.const(node.dtype)
        itemsize = node.dtype.itemsize
    count = "*".join([f"v[{i + d}]" for d in range(ndim)] or ["1"])
    size = f"{count} * {itemsize if itemsize is not None else dtype + '.itemsize'}"
    g.emit(f"s = {shape}")
    g.emit(f"n = {size}")
    g.emit("if n:")
    g.emit(f"c += -c % {_ALIGN}", 2)
    if torch_tensor:
        g.emit(f"{out} = FROMBUFFER_T(buf, dtype={dtype}, count={count}, offset=c).reshape(s)", 2)
    else:
        g.emit(f"{out} = FROMBUFFER(buf, {dtype}, {count}, c).reshape(s)", 2)
    g.emit("c += n", 2)
    g.emit("else:")
    g.emit(f"{out} = {'ZEROS_T(s, dtype=' + dtype + ')' if torch_tensor else 'ZEROS(s, ' + dtype + ')'}", 2)


def _node(g: _Gen, node: Any, out: str) -> None:
    layout = node.layout
    if isinstance(layout, str):
        if layout == "none":
            g.emit(f"{out} = None")
        elif layout in ("int", "float", "bool"):
            g.emit(f"{out} = v[{node.index}]")
        else:
            g.emit(f"n = v[{node.index}]")
            piece = "mv[c:c + n]"
            expr = {"str": f"str({piece}, 'utf-8', 'surrogatepass')", "bytes": f"bytes({piece})",
                    "image": f"DECODE_IMAGE({piece})", "pickle": f"LOADS({piece})"}[layout]
            g.emit(f"{out} = {expr}")
            g.emit("c += n")
        return
    kind = next(iter(layout))
    if kind in ("ndarray", "tensor"):
        _array(g, node, out, kind == "tensor")
    elif kind == "npscalar":
        g.emit(f"{out} = FROMBUFFER(v[{node.index}], {g.const(node.dtype)})[0]")
    elif kind == "dict":
        parts = []
        for key, child in node.fields:
            var = g.var()
            _node(g, child, var)
            parts.append(f"{g.const(key)}: {var}")
        g.emit(f"{out} = {{{', '.join(parts)}}}")
    else:
        names = []
        for child in node.nodes:
            var = g.var()
            _node(g, child, var)
            names.append(var)
        g.emit(f"{out} = {'[' + ', '.join(names) + ']' if kind == 'list' else '(' + ''.join(n + ', ' for n in names) + ')'}")


def compile_decoder(root: Any, fixed: Any) -> Any:
    """`decode(buf: bytearray) -> (item, bytes used)` for the node tree `root` (records.py)."""
    g = _Gen()
    g.emit("v = UNPACK(buf)")
    g.emit("mv = memoryview(buf)")
    g.emit(f"c = {fixed.size}")
    _node(g, root, "item")
    g.emit("return item, c")
    source = "def decode(buf):\n" + "\n".join(g.lines) + "\n"
    namespace: dict[str, Any] = {
        "UNPACK": fixed.unpack_from, "FROMBUFFER": np.frombuffer, "ZEROS": np.zeros, "DTYPE": np.dtype,
        "LOADS": pickle.loads, "DECODE_IMAGE": decode_image, **g.consts,
    }
    if "FROMBUFFER_T" in source or "ZEROS_T" in source:
        import torch

        namespace.update(FROMBUFFER_T=torch.frombuffer, ZEROS_T=torch.zeros)
    exec(compile(source, "<item-decoder>", "exec"), namespace)  # noqa: S102 - our own generated source
    return namespace["decode"]
