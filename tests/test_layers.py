"""The packages point one way, and no two modules import each other (directly or round a loop).

Read from the source (every `import`, also the lazy ones inside functions), so a new upward import
or a new cycle fails here before it can tangle the packages again.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Each package and the project packages it may import. The data contract is the leaf; the audit
# sits above the loader (it replays the loader's order) and beside the trainer (it reads the
# trainer's run record through the contract, never the trainer's code).
ALLOWED = {
    "contract": set(),
    "model": {"contract"},
    "pipelines": {"contract"},
    "dataloader": {"contract"},
    "trainer": {"contract", "model", "pipelines", "dataloader"},
    "audit": {"contract", "pipelines", "dataloader"},
    "bench": {"contract", "model", "pipelines", "dataloader", "trainer", "audit"},
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """{module: project modules it imports}, from the AST of every file of the packages."""
    modules = {_module_name(p): p for pkg in ALLOWED for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                # `from pkg import mod` imports the module pkg.mod when there is one
                targets = [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in modules:  # `import a.b.c` of a name inside a module
                    t = t.rpartition(".")[0]
                if t and t != name:
                    graph[name].add(t)
    return {m: graph.get(m, set()) for m in modules}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), as sorted lists."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _package(module: str) -> str:
    return module.split(".")[0]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{m} imports {t}"
        for m, ts in graph.items()
        for t in ts
        if _package(t) != _package(m) and _package(t) not in ALLOWED[_package(m)]
    )


def test_packages_only_import_the_layers_below():
    upward = upward_imports(import_graph())
    assert not upward, "imports against the package layers:\n" + "\n".join(upward)


def test_no_module_imports_itself_round_a_loop():
    assert cycles(import_graph()) == []


def test_the_checks_see_a_cycle_and_an_upward_import():
    """The two tests above on a made-up graph: they would fail on the tangles they guard against."""
    assert cycles({"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a.w": {"a.x"}}) == [["a.x", "a.y", "a.z"]]
    assert upward_imports({"contract.run": {"dataloader.plan"}, "dataloader.plan": {"contract.run"}}) == [
        "contract.run imports dataloader.plan"
    ]
    graph = import_graph()  # it sees lazy imports inside functions and package-relative ones
    assert "pipelines.olmo_mix" in graph["pipelines.mixture"]  # inside the from-olmo-mix CLI
    assert "contract.records" in graph["contract.manifest"]  # `from .records import ...`
