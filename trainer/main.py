"""python -m trainer.main --config trainer/configs/NAME.yaml --run_dir DIR [key=value ...]

With no arguments: the tiny model on the embedded sample (``out/sample/manifest.json``, made
by ``python -m pipelines.tokenize`` first if missing), run dir ``runs/tiny``.
Multi-host: ``--coordinator HOST:PORT --num_processes N --process_id I``, or ``--distributed``
to let ``jax.distributed.initialize()`` read the cluster from the environment (TPU pods, SLURM,
...). Setting JAX's own ``JAX_COORDINATOR_ADDRESS`` implies ``--distributed`` (a process that was
told where its coordinator is must never silently train alone on the whole global batch);
``--num_processes``/``--process_id`` then fill in what cluster auto-detection cannot.
"""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from contract.cli import Parser, run_dir, run_main
from contract.errors import Refused, interrupted
from contract.outputs import TRAINING_RUN, check_output_kind
from trainer import libtpu_flags
from trainer.config.loading import ConfigError
from trainer.config.schema import TrainConfig, check_state_precision, load_config

CONFIGS_DIR = Path(__file__).resolve().parent / "configs"  # the recipes (--list_recipes)
DEFAULT_CONFIG = "tiny"  # a recipe's name: trainer/configs/tiny.yaml
DEFAULT_RUN_DIR = "runs/tiny"
SAMPLE_MANIFEST = "out/sample/manifest.json"
COORDINATOR_ENV = "JAX_COORDINATOR_ADDRESS"  # read by jax.distributed.initialize itself
DETERMINISTIC_XLA_FLAG = "--xla_gpu_deterministic_ops=true"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = Parser("python -m trainer.main", __doc__)
    p.add_argument("--config", default=DEFAULT_CONFIG, help="trainer YAML: a path, or a recipe's name (--list_recipes)")
    p.add_argument(
        "--run_dir",
        type=run_dir,  # the run's RunDir, resolved once here: start-up, lock, loop and checkpoints take it
        default=DEFAULT_RUN_DIR,
        help="checkpoints, metrics and logs go here",
    )
    p.add_argument("--coordinator", help="HOST:PORT of process 0 (multi-host)")
    p.add_argument("--num_processes", type=int, help="processes of a multi-host run")
    p.add_argument("--process_id", type=int, help="this process's index in [0, num_processes)")
    p.add_argument("--distributed", action="store_true", help="jax.distributed.initialize() from the environment")
    p.add_argument(
        "--print_config",
        action="store_true",
        help="print the resolved config (config.json's `config`, as a run records it) and exit; starts nothing",
    )
    p.add_argument("--list_recipes", action="store_true", help="list the recipes in trainer/configs/ and exit")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. steps=20 optimizer.mu_dtype=float32")
    return p.parse_args(argv)


