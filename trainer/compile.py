"""python -m trainer.compile --config RECIPE --topology NAME [--num_slices N] [--out FILE.json] [key=value ...]

Compiles the train step ``trainer.main`` would run for RECIPE (the same builder,
``trainer.build``: model overrides, mesh rules, optimizer and its shardings, skip step, z-loss,
microbatches, chunked loss) and its eval step, ahead of time for a TPU topology, on any machine
(this one needs no TPU: ``pip install 'olmax[tpu]'`` brings the TPU compiler, libtpu). Inputs
are abstract: nothing is allocated and no data is read (the batch shape is the recipe's
``global_batch_size`` x ``seq_len``). Prints a table, writes JSON with --out.

  NAME: libtpu's topology name, GENERATION:AxB[xC], e.g. v5e:2x2, v5p:2x4x4, tpu7x:2x2x2, or one
        chip: v5e:1x1. --num_slices N: N such slices (data parallelism across slices: set
        mesh.data=N, or it is set for you when the recipe leaves it at 1).

Exit 0: both steps fit the device memory. Exit 2: they do not (the compiler's RESOURCE_EXHAUSTED,
or a peak over the capacity; the message names the figures and the levers), or the topology,
config or batch layout is refused.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from contract import finished_run
from contract.cli import Parser, integer, run_main
from contract.errors import Refused, Stopped
from contract.outputs import write_atomic
from trainer import libtpu_flags
from trainer import memory_report as report
from trainer.config.loading import ConfigError, set_dotted
from trainer.config.loading import build as build_config
from trainer.config.schema import TrainConfig, check_state_precision, load_config

PLATFORM = "tpu"  # the target; the machine running this compiles with its CPU backend only
# Generations the installed libtpu is asked about when a name is refused (GENERATION, example dims).
GENERATIONS = (("v4", "2x2x1"), ("v5e", "2x2"), ("v5p", "2x2x1"), ("v6e", "2x2"), ("tpu7x", "2x2x1"))


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = Parser("python -m trainer.compile", __doc__)
    p.add_argument("--config", required=True, help="trainer YAML (a recipe in trainer/configs/)")
    p.add_argument("--topology", required=True, help="libtpu topology name, e.g. v5p:2x4x4, tpu7x:2x2x2, v5e:1x1")
    p.add_argument("--num_slices", type=integer(1), default=1, help="slices of that topology")
    p.add_argument("--out", help="write the report as JSON here")
    p.add_argument("--skip_eval", action="store_true", help="compile the train step only")
    p.add_argument("--verbose", action="store_true", help="show libtpu's own messages (hidden by default)")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides, as for trainer.main")
    return p.parse_args(argv)


@contextlib.contextmanager
def hidden_stderr(show: bool) -> Iterator[list[str]]:
    """Redirects file descriptor 2 (where libtpu's C++ logging writes: warnings about TPU
    environment variables a CPU machine does not set) into a temporary file; the text is appended
    to the yielded list, and echoed when ``show``."""
    out: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield out
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            out.append(tmp.read().decode(errors="replace"))
            if show and out[-1]:
                sys.stderr.write(out[-1])


def topology_dims(name: str) -> tuple[int, int, int] | None:
    m = re.fullmatch(r"[A-Za-z0-9_ ]+[=_:]((?:\d+x)*\d+)(?:_twisted|_untwisted)?", name)
    if not m:
        return None
    dims = [int(d) for d in m.group(1).split("x")]
    x, y, z = (dims + [1] * (3 - len(dims)))[:3]
    return (x, y, z) if len(dims) <= 3 else None


def known_generations() -> list[str]:
    """GENERATION:dims patterns the installed libtpu accepts (asked, not assumed)."""
    from jax.experimental import topologies  # JAX: after main's JAX_PLATFORMS/XLA_FLAGS (so in every function here)

    ok = []
    for gen, dims in GENERATIONS:
        try:
            topologies.get_topology_desc(topology_name=f"{gen}:{dims}", platform=PLATFORM)
            ok.append(f"{gen}:{'x'.join('ABC'[: dims.count('x') + 1])}")
        except Exception:  # noqa: BLE001 — any refusal means "not known"
            pass
    return ok


def topology_devices(name: str, num_slices: int) -> list:
    """Compile-only devices of ``num_slices`` slices of topology ``name``. A slice smaller than
    libtpu's default host (2x2x1 chips, e.g. one chip: v5e:1x1) is described as one host of
    its own size, as MaxText does for v6e-1."""
    from jax.errors import JaxRuntimeError  # JAX: after main's environment (see known_generations)
    from jax.experimental import topologies

    kw: dict[str, Any] = dict(topology_name=name, platform=PLATFORM, num_slices=num_slices)
    try:
        try:
            return list(topologies.get_topology_desc(**kw).devices)
        except JaxRuntimeError as e:
            dims = topology_dims(name)
            if "chips_per_host_bounds" not in str(e) or dims is None:
                raise
            return list(topologies.get_topology_desc(**kw, chips_per_host_bounds=dims).devices)
    except JaxRuntimeError as e:
        reason = str(e).splitlines()[0]
        known = known_generations()
        raise Refused(
            f"topology {name!r} is not one the installed libtpu {report.libtpu_version()} knows "
            f"({reason}); it knows {', '.join(known) or 'none'} (A, B, C: chips along each axis), "
            "e.g. v5e:2x2, v5p:2x4x4, tpu7x:2x2x2; one chip: v5e:1x1"
        ) from None
    except RuntimeError as e:  # jax: "JAX TPU support not installed" (no libtpu)
        raise Refused(
            f"the TPU compiler is not installed ({e}); install the tpu extra: "
            "pip install -e '.[tpu]' (jax[tpu], which brings libtpu)"
        ) from None


def with_slices(cfg: TrainConfig, overrides: list[str], num_slices: int) -> TrainConfig:
    """``--num_slices N`` puts the mesh's data axis across the slices (mesh.data = N) unless the
    recipe or the command line sets mesh.data itself."""
    if num_slices == 1 or any(o.split("=", 1)[0].strip() == "mesh.data" for o in overrides) or cfg.mesh.data != 1:
        return cfg
    raw = cfg.to_dict()
    set_dotted(raw, "mesh.data", num_slices)
    return build_config(TrainConfig, raw)


def seq_len_of(cfg: TrainConfig) -> int:
    """The recipe's seq_len, else its first manifest's when it can be read (nothing else is read):
    ``contract.finished_run.seq_len_of``, the rule a finished run's seq_len is read by."""
    try:
        return finished_run.seq_len_of(cfg.seq_len, cfg.data)
    except finished_run.FinishedRunError as e:
        raise Refused(f"{e}: add seq_len=N") from None


