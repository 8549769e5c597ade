"""Imports live at a module's top. One inside a function is there for a reason that the code says
where it stands: it orders JAX's start-up (after the platform and libtpu flags are set), keeps a
heavy or optional dependency out of a light path (Apache Beam out of `audit --help`, tokamax,
olmo_eval, torch, wandb), keeps a measured child process to what it measures, or dodges a real
cycle. The reason is a comment on the import's line or the line above; the imports that directly
follow an explained one (a block, no blank line between) share its reason. AST only: cheap."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("contract", "pipelines", "dataloader", "model", "trainer", "audit", "compare", "lessons", "bench")


def unexplained(source: str) -> list[tuple[int, str]]:
    """(line, statement) of each import inside a function of ``source`` with no reason beside it."""
    comments = {
        tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT
    }
    explained: set[int] = set()  # ids of the explained import nodes
    out = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for body in (getattr(n, f, None) for n in ast.walk(fn) for f in ("body", "orelse", "finalbody", "handlers")):
            if not isinstance(body, list):
                continue
            previous = None
            for stmt in body:
                if isinstance(stmt, (ast.Import, ast.ImportFrom)) and id(stmt) not in explained:
                    own = {stmt.lineno - 1, *range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)}
                    follows = (
                        isinstance(previous, (ast.Import, ast.ImportFrom))
                        and id(previous) in explained
                        and stmt.lineno == (previous.end_lineno or previous.lineno) + 1
                    )
                    if own & comments or follows:
                        explained.add(id(stmt))
                    elif (stmt.lineno, ast.unparse(stmt)) not in out:
                        out.append((stmt.lineno, ast.unparse(stmt)))
                previous = stmt
    return sorted(out)


def test_every_import_inside_a_function_says_why():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {stmt}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, stmt in unexplained(path.read_text())
    ]
    assert not found, "imports inside functions with no reason (hoist them, or say why):\n" + "\n".join(found)


def test_the_rule_finds_a_bare_import_and_accepts_a_commented_block():
    bare = "def f():\n    x = 1\n    import json\n    return json\n"
    assert unexplained(bare) == [(3, "import json")]
    assert unexplained("def f():\n    # lazy: JAX after the flags\n    import jax\n    import jax.numpy as jnp\n") == []
    assert unexplained("def f():\n    import jax  # after the flags\n    import jax.numpy as jnp\n") == []
    # a blank line ends the block: the import after it needs its own reason
    assert unexplained("def f():\n    import jax  # after the flags\n\n    import numpy\n") == [(4, "import numpy")]
    # methods, nested functions and branches count; a comment elsewhere does not
    nested = "class A:\n    def m(self):\n        if x:\n            import wandb\n    # a note\n"
    assert unexplained(nested) == [(4, "import wandb")]
