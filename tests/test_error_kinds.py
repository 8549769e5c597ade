"""Every project error is one of the contract's two kinds, and the command lines map each kind to
its exit code (Refused 2, Stopped 1) with one `error:` line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import contract
from contract.errors import Refused, Stopped

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("contract", "pipelines", "dataloader", "model", "trainer", "audit", "bench")
BUILTIN = {
    "Exception",
    "ValueError",
    "RuntimeError",
    "OSError",
    "KeyError",
    "TypeError",
    "IOError",
    "LookupError",
    "ArithmeticError",
}


NOT_ERRORS = {"DryRun"}  # audit.engine: a control-flow signal (the pipeline was built, not run), exit 0


def project_error_classes() -> list[tuple[str, str, list[str]]]:
    """(file, class, base names) of every exception class of the project (a class deriving from a
    Python exception, or from one of those)."""
    found = []
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            if path == ROOT / "contract" / "errors.py":  # the two kinds themselves
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef):
                    bases = [b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases]
                    found.append((str(path.relative_to(ROOT)), node.name, [b.split(".")[-1] for b in bases]))
    exceptions, grew = set(BUILTIN) | {"Refused", "Stopped"}, True
    while grew:
        before = len(exceptions)
        exceptions |= {c for _, c, b in found if set(b) & exceptions}
        grew = len(exceptions) > before
    return [(f, c, b) for f, c, b in found if set(b) & exceptions and c not in NOT_ERRORS]


def test_every_error_class_deriving_from_a_python_exception_is_refused_or_stopped():
    classes = project_error_classes()
    assert len(classes) >= 25  # the scan sees the project's error classes
    kinds, grew = {"Refused", "Stopped"}, True
    while grew:  # a class is of a kind when one of its bases is
        before = len(kinds)
        kinds |= {c for _, c, b in classes if set(b) & kinds}
        grew = len(kinds) > before
    assert [f"{f}: {c}({', '.join(b)})" for f, c, b in classes if c not in kinds] == []


def test_the_classes_callers_catch_keep_their_python_base_and_get_their_kind():
    from contract import ManifestError
    from dataloader.source import ShardReadError
    from model.config import ModelConfigError
    from trainer.checkpointing.rules import CheckpointError, RefusedConfigError
    from trainer.loop import ResumeRefused, RunError
    from trainer.mesh import MeshError

    for cls, kind, base in [
        (ManifestError, Refused, ValueError),
        (ModelConfigError, Refused, ValueError),
        (MeshError, Refused, ValueError),
        (ShardReadError, Stopped, RuntimeError),
        (CheckpointError, Stopped, RuntimeError),
        (RunError, Stopped, RuntimeError),
    ]:
        assert issubclass(cls, kind) and issubclass(cls, base), cls
    # a refusal raised by the checkpoint code is both: a refusal (exit 2) wins
    for cls in (RefusedConfigError, ResumeRefused):
        assert contract.exit_code(cls("x")) == 2
    assert contract.exit_code(RunError("x")) == 1 and contract.exit_code(ValueError("x")) is None


@pytest.mark.parametrize("error, code", [(Refused("the config is wrong"), 2), (Stopped("a shard broke"), 1)])
def test_trainer_main_maps_each_kind_to_its_exit_code_and_one_error_line(tmp_path, monkeypatch, capsys, error, code):
    from trainer import main, preflight

    def prepare(cfg, run_dir):
        raise error

    monkeypatch.setattr(main, "init_jax", lambda args, cfg: None)
    monkeypatch.setattr(main, "ensure_sample_data", lambda cfg: None)
    monkeypatch.setattr(preflight, "prepare", prepare)
    assert main.main(["--run_dir", str(tmp_path / "run")]) == code
    assert capsys.readouterr().err.strip() == f"error: {error}"