def check_layout(cfg: TrainConfig, mesh: Any, seq_len: int) -> int:
    """The layout checks a run's start-up makes (``trainer.startup.check_layout``), for every host
    of the topology: each process's devices hold its loader slice, and the batch splits into the
    microbatches. Returns the number of processes (hosts)."""
    from trainer import startup  # imports JAX: after main's environment (see known_generations)

    hosts = sorted({d.process_index for d in mesh.devices.flat})
    startup.check_layout(cfg, mesh, seq_len, hosts, len(hosts))
    return len(hosts)


def compile_report(
    cfg: TrainConfig, topology: str, num_slices: int, skip_eval: bool, verbose: bool, dump_dir: str
) -> dict:
    # JAX and what imports it: after main's JAX_PLATFORMS/XLA_FLAGS, which JAX reads when it starts
    import jax
    import jax.numpy as jnp

    import model  # (the same: imports JAX)
    from trainer import mesh as mesh_lib
    from trainer.build import build

    with hidden_stderr(verbose):
        devices = topology_devices(topology, num_slices)
    seq_len = seq_len_of(cfg)
    try:
        b = build(cfg, devices, platform=PLATFORM)
        hosts = check_layout(cfg, b.mesh, seq_len)
    except ValueError as e:  # mesh_lib.MeshError, a parameter that does not split over the mesh
        raise Refused(str(e)) from None
    params, opt = b.abstract_state()
    batch = b.abstract_batch(cfg.global_batch_size, seq_len)
    lr = jax.ShapeDtypeStruct((), jnp.float32)
    m = b.model_cfg
    out: dict[str, Any] = {
        "topology": topology,
        "num_slices": num_slices,
        "device_kind": devices[0].device_kind,
        "devices": len(devices),
        "hosts": hosts,
        "mesh": dict(b.mesh.shape),
        "model": cfg.model,
        "params": model.count_params(m),
        "attention_impl": getattr(m, "attention_impl", "xla"),  # the resolved config's (xla before the field exists)
        "remat": report.remat_name(m.remat),
        "attention_chunk": m.attention_chunk,
        "compute_dtype": m.compute_dtype,
        "param_dtype": m.param_dtype,
        "microbatches": cfg.microbatches,
        "loss_chunk": cfg.loss_chunk,
        "seq_len": seq_len,
        "global_batch_size": cfg.global_batch_size,
        "rows_per_device": cfg.global_batch_size / mesh_lib.batch_shards(b.mesh),
        "state_bytes_per_device": {
            "params": report.shard_bytes(params),
            "optimizer_state": report.shard_bytes(opt),
            "batch": report.shard_bytes(batch),
        },
        "model_flops_per_step": model.flops_per_token(m, seq_len) * cfg.global_batch_size * seq_len,
    }
    with hidden_stderr(verbose):
        out["hbm_bytes_per_device"] = report.compiler_hbm_bytes(devices[0])
        out["hbm_source"] = report.HBM_SOURCE
        train = report.compile_step(b.train_step, (params, opt, lr, batch))
        evals = None if skip_eval else report.compile_step(b.eval_step, (params, batch))
    out["per_device_bytes"], out["compile_seconds"] = train.bytes, train.seconds
    out["compiler_error"] = train.error
    out["largest_buffers"] = report.largest_buffers(report.dumped_report(dump_dir, "step_fn"))
    if evals is not None:
        out["eval_per_device_bytes"], out["eval_compile_seconds"] = evals.bytes, evals.seconds
        out["eval_compiler_error"] = evals.error
        out["eval_largest_buffers"] = report.largest_buffers(report.dumped_report(dump_dir, "eval_fn"))
    cap = out["hbm_bytes_per_device"]
    out["fits"] = all(r.fits(cap) for r in (train, evals) if r is not None)
    return out


