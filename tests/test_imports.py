"""The import structure, read statically: no cycles (in llm and in bench), data never imports training or cli, small modules.

Every `import` / `from ... import` statement counts, also those inside functions
(a lazy import is still a dependency). An import of `a.b.c` is an edge to the most
specific module of the package that it names (`from pkg import sub` names `pkg.sub`
when that is a module); packages are not implied by their submodules, since Python
importing a parent `__init__` first is no dependency of ours.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "llm"
MAX_LINES = 400  # per module of the package


def find_modules(src: Path = SRC, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every .py of the package (a package is its __init__.py)."""
    found = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _target(dotted: str, modules: dict[str, Path]) -> str | None:
    """The most specific module of ours that `dotted` names (None for other packages)."""
    parts = dotted.split(".")
    while parts:
        name = ".".join(parts)
        if name in modules:
            return name
        parts.pop()
    return None


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that module `name` imports, anywhere in its body."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(t for alias in node.names if (t := _target(alias.name, modules)))
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, up level - 1 more
                base_parts = name.split(".") if is_package else name.split(".")[:-1]
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                target = _target(f"{base}.{alias.name}", modules) or _target(base, modules)
                if target:
                    found.add(target)
    found.discard(name)
    return found


def import_graph(src: Path = SRC, package: str = PACKAGE) -> dict[str, set[str]]:
    modules = find_modules(src, package)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _in(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def forbidden(graph: dict[str, set[str]], importer: str, imported: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{m} imports {t}" for m, targets in graph.items() if _in(m, importer) for t in targets if any(_in(t, p) for p in imported)
    )


def test_the_checker_sees_lazy_relative_and_cyclic_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import a\n")
    (pkg / "sub" / "a.py").write_text("def f():\n    from pkg.sub.b import g\n")
    (pkg / "sub" / "b.py").write_text("from .a import f\nimport os\n")
    (pkg / "c.py").write_text("from pkg.sub import b\nimport pkg.sub.a.f\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph == {"pkg": set(), "pkg.sub": {"pkg.sub.a"}, "pkg.sub.a": {"pkg.sub.b"}, "pkg.sub.b": {"pkg.sub.a"},
                     "pkg.c": {"pkg.sub.a", "pkg.sub.b"}}
    assert cycles(graph) == [["pkg.sub.a", "pkg.sub.b"]]
    assert forbidden(graph, "pkg.c", ("pkg.sub.b",)) == ["pkg.c imports pkg.sub.b"]


def test_no_import_cycle_between_modules() -> None:
    found = cycles(import_graph())
    assert not found, f"import cycles: {found}"


def test_data_imports_neither_training_nor_cli() -> None:
    graph = import_graph()
    assert len(graph) > 40 and "llm.data.shards.read.dataset" in graph  # the walk really found the package
    assert forbidden(graph, "llm.data", ("llm.training", "llm.cli")) == []


def test_training_does_not_import_cli() -> None:
    assert forbidden(import_graph(), "llm.training", ("llm.cli",)) == []


def test_every_module_is_small() -> None:
    sizes = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in find_modules().items()}
    assert "llm.training.trainer" in sizes and "llm.data.text.stream" in sizes
    too_big = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not too_big, f"modules over {MAX_LINES} lines (split them): {too_big}"


def test_no_import_cycle_in_bench() -> None:
    graph = import_graph(SRC.parent, "bench")
    assert "bench.suite" in graph and "bench.context" in graph  # the walk really found the benchmarks
    assert not (found := cycles(graph)), f"import cycles in bench/: {found}"
