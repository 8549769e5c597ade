"""The CLI's logging: the run's own INFO lines, not libraries' start-up chatter."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_jax_backend_probe_info_is_silenced_but_its_warnings_and_our_info_show():
    code = ("import logging; from trainer import main; main.setup_logging(); import jax; jax.devices(); "
            "logging.getLogger('jax._src.xla_bridge').warning('a jax warning'); "
            "logging.getLogger('trainer.loop').info('our info')")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": ""}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Unable to initialize backend" not in proc.stderr
    assert "INFO jax" not in proc.stderr
    assert "WARNING jax._src.xla_bridge: a jax warning" in proc.stderr
    assert "INFO trainer.loop: our info" in proc.stderr


def test_an_init_from_that_is_not_there_is_a_refused_config_not_a_traceback(data_manifest, tmp_path):
    from tests.trainer.conftest import trainer_cmd, trainer_env

    wrong = tmp_path / "wrong" / "path"
    proc = subprocess.run(trainer_cmd(data_manifest, tmp_path / "run", "steps=1", f"checkpoint.init_from={wrong}"),
                          cwd=ROOT, env=trainer_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"error: checkpoint.init_from={wrong}: no ['params', 'opt_state'] item there" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_librarys_error_with_a_traceback_is_logged_as_one_line_but_olmaxs_own_records_are_not():
    """asyncio's "Task exception was never retrieved" for a failed orbax write (seen under load,
    after the trainer's own error line) and absl's records lose their traceback; olmax's keep it."""
    import logging

    from trainer.main import library_one_line

    try:
        raise OSError(27, "File too large")
    except OSError:
        import sys

        exc = sys.exc_info()
    lib = logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "Task exception was never retrieved\nfuture: <Task>",
                            (), exc)
    own = logging.LogRecord("trainer.loop", logging.ERROR, __file__, 1, "boom", (), exc)
    assert library_one_line(lib) and library_one_line(own)
    assert lib.exc_info is None and lib.getMessage() == "Task exception was never retrieved"
    assert own.exc_info is exc
