"""`model` is a layer of its own: it imports nothing from the rest of the project, and its
modules import each other one way (no cycle, not even through a function-local import)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "model"


def _loaded_packages(statement: str) -> set[str]:
    """Top-level names in sys.modules after `statement`, run in a fresh interpreter."""
    code = f"import sys; {statement}; print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


def test_importing_model_imports_no_other_project_package():
    loaded = _loaded_packages("import model")
    assert {"model", "jax", "flax"} <= loaded  # the probe sees what `import model` pulled in
    others = {"pipelines", "dataloader", "trainer", "bench"}
    assert not loaded & others, sorted(loaded & others)


def model_import_graph() -> dict[str, set[str]]:
    """module name → the `model.*` modules it imports anywhere in its source (top level or local)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(MODEL.glob("*.py")):
        name = "model" if path.stem == "__init__" else f"model.{path.stem}"
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps.add(node.module)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[name] = {d for d in deps if d.startswith("model.")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the directed graph as a list of nodes (first == last), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_cycle_finder_finds_a_cycle_through_a_local_import():
    assert find_cycle({"model.a": {"model.b"}, "model.b": {"model.a"}}) == ["model.a", "model.b", "model.a"]
    assert find_cycle({"model.a": {"model.b"}, "model.b": set()}) is None


def test_model_modules_import_each_other_without_a_cycle():
    graph = model_import_graph()
    assert {"model.config", "model.transformer", "model.param_sharding", "model.axis_rules"} <= set(graph)
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
    assert graph["model.axis_rules"] == set()  # the rules are a leaf: everything may use them