def check_out_file(out: str) -> None:
    """``--out`` can be written as a file: checked before compiling (which takes minutes), so that
    a directory or an unwritable place is refused up front, not after the whole compile. Nothing
    is created here."""
    path = Path(out)
    if path.is_dir():
        raise Refused(f"--out {out} is a directory; give a file path, e.g. --out {path / 'compile.json'}")
    if path.exists() and not os.access(path, os.W_OK):
        raise Refused(f"--out {out}: the file exists and cannot be written")
    folder = path.absolute().parent
    while not folder.exists():  # the report's folders are made when it is written
        folder = folder.parent
    if not folder.is_dir():
        raise Refused(f"--out {out}: {folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise Refused(f"--out {out}: cannot write into {folder}")


def write_out(out: str, result: dict) -> None:
    """The report, written atomically (contract.write_atomic: WriteFailed, a Stopped, exit 1)."""
    write_atomic(out, json.dumps(result, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return run_main(lambda: _main(args, argv))


def _main(args: argparse.Namespace, argv: list[str] | None) -> int:
    # The compiler runs here, for a TPU this machine need not have: JAX's own backend stays the
    # CPU (set before JAX is imported), the TPU devices are libtpu's compile-only descriptions.
    os.environ["JAX_PLATFORMS"] = "cpu"
    # libtpu takes /tmp/libtpu_lockfile so that one process owns a machine's chips; compiling opens
    # no chip, so another JAX process (a training run, a test) must not stop it, nor it them.
    os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    # Compiling is the measurement: an executable from JAX's persistent cache would skip the compiler
    # (its time and its buffer-assignment report).
    os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    dump = tempfile.TemporaryDirectory(prefix="olmax-compile-")  # the compiler's buffer assignment, read back
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {report.dump_flags(dump.name)}".strip()
    try:
        if args.out:
            check_out_file(args.out)
        cfg = load_config(args.config, args.overrides)
        libtpu_flags.apply(cfg.libtpu_flags)  # the compiler is libtpu's: its flags before it loads
        check_state_precision(cfg)
        cfg = with_slices(cfg, args.overrides, args.num_slices)
        result = compile_report(cfg, args.topology, args.num_slices, args.skip_eval, args.verbose, dump.name)
    except (ValueError, OSError) as e:  # a bad value, a config file that cannot be read: refused
        if isinstance(e, (Refused, Stopped)):  # the two kinds go to run_main as they are
            raise
        raise ConfigError(str(e)) from None
    finally:
        dump.cleanup()
    result.update(
        command=" ".join(["python -m trainer.compile", *(argv if argv is not None else sys.argv[1:])]),
        date=datetime.datetime.now(datetime.UTC).date().isoformat(),
        versions=report.versions(),
    )
    print(report.table(result))
    if args.out:
        write_out(args.out, result)  # WriteFailed (changed since the check: a full disk, ...): exit 1
    if not result["fits"]:
        raise Refused(report.not_fitting_message(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
