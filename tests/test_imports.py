"""The import structure, read statically: the floors (nothing imports upward), no cycles (in llm and in bench), small modules.

Every `import` / `from ... import` statement counts, also those inside functions
(a lazy import is still a dependency). So does a string naming one of our modules
(`"pkg.mod"` or `"pkg.mod:attr"`) in a module that calls `import_module`: lazy re-export
tables and registries import by name. An import of `a.b.c` is an edge to the most
specific module of the package that it names (`from pkg import sub` names `pkg.sub`
when that is a module); packages are not implied by their submodules, since Python
importing a parent `__init__` first is no dependency of ours.
"""

from __future__ import annotations

import ast
import re
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


def _called(func: ast.expr) -> str:
    """The name a call is made through: `import_module` for `importlib.import_module(...)` and `import_module(...)`."""
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that module `name` imports, anywhere in its body."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    nodes = list(ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))))
    by_name = any(isinstance(n, ast.Call) and _called(n.func) == "import_module" for n in nodes)
    for node in nodes:
        if by_name and isinstance(node, ast.Constant) and isinstance(node.value, str):
            if (named := node.value.split(":")[0]) in modules:
                found.add(named)
        elif isinstance(node, ast.Import):
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


# The floors, lowest first (docs/architecture.md draws them). A module imports its own unit and
# lower floors only: never a higher floor, and never a sibling unit of its own floor, so that
# siblings stay readable alone. Data flows upward: raw bytes -> records -> ids -> streams.
FLOORS: tuple[tuple[str, ...], ...] = (
    # base: the state contract, the root seed, the topology, ingest figures, workers' errors sent as
    # themselves, the ids of documents skipped by id (the ledger marks them), what a worker waits for,
    # the garbage collector paused; `llm` holds the version
    ("llm", "llm.data.stage", "llm.data.seeds", "llm.data.topology", "llm.data.ingest_stats", "llm.data.worker_errors",
     "llm.data.skip_documents", "llm.data.waiting", "llm.data.collector"),
    # the base's ingest figures served for Prometheus (an HTTP thread); the data watchdog, which reads the
    # waiting slots (what each worker is reading, marked by storage and the streams) to name what hangs
    ("llm.data.metrics_export", "llm.data.watchdog"),
    # Pure algorithms: no I/O, nothing read, they are handed weights, counts and arrays. They sit
    # here, not above the wings as issue 34 drew them in the order data flows, because everything
    # above uses them: the inputs' MixedTextSource chooses through mix/choosers.py, and text,
    # SFT and shards pack with pack/.
    ("llm.data.mix", "llm.data.pack"),
    ("llm.data.storage",),
    # the run ledger's segments, reader and audit: bytes and counts, read by the wings that record
    ("llm.data.inputs", "llm.data.ledger"),
    ("llm.data.tokenize",),
    ("llm.data.jobs",),
    ("llm.data.text", "llm.data.shards", "llm.data.corpus_dedup"),
    ("llm.data.sft",),  # the text stage with a record cursor
    # `llm.data`'s public names and the guide's import paths re-export the wings below
    ("llm.data", "llm.data.sources", "llm.data.presets", "llm.data.dedup", "llm.data.tokenizers", "llm.data.audit"),
    ("llm.training",),
    ("llm.cli", "llm.demo"),
)
# Units that name their own module only (a package's __init__), not the modules under them:
# a new wing under llm.data must be given its floor, not fall into its parent's.
EXACT = frozenset({"llm", "llm.data"})


def unit_of(module: str, floors: tuple[tuple[str, ...], ...] = FLOORS, exact: frozenset[str] = EXACT) -> tuple[int, str] | None:
    """(floor, unit) of a module: the most specific declared unit holding it; None when it has no floor."""
    held = [(len(unit), level, unit) for level, units in enumerate(floors) for unit in units
            if module == unit or (unit not in exact and module.startswith(unit + "."))]
    return (max(held)[1], max(held)[2]) if held else None


