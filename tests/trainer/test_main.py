"""The CLI's logging: the run's own INFO lines, not libraries' start-up chatter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_jax_backend_probe_info_is_silenced_but_its_warnings_and_our_info_show():
    code = (
        "import logging; from trainer import main; main.setup_logging(); import jax; jax.devices(); "
        "logging.getLogger('jax._src.xla_bridge').warning('a jax warning'); "
        "logging.getLogger('trainer.loop').info('our info')"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": ""}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Unable to initialize backend" not in proc.stderr
    assert "INFO jax" not in proc.stderr
    assert "WARNING jax._src.xla_bridge: a jax warning" in proc.stderr
    assert "INFO trainer.loop: our info" in proc.stderr


@pytest.mark.slow
def test_an_init_from_that_is_not_there_is_a_refused_config_not_a_traceback(trainer_process, data_manifest, tmp_path):
    from tests.trainer.conftest import trainer_cmd

    wrong = tmp_path / "wrong" / "path"
    proc = trainer_process.run(trainer_cmd(data_manifest, tmp_path / "run", "steps=1", f"checkpoint.init_from={wrong}"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"error: checkpoint.init_from={wrong}: no ['params', 'opt_state'] item there" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_run_dir_named_with_a_tilde_from_another_directory_is_where_every_part_of_the_run_writes(
    data_manifest, tmp_path
):
    """--run_dir is resolved once, where the command line is parsed (contract.cli.run_dir): `~` is
    the user's home and the working directory does not matter; the start-up checks, the lock, the
    checkpoints, the logs and the run record all write into that one directory (the old code
    resolved it in four places and never expanded `~`: it made a folder named `~` in the cwd)."""
    from contract.rundir import RunDir
    from tests.trainer.conftest import HANG_GUARD_S, trainer_cmd, trainer_env

    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    proc = subprocess.run(
        trainer_cmd(data_manifest, Path("~/runs/r"), "steps=1", "eval.every=0"),
        cwd=elsewhere,
        env={**trainer_env(), "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = RunDir(home / "runs" / "r")
    assert f"metrics in {run.metrics}, summary in {run.summary}" in proc.stdout
    for path in (run.metrics, run.summary, run.config, run.run_record, run.checkpoints / "1", run.data_verified):
        assert path.exists(), path
    assert [p.name for p in run.data_logs()] == ["host-00000-of-00001.jsonl"]
    assert list(elsewhere.iterdir()) == []  # no `~` folder, nothing else, in the working directory


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
    lib = logging.LogRecord(
        "asyncio", logging.ERROR, __file__, 1, "Task exception was never retrieved\nfuture: <Task>", (), exc
    )
    own = logging.LogRecord("trainer.loop", logging.ERROR, __file__, 1, "boom", (), exc)
    assert library_one_line(lib) and library_one_line(own)
    assert lib.exc_info is None and lib.getMessage() == "Task exception was never retrieved"
    assert own.exc_info is exc


# ----------------------------------------------------------------------------- multi-process flags

import pytest  # noqa: E402


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--num_processes", "2", "--process_id", "1"], "--num_processes 2 --process_id 1 cannot take effect without"),
        (["--num_processes", "2"], "--num_processes 2 cannot take effect"),
        (["--process_id", "1"], "--process_id 1 cannot take effect"),
        (
            ["--coordinator", "h:1", "--num_processes", "2", "--process_id", "5"],
            "--process_id 5 with --num_processes 2: must be in [0, 2)",
        ),
        (["--coordinator", "h:1", "--num_processes", "2", "--process_id", "-1"], "--process_id -1: must be >= 0"),
        (["--coordinator", "h:1", "--num_processes", "0", "--process_id", "0"], "--num_processes 0: must be >= 1"),
        (["--coordinator", "h:1"], "--coordinator needs --num_processes and --process_id"),
        (["--coordinator", "nohostport", "--num_processes", "2", "--process_id", "0"], "expected HOST:PORT"),
        (["--coordinator", "h:1", "--distributed", "--num_processes", "2", "--process_id", "0"], "give one"),
        (["--distributed", "--num_processes", "2", "--process_id", "2"], "must be in [0, 2)"),
    ],
)
def test_a_process_flag_that_is_wrong_or_cannot_take_effect_is_refused(argv, says):
    from trainer.main import ProcessFlagError, check_process_flags, parse_args

    with pytest.raises(ProcessFlagError) as e:
        check_process_flags(parse_args(argv), environ={})
    assert says in str(e.value) and "\n" not in str(e.value)


def test_process_flags_that_take_effect_pass():
    from trainer.main import check_process_flags, parse_args

    for argv, env in (
        (["--coordinator", "h:1", "--num_processes", "2", "--process_id", "1"], {}),
        (["--distributed"], {}),
        (["--distributed", "--num_processes", "2", "--process_id", "0"], {}),
        (["--num_processes", "2", "--process_id", "1"], {"JAX_COORDINATOR_ADDRESS": "h:1"}),
        ([], {}),
    ):
        check_process_flags(parse_args(argv), environ=env)


def _no_cluster_env() -> dict[str, str]:
    from tests.trainer.conftest import trainer_env

    return {k: v for k, v in trainer_env().items() if k != "JAX_COORDINATOR_ADDRESS"}


def _trainer_cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m trainer.main ARGS` outside any cluster, as a user types it."""
    return subprocess.run(
        [sys.executable, "-m", "trainer.main", *args],
        cwd=ROOT,
        env=_no_cluster_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_process_flags_alone_are_refused_by_the_cli_before_anything_starts(tmp_path):
    run = tmp_path / "run"
    proc = _trainer_cli("--run_dir", str(run), "--num_processes", "2", "--process_id", "1")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [
        "error: --num_processes 2 --process_id 1 cannot take effect without --coordinator HOST:PORT or "
        "--distributed (or JAX_COORDINATOR_ADDRESS set): refusing to train alone as process 0 of 1"
    ]
    assert not run.exists()


@pytest.mark.slow
def test_distributed_with_no_cluster_in_the_environment_is_one_error_line():
    proc = _trainer_cli("--distributed")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--distributed: jax.distributed.initialize found no usable cluster" in errors[0]


def test_the_console_eta_shows_days_past_24_hours():
    from trainer.logs import duration_text

    assert duration_text(55.5 * 3600 + 190.9) == "2d 07:33:10"
    assert duration_text(86399) == "23:59:59" and duration_text(86400) == "1d 00:00:00"
    assert duration_text(0) == "00:00:00" and duration_text(1000 * 86400) == "1000d 00:00:00"


def test_a_mistyped_recipe_name_is_one_error_line_naming_the_closest_recipes(tmp_path):
    run = tmp_path / "run"
    proc = _trainer_cli("--config", "olmo3-7b-stag1", "--run_dir", str(run))
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --config olmo3-7b-stag1: no such file"), lines
    assert "did you mean olmo3-7b-stage1 or " in lines[0] and "--list_recipes" in lines[0]
    assert not run.exists()


def test_a_name_like_no_recipe_is_refused_with_where_to_find_the_recipes():
    from trainer.config.loading import ConfigError
    from trainer.main import config_path

    with pytest.raises(ConfigError, match=r"^--config zzz: no such file, and no recipe of that name \(python"):
        config_path("zzz")
    assert config_path("tiny").endswith("trainer/configs/tiny.yaml")


def test_a_run_dir_that_holds_a_tokenize_output_is_refused_before_anything_is_written(tmp_path):
    """Before, `--run_dir out/sample` trained into the tokenize output: checkpoints, metrics and
    run.json beside its manifest.json and shards."""
    from tests.audit import audit_fixtures as fx

    data = tmp_path / "sample"
    fx.write_sample(str(data))
    before = sorted(p.relative_to(data) for p in data.rglob("*"))
    proc = _trainer_cli("--run_dir", str(data))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [
        f"error: --run_dir {data} holds a tokenize output (manifest.json, written by python -m pipelines.tokenize): "
        "python -m trainer.main does not write into another command's output; name a new or empty folder (or one "
        "of its own outputs)"
    ]
    assert sorted(p.relative_to(data) for p in data.rglob("*")) == before


def test_a_ctrl_c_that_python_wraps_in_another_error_during_start_up_is_still_one_line_and_exit_130(
    tmp_path, monkeypatch, capsys
):
    """A Ctrl-C while an import runs a class body reaches main as a RuntimeError ("Error calling
    __set_name__ ...", Python 3.11 wraps it) whose cause is the KeyboardInterrupt: measured 3 s into
    `python -m trainer.main` (orbax's import), a 60-line traceback and exit 1."""
    from trainer import main

    def init_jax(args, cfg):
        class CtrlC:
            def __set_name__(self, owner, name):
                raise KeyboardInterrupt

        class Imported:  # as orbax's dataclasses are, while the Ctrl-C lands
            field = CtrlC()

    monkeypatch.setattr(main, "init_jax", init_jax)
    run = tmp_path / "run"
    assert main.main(["--run_dir", str(run)]) == 130
    assert capsys.readouterr().err == main.STARTUP_INTERRUPTED + "\n"
    assert not run.exists()
