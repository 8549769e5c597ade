"""Every project error is one of the contract's two kinds, and the command lines map each kind to
its exit code (Refused 2, Stopped 1) with one `error:` line."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import contract
from contract.errors import Refused, Stopped

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("contract", "pipelines", "dataloader", "model", "trainer", "audit", "compare", "lessons", "bench")
# control-flow signals, not errors: audit.engine.DryRun (the pipeline was built, not run; exit 0);
# trainer.preflight.StartInterrupted (a Ctrl-C during the start-up, a KeyboardInterrupt carrying the
# lock so that main can undo the start; exit 130, tests/trainer/test_preemption.py)
NOT_ERRORS = {"DryRun", "StartInterrupted"}


def project_error_classes() -> list[tuple[str, type[BaseException]]]:
    """(module, class) of every exception class the project defines: each module that defines a
    class with a base is imported, and its classes are taken as Python sees them (``issubclass`` on
    the real objects: a class named like a kind, or deriving from one by name, is not one)."""
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path == ROOT / "contract" / "errors.py":  # the two kinds themselves
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            names = [n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.bases]
            if not names:
                continue
            module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
            for name in names:
                cls = getattr(module, name, None)
                if (
                    isinstance(cls, type)
                    and issubclass(cls, BaseException)
                    and cls.__module__ == module.__name__
                    and name not in NOT_ERRORS
                ):
                    found.append((module.__name__, cls))
    return found


@pytest.fixture(scope="module")
def error_classes():
    return project_error_classes()


def test_every_error_class_of_the_project_is_refused_or_stopped(error_classes):
    assert len(error_classes) >= 40  # the scan sees the project's error classes
    assert [f"{m}.{c.__name__}" for m, c in error_classes if not issubclass(c, (Refused, Stopped))] == []


def test_the_two_kinds_are_the_contracts_own_and_nothing_shadows_them(error_classes):
    """A module's own ``class Refused(...)`` is not contract.Refused, whatever its bases: a caller
    catching ``module.Refused`` misses the contract's, and the reverse (trainer.downstream had one)."""
    shadows = [f"{m}.{c.__name__}" for m, c in error_classes if c.__name__ in ("Refused", "Stopped")]
    assert shadows == []
    import trainer.downstream.__main__ as score_command

    assert score_command.Refused is contract.Refused


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
