"""The packages point one way and no module imports its siblings round a loop: import-linter's
contracts (pyproject.toml [tool.importlinter], run by `make check`) hold on the project, and the
same kinds of contract fail on a made-up back-arrow and a made-up loop (what they guard against)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"contract", "pipelines", "dataloader", "model", "trainer", "audit", "compare", "lessons", "bench"}


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    """`lint-imports` as make check runs it (import-linter from the dev extra), in ``cwd``."""
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True))"
    env = {**os.environ, "PYTHONPATH": str(cwd), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_import_contracts_cover_every_package_and_hold():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert set(config["root_packages"]) == PACKAGES
    by_id = {c["id"]: c for c in config["contracts"]}
    layered = {p.strip() for layer in by_id["layers"]["layers"] for p in layer.split("|")}
    assert layered == PACKAGES and by_id["layers"]["layers"][-1] == "contract"  # the leaf
    assert set(by_id["acyclic"]["ancestors"]) == PACKAGES
    proc = lint_imports(ROOT)
    assert proc.returncode == 0 and "0 broken" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_the_leakage_face_contract_names_every_module_behind_the_face():
    """pipelines/leakage/ has one face (its __init__): the forbidden contract that keeps its users on
    it lists every module behind it, so a new one there is covered the day it is added."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    face = {c["id"]: c for c in config["contracts"]}["leakage-face"]
    behind = {
        f"pipelines.leakage.{p.stem}" for p in (ROOT / "pipelines" / "leakage").glob("*.py") if p.stem != "__init__"
    }
    assert set(face["forbidden_modules"]) == behind and face["allow_indirect_imports"] is True
    assert {"audit", "pipelines.decontaminate", "pipelines.job"} <= set(face["source_modules"])


def test_the_contracts_fail_on_a_back_arrow_and_on_a_loop(tmp_path):
    files = {
        "low/__init__.py": "",
        "low/a.py": "from low import b\n",
        "low/b.py": "def f():\n    from low import a  # a lazy import inside a function counts too\n",
        "high/__init__.py": "",
        "high/c.py": "import low.a\n",
        "low/d.py": "import high.c\n",  # the back-arrow
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.importlinter]\nroot_packages = ["low", "high"]\n'
        '[[tool.importlinter.contracts]]\nid = "layers"\nname = "layers"\ntype = "layers"\nlayers = ["high", "low"]\n'
        '[[tool.importlinter.contracts]]\nid = "acyclic"\nname = "acyclic"\ntype = "acyclic_siblings"\n'
        'ancestors = ["low", "high"]\n'
    )
    proc = lint_imports(tmp_path)
    assert proc.returncode == 1 and "2 broken" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "low.d -> high.c" in proc.stdout and "No cycles are allowed in low" in proc.stdout