def config_path(config: str) -> str:
    """``--config``: a path, or the name of a recipe in trainer/configs/ (``tiny``, ``olmo3-7b-stage1.yaml``).
    A name that is neither a file nor a recipe is refused with the recipes' names closest to it."""
    if Path(config).exists() or os.sep in config:
        return config
    recipe = CONFIGS_DIR / (config if config.endswith(".yaml") else f"{config}.yaml")
    if recipe.is_file():
        return str(recipe)
    names = [name for name, _ in recipes()]
    close = difflib.get_close_matches(config.removesuffix(".yaml"), names, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    raise ConfigError(
        f"--config {config}: no such file, and no recipe of that name{hint} "
        "(python -m trainer.main --list_recipes lists the recipes)"
    )


def recipes() -> list[tuple[str, str]]:
    """(name, the first line of its leading comment) of each recipe in trainer/configs/."""
    out = []
    for path in sorted(CONFIGS_DIR.glob("*.yaml")):
        first = next((line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()), "")
        out.append((path.stem, first.lstrip("# ").strip() if first.startswith("#") else ""))
    return out


def resolved_config_text(cfg: TrainConfig) -> str:
    """The config as a run records it in config.json's ``config`` (``trainer.logs.write_summary``'s JSON)."""
    return json.dumps(cfg.to_dict(), indent=2, sort_keys=True) + "\n"


class ProcessFlagError(Refused, ValueError):
    """A multi-process flag that is wrong or cannot take effect (the CLI exits 2)."""


def check_process_flags(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> None:
    """Refuse, before JAX starts, every process flag that is out of range or would be ignored: a
    process that was told it is 1 of 2 must never train alone on the whole global batch."""
    n, i, coordinator = args.num_processes, args.process_id, args.coordinator
    if n is not None and n < 1:
        raise ProcessFlagError(f"--num_processes {n}: must be >= 1")
    if i is not None and i < 0:
        raise ProcessFlagError(f"--process_id {i}: must be >= 0")
    if n is not None and i is not None and i >= n:
        raise ProcessFlagError(f"--process_id {i} with --num_processes {n}: must be in [0, {n})")
    if coordinator is not None:
        if args.distributed:
            raise ProcessFlagError(
                "--coordinator and --distributed: give one (--distributed reads the "
                "coordinator from the environment, --coordinator names it)"
            )
        host, sep, port = coordinator.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ProcessFlagError(f"--coordinator {coordinator!r}: expected HOST:PORT (port in 1..65535)")
        if n is None or i is None:
            raise ProcessFlagError("--coordinator needs --num_processes and --process_id")
    elif not (args.distributed or environ.get(COORDINATOR_ENV)) and (n is not None or i is not None):
        given = " ".join(f"--{k} {v}" for k, v in (("num_processes", n), ("process_id", i)) if v is not None)
        raise ProcessFlagError(
            f"{given} cannot take effect without --coordinator HOST:PORT or --distributed "
            f"(or {COORDINATOR_ENV} set): refusing to train alone as process 0 of 1"
        )


def init_jax(args: argparse.Namespace, cfg: TrainConfig) -> None:
    """JAX settings that must precede backend start-up, then jax.distributed if asked (the
    process flags were checked by ``main``, before the config was read: not again here)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if cfg.deterministic and DETERMINISTIC_XLA_FLAG.split("=")[0] not in flags:
        # XLA reads XLA_FLAGS when the backend starts: after this, before any computation.
        os.environ["XLA_FLAGS"] = f"{flags} {DETERMINISTIC_XLA_FLAG}".strip()
    kept = libtpu_flags.apply(cfg.libtpu_flags)  # libtpu reads them when JAX loads it: before the import below
    if kept:
        logging.getLogger(__name__).warning(
            "libtpu_flags %s: %s already sets them; its values are used", kept, libtpu_flags.ENV
        )
    import jax  # JAX start-up order: after XLA_FLAGS, before jax_num_cpu_devices and distributed

    if cfg.mesh.cpu_devices > 0:
        jax.config.update("jax_num_cpu_devices", cfg.mesh.cpu_devices)
    from_env = bool(os.environ.get(COORDINATOR_ENV))
    if args.coordinator or args.distributed or from_env:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU-only setting
    if args.coordinator:
        jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    elif args.distributed or from_env:
        # The coordinator comes from JAX_COORDINATOR_ADDRESS or cluster auto-detection, which
        # raises ValueError/TypeError when the environment holds no cluster (or not all of it).
        try:
            jax.distributed.initialize(num_processes=args.num_processes, process_id=args.process_id)
        except (ValueError, TypeError) as e:
            flag = "--distributed" if args.distributed else f"{COORDINATOR_ENV}={os.environ[COORDINATOR_ENV]}"
            raise ProcessFlagError(
                f"{flag}: jax.distributed.initialize found no usable cluster in the environment ({e}); "
                "run where JAX detects the cluster (TPU pod, SLURM, ...) or give --coordinator HOST:PORT "
                "--num_processes N --process_id I"
            ) from None


def ensure_sample_data(cfg: TrainConfig) -> None:
    """The no-argument path: tokenize the embedded sample when its output is missing."""
    if cfg.data == (SAMPLE_MANIFEST,) and not Path(SAMPLE_MANIFEST).exists():
        print(f"{SAMPLE_MANIFEST} is missing: running python -m pipelines.tokenize first", flush=True)
        subprocess.run([sys.executable, "-m", "pipelines.tokenize"], check=True)


# Loggers of libraries whose INFO lines are not the run's news: absl (orbax), and JAX's backend
# probe, which logs "Unable to initialize backend 'tpu'" on every machine without libtpu (the
# trainer logs the devices and mesh it does use; JAX's own warnings still show).
QUIET_LOGGERS = ("absl", "jax._src.xla_bridge")


def setup_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for handler in logging.getLogger().handlers:  # every logger's records end here, whatever its name
        handler.addFilter(library_one_line)
    sys.unraisablehook = _unraisable


MAX_LIBRARY_LINE = 400


def one_line(record: logging.LogRecord) -> bool:
    """absl (orbax) errors as one line each: orbax logs every failed background write with its
    traceback and tensorstore's whole spec; the trainer's own `error:` line says what failed."""
    if record.levelno >= logging.ERROR and (record.exc_info or len(str(record.msg)) > MAX_LIBRARY_LINE):
        text = record.getMessage().splitlines()[0] if record.getMessage() else ""
        record.msg = text[:MAX_LIBRARY_LINE] + ("…" if len(text) > MAX_LIBRARY_LINE else "")
        record.args, record.exc_info, record.exc_text = (), None, None
    return True


OWN_PACKAGES = ("trainer", "dataloader", "pipelines", "model")


def library_one_line(record: logging.LogRecord) -> bool:
    """`one_line` for every library's records (absl/orbax, asyncio's "Task exception was never
    retrieved" for an orbax write task that failed after its caller gave up, tensorstore ...);
    olmax's own records are left as they are."""
    if record.name.split(".")[0] in OWN_PACKAGES:
        return True
    return one_line(record)


def _unraisable(info: sys.UnraisableHookArgs) -> None:
    """Drop asyncio's "Event loop is closed" from tensorstore callbacks that report to orbax's
    finished loop after a failed write (one traceback per callback, nothing to act on); any
    other unraisable exception is printed as Python does."""
    if isinstance(info.exc_value, RuntimeError) and str(info.exc_value) == "Event loop is closed":
        return
    sys.__unraisablehook__(info)


STARTUP_INTERRUPTED = (
    "interrupted during start-up, before the run's first step: nothing was saved and the run directory is "
    "as it was (no checkpoint of this start exists); rerun the same command to start"
)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # a Ctrl-C before the run's own handler (trainer.preemption) took it over: one line, exit 130
    return run_main(lambda: _main(args), interrupted_line=STARTUP_INTERRUPTED)


def _main(args: argparse.Namespace) -> int:
    if args.list_recipes:
        for name, about in recipes():
            print(f"{name:<28} {about}")
        return 0
    setup_logging()
    check_process_flags(args)
    try:
        cfg = load_config(config_path(args.config), args.overrides)
    except (ValueError, OSError) as e:  # a config file that cannot be read or parsed (ConfigError: as it is)
        if isinstance(e, Refused):
            raise
        raise ConfigError(str(e)) from None
    check_state_precision(cfg)
    if args.print_config:
        sys.stdout.write(resolved_config_text(cfg))
        return 0
    check_output_kind(args.run_dir, TRAINING_RUN, "--run_dir")  # never another command's output: before anything
    init_jax(args, cfg)
    import jax  # after init_jax: the JAX settings above precede its backend's start

    if jax.process_index() == 0:
        ensure_sample_data(cfg)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils  # JAX start-up order (after init_jax)

        multihost_utils.sync_global_devices("trainer: data ready")
    from trainer.loop import train  # imports model/dataloader after the JAX settings
    from trainer.preemption import Preemption  # JAX start-up order (after init_jax)
    from trainer.preflight import AsFound, StartInterrupted, prepare  # JAX start-up order (after init_jax)

    lock, as_found, preemption = None, AsFound.of(args.run_dir) if jax.process_index() == 0 else None, None
    try:
        lock, checked = prepare(cfg, args.run_dir)  # every start-up check, then the run_dir's lock
        preemption = Preemption()  # from here SIGTERM or a first Ctrl-C saves after a step and exits 0
        train(checked, args.run_dir, preemption)
    # the data does not fit, the batch does not fit the mesh, or the config does not fit the checkpoint
    # (or names none): a refusal leaves the run directory as it found it (run_main says what); so does
    # a Ctrl-C before the run's handlers take it (main's one line)
    except BaseException as e:
        if not isinstance(e, Refused) and not (interrupted(e) and preemption is None):
            raise  # (after the start a Ctrl-C is Preemption's: whatever raised this, the run had begun)
        lock = e.lock if isinstance(e, StartInterrupted) else lock
        if lock is not None and as_found is not None:
            as_found.undo(lock)
        raise
    finally:
        if preemption is not None:
            preemption.restore()
        if lock is not None:
            lock.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
