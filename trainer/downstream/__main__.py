"""Score any checkpoint on frozen downstream tasks, after the fact.

    python -m trainer.downstream --tasks_dir out/downstream-olmo3-fast --step_dir RUN/checkpoints/10000
    python -m trainer.downstream --tasks_dir DIR --hf PATH/TO/HF_CHECKPOINT [--tasks olmo3-fast]
        [--out scores.json] [--precision bfloat16|float32] [--batch_tokens 32768]

The source is a trainer step directory (its ``params`` restored on a mesh of every device, after its
checksums are verified; the model is the one its ``meta`` records) or a Hugging Face
``Olmo3ForCausalLM`` directory (``model.load_hf``: e.g. AI2's ``allenai/Olmo-3-1025-7B``
``stage1-stepN`` revisions, downloaded beforehand). The tasks are scored as in the loop
(``DownstreamEvaluator``); the result is written as JSON (``--out``, default ``./downstream.json``:
source, tasks' content_hash, precision, the metrics under OLMo-core's keys) and printed as a table.

Exit status: 0 scored; 2 refused (one ``error:`` line): no or two sources, a path that is not a
step or HF directory, a damaged step or safetensors file, task files that do not fit the model or
the run (a step's run: its seq_len and tokenizer, read by ``contract.FinishedRun``), an ``--out``
that cannot be written (checked before any work); 1 stopped (one ``error:`` line: the result could not be written). The
result is written atomically.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import Any

import jax

import model
from contract import FinishedRun, FinishedRunError, Refused, TokenizerInfo, check_out_file, write_atomic
from contract import downstream as ds
from contract.cli import Parser, run_main
from contract.rundir import RunDir
from trainer import mesh as mesh_lib
from trainer.checkpointing import files
from trainer.config.loading import build as build_config
from trainer.config.schema import MeshConfig, TrainConfig
from trainer.downstream.check import tokenizer_problem
from trainer.downstream.evaluator import PRECISIONS, TIME_KEY, DownstreamEvaluator

DEFAULT_BATCH_TOKENS = 32768


def model_from_meta(meta: dict[str, Any]) -> model.ModelConfig:
    """The ModelConfig a step's run computed with (its meta's ``model_resolved``, else the one its
    recorded config names), its attention kernel left to this machine (``auto``, resolved once in
    ``run`` for the devices that score: a run's splash on TPU is xla on a CPU)."""
    resolved = meta.get("model_resolved")
    if isinstance(resolved, dict):
        cfg = model.ModelConfig.from_record(resolved)
    else:
        cfg = build_config(TrainConfig, meta.get("config") or {}).model_cfg()
    return dataclasses.replace(cfg, attention_impl="auto")


def run_of_step(step_dir: Path, meta: dict[str, Any]) -> tuple[int, TokenizerInfo | None]:
    """(the data's seq_len, its tokenizer) of a step, read by ``contract.FinishedRun`` (its one
    fallback policy: the run's run.json, RUN/checkpoints/<step> → RUN/run.json; else the step's
    meta: the seq_len it records, its config's, its manifests'); the tokenizer None when nothing
    names it. Refused when nothing says the seq_len (scoring would skip the context-length check)."""
    done = FinishedRun.read(RunDir.of_step(step_dir), step_meta=meta)
    try:
        return done.seq_len, done.tokenizer
    except FinishedRunError as e:
        raise Refused(f"{step_dir}: {e}: the tasks' context length cannot be checked") from None


def load_step(
    step_dir: Path, mesh: jax.sharding.Mesh
) -> tuple[model.ModelConfig, Any, Any, int | None, TokenizerInfo | None]:
    """(model config, params placed on ``mesh``, their shardings, the run's seq_len and tokenizer) of a step."""
    if not (step_dir / "params").is_dir() or not (step_dir / "meta").is_dir():
        raise Refused(f"{step_dir}: not a trainer step directory (no params/meta; e.g. RUN/checkpoints/1000)")
    reason = files.verify_step(step_dir, items=("params", "meta"))
    if reason is not None:
        raise Refused(f"{step_dir}: {reason}")
    meta = files.restore_json(step_dir, "meta")
    cfg = model_from_meta(meta)
    seq_len, tokenizer = run_of_step(step_dir, meta)
    shardings = model.param_shardings(cfg, mesh)
    abstract = mesh_lib.abstract_like(model.abstract_params(cfg), shardings)
    params = files.restore_items(step_dir, abstract, None, ("params",))["params"]
    return cfg, params, shardings, seq_len, tokenizer


def load_hf_dir(path: Path, mesh: jax.sharding.Mesh) -> tuple[model.ModelConfig, Any, Any, None, None]:
    if not (path / model.hf.CONFIG_FILE).is_file():
        raise Refused(f"{path}: no {model.hf.CONFIG_FILE} (not a Hugging Face checkpoint directory)")
    try:
        cfg, params = model.load_hf(str(path))
    except (ValueError, KeyError, OSError) as e:
        raise Refused(f"{path}: {e}") from None
    shardings = model.param_shardings(cfg, mesh)
    return cfg, jax.device_put(params, shardings), shardings, None, None


def table(row: dict[str, float]) -> str:
    """One line per value: task, metric, value (OLMo-core's key read back: contract.downstream)."""
    lines = []
    for key, value in row.items():
        if key == TIME_KEY:
            continue
        clean = key.endswith(ds.CLEAN_SUFFIX)
        label, what = ds.parse_metric_key(key.removesuffix(ds.CLEAN_SUFFIX)) or (key, "")
        lines.append(f"{label:<45} {what + (ds.CLEAN_SUFFIX if clean else ''):<32} {value:.6f}")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = Parser("python -m trainer.downstream", __doc__.split("\n")[0])
    p.add_argument("--tasks_dir", required=True, help="frozen task files (python -m pipelines.downstream_tasks)")
    p.add_argument("--tasks", default=None, help="labels or a preset (default: every task of tasks_dir)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--step_dir", help="a trainer step directory, RUN/checkpoints/<step>")
    src.add_argument("--hf", help="a Hugging Face Olmo3ForCausalLM directory")
    p.add_argument("--out", default="downstream.json", help="JSON result")
    p.add_argument("--precision", default="bfloat16", choices=PRECISIONS, help="the forward pass's compute dtype")
    p.add_argument("--batch_tokens", type=int, default=DEFAULT_BATCH_TOKENS, help="tokens per forward pass")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.batch_tokens < 1:
        raise Refused(f"--batch_tokens must be ≥ 1, got {args.batch_tokens}")
    tasks_dir = Path(args.tasks_dir)
    if not (tasks_dir / ds.MANIFEST_NAME).is_file():
        raise Refused(f"{tasks_dir}: no {ds.MANIFEST_NAME} (build it with python -m pipelines.downstream_tasks)")
    mesh = mesh_lib.make_mesh(MeshConfig(data=-1, fsdp=1, tensor=1))
    # absolute: orbax restores from an absolute path only (the README's RUN/checkpoints/10000 is relative)
    given = args.step_dir or args.hf
    source = Path(given).expanduser().resolve()
    if not source.is_dir():
        raise Refused(f"{given}: no such directory")
    cfg, params, shardings, seq_len, tokenizer = (load_step if args.step_dir else load_hf_dir)(source, mesh)
    cfg = model.attention.resolved(cfg, jax.devices()[0].platform)  # the one resolution of "auto" here
    if tokenizer is not None:  # the files were built with the run's vocabulary, ids and all
        try:
            problem = tokenizer_problem(ds.load(tasks_dir, labels=[]).manifest["tokenizer"], tokenizer)
        except ValueError as e:
            raise Refused(str(e)) from None
        if problem:
            raise Refused(f"{tasks_dir}: built with another tokenizer than the run's data: {problem}")
    try:
        ev = DownstreamEvaluator.from_files(
            str(tasks_dir),
            args.tasks,
            cfg,
            mesh,
            shardings,
            args.batch_tokens,
            seq_len,
            interval=1,
            precision=args.precision,
            log_fn=print,
        )
    except ValueError as e:
        raise Refused(str(e)) from None
    row = ev(params)
    ev.close()
    return {
        "source": str(source),
        "kind": "step" if args.step_dir else "hf",
        "tasks_dir": str(tasks_dir.resolve()),
        "content_hash": ev.tasks.manifest["content_hash"],
        "precision": args.precision,
        "metrics": row,
    }


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    args = parse(argv)
    return run_main(lambda: _main(args))


def _main(args: argparse.Namespace) -> int:
    check_out_file(args.out)  # before the restore and the scoring pass
    try:
        result = run(args)
    except OSError as e:  # a file that cannot be read (never a write: the result is written below)
        raise Refused(f"cannot read the input: {e}") from None
    write_atomic(args.out, json.dumps(result, indent=1) + "\n")
    print(table(result["metrics"]))
    print(f"wrote {args.out} ({result['metrics'][TIME_KEY]:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