def floor_violations(graph: dict[str, set[str]], floors: tuple[tuple[str, ...], ...] = FLOORS,
                     exact: frozenset[str] = EXACT) -> list[str]:
    """`a imports b (floor i -> j)` for every import upward or across to a sibling unit of the same floor."""
    found = []
    for module, targets in sorted(graph.items()):
        here = unit_of(module, floors, exact)
        for target in sorted(targets):
            there = unit_of(target, floors, exact)
            if here is None or there is None or there[1] == here[1]:
                continue
            if there[0] > here[0]:
                found.append(f"{module} imports {target} (floor {here[0]} -> {there[0]}: upward)")
            elif there[0] == here[0]:
                found.append(f"{module} imports {target} (floor {here[0]}: a sibling, {here[1]} -> {there[1]})")
    return found


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


def test_the_floor_checker_catches_upward_and_sibling_imports_inside_functions_too(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "a.py").write_text("import os\n\ndef f():\n    from pkg.high import g\n    return g\n")
    (pkg / "low" / "b.py").write_text("from pkg.low.a import f\n")  # its own unit: allowed
    (pkg / "side.py").write_text("def h():\n    from pkg import other\n")
    (pkg / "other.py").write_text("import importlib\nNAMES = {'g': 'pkg.high:g'}\n"
                                  "def get(n):\n    return importlib.import_module(NAMES[n].split(':')[0])\n")
    (pkg / "high.py").write_text("from pkg.low import a\ng = 1\n")  # downward: allowed
    floors = (("pkg", "pkg.low"), ("pkg.side", "pkg.other"), ("pkg.high",))
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.other"] == {"pkg.high"}  # named in a string, imported by import_module
    assert unit_of("pkg.low.a", floors, frozenset({"pkg"})) == (0, "pkg.low")
    assert unit_of("pkg.new", floors, frozenset({"pkg"})) is None  # the root names itself only
    assert floor_violations(graph, floors, frozenset({"pkg"})) == [
        "pkg.low.a imports pkg.high (floor 0 -> 2: upward)",
        "pkg.other imports pkg.high (floor 1 -> 2: upward)",
        "pkg.side imports pkg.other (floor 1: a sibling, pkg.side -> pkg.other)",
    ]


def test_every_module_sits_on_a_declared_floor() -> None:
    unplaced = [m for m in import_graph() if unit_of(m) is None]
    assert not unplaced, f"modules on no floor (add their package to FLOORS, at the floor of what it imports): {unplaced}"


def test_nothing_imports_upward_or_across_a_floor() -> None:
    graph = import_graph()
    assert "llm.data.inputs.mixture" in graph and "llm.data.mix.choosers" in graph["llm.data.inputs.mixture"]
    found = floor_violations(graph)
    assert not found, "imports against the floors (move the code to the lower floor):\n" + "\n".join(found)


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


# What chooses a mixture's next source, and what checks its weights and schedules: the mix room's alone.
_MIX_ROOM_NAMES = re.compile(r"^(_?choose(_by_tokens)?|_draw|\w*Picker|MixPlan|slot_table|quotas|period_for|check_weights|"
                             r"check_point_weights|parse_schedule|past_change|StepClock)$")


def test_no_module_outside_the_mix_room_chooses_a_source_or_checks_weights() -> None:
    found = []
    for name, path in find_modules().items():
        if _in(name, "llm.data.mix"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _MIX_ROOM_NAMES.match(node.name):
                found.append(f"{name}.{node.name}")
    assert not found, f"only llm.data.mix may choose sources or check weights and schedules: {found}"
    graph = import_graph()
    for mixer in ("llm.data.inputs.mixture", "llm.data.text.dataset", "llm.data.shards.mix.combined"):
        assert any(_in(t, "llm.data.mix") for t in graph[mixer]), f"{mixer} mixes without the mix room"
