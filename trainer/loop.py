"""One training run: set up (or restore) the state, then step, log, evaluate and checkpoint.

Call after ``jax.distributed.initialize`` (multi-host) — see ``trainer.main``.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import signal
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

import model
from dataloader import LoaderConfig, make_loader
from dataloader import checkpoint as data_checkpoint, golden
from dataloader.double_sharding import DoubleShardingReplay
from dataloader.loader import load_plan
import contract
from dataloader import heldout
from trainer import data as data_contract, evaluate, logs, mesh as mesh_lib, optim, peak as peak_lib, trackers as trackers_lib
from trainer.build import Built, build
from trainer.checkpoint import Checkpoints, RefusedConfigError, key_from_json, key_to_json
from trainer.config import TrainConfig
from trainer.resume import init_from_changes, resume_changes

log = logging.getLogger(__name__)


class RunError(RuntimeError):
    """The run stops for the reason in the message (exit 1)."""


class ResumeRefused(RunError, RefusedConfigError):
    """The config does not fit the checkpoint it would resume (exit 2, like any refused config).
    A RefusedConfigError too, so trainer.checkpoint passes it on as a refusal, unwrapped."""


class Preemption:
    """SIGTERM sets a flag; the loop checks it after each step (all hosts agree), saves, exits 0."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        log.warning("SIGTERM: will checkpoint after the current step and exit")
        self.requested = True

    def agreed(self) -> bool:
        if jax.process_count() == 1:
            return self.requested
        return bool(multihost_utils.process_allgather(np.int32(self.requested)).any())

    def restore(self) -> None:
        signal.signal(signal.SIGTERM, self._previous)


@dataclasses.dataclass
class RunState:
    params: Any
    opt_state: Any
    step: int            # updates applied = the next loader step
    rng: jax.Array       # training RNG (typed key), checkpointed bit-exactly
    data_sha256: str     # hash of the stream consumed so far (contract.chain_data_sha256)
    tokens: int          # tokens consumed so far (incl. PAD)

    def meta(self, cfg: TrainConfig, model_cfg: model.ModelConfig) -> dict[str, Any]:
        """The checkpoint's meta item; ``model_resolved``: the ModelConfig the run used, so a
        resume compares the model itself, not its name as today's code resolves it."""
        return {"step": self.step, "rng": key_to_json(self.rng), "data_sha256": self.data_sha256,
                "tokens": self.tokens, "process_count": jax.process_count(),
                "device_count": jax.device_count(), "config": cfg.to_dict(),
                "model_resolved": dataclasses.asdict(model_cfg)}


def _initial_state(cfg: TrainConfig, b: "Built", ckpt: Checkpoints, loader_cfg: LoaderConfig) -> RunState:
    """The run's own newest intact checkpoint, else ``checkpoint.init_from``'s state, else a fresh one."""
    abstract_params, abstract_opt = b.abstract_state()
    checked: dict[int, int] = {}  # step → its data position, from check

    def check(step: int, meta: dict[str, Any], data: dict[str, Any]) -> None:  # before any array is read
        checked[step] = _check_resume(cfg, loader_cfg, step, data, meta)

    found = ckpt.restore_latest(abstract_params, abstract_opt, check)  # the newest intact step
    if found is not None:
        latest, r = found
        meta = r["meta"]
        _check_positions(latest, checked[latest], meta)
        log.info("restored checkpoint %d from %s (written by %d process(es))", latest, ckpt.directory,
                 meta["process_count"])
        return RunState(r["params"], r["opt_state"], latest, key_from_json(meta["rng"]),
                        meta["data_sha256"], int(meta["tokens"]))
    init_rng, train_rng = jax.random.split(jax.random.key(cfg.init_seed))
    started = ckpt.restore_init_from(abstract_params, abstract_opt,  # None unless checkpoint.init_from
                                     lambda meta: _check_init_from(cfg, meta))
    params, opt_state = started if started is not None else b.init_state(init_rng)
    return RunState(params, opt_state, 0, train_rng, "", 0)


def data_mismatch_text(e: "data_checkpoint.StateMismatchError") -> str:
    """The loader's refusal in the trainer's words: its problem and differences, and (only where
    the override helps: a malformed state is refused with it too) the trainer's override instead
    of the loader's Python argument."""
    lines = [e.problem, *(f"  {d}" for d in e.differences)]
    if e.waivable:
        lines.append("to resume anyway, add the override checkpoint.allow_data_mismatch=true")
    return "\n".join(lines)


def position_problem(step: int, data_step: int, meta: dict[str, Any]) -> str | None:
    """Pure: why the data position, the meta's step and the step directory's name are not one
    number (None when they are)."""
    if data_step == meta.get("step") == step:
        return None
    return (f"its data item is at step {data_step}, its meta says step {meta.get('step')!r}: the data "
            "position would not match the parameters, so it cannot be resumed exactly (move it aside "
            "to resume from an older step)")


def _check_positions(step: int, data_step: int, meta: dict[str, Any]) -> None:
    problem = position_problem(step, data_step, meta)
    if problem:
        raise ResumeRefused(f"cannot resume from checkpoint {step}: {problem}")


def _check_resume(cfg: TrainConfig, loader_cfg: LoaderConfig, step: int, data_state: dict,
                  meta: dict[str, Any]) -> int:
    """The loader step to resume from. A different data stream or different optimizer/schedule
    settings than the checkpoint's are refused together, each naming the override that allows
    it (``checkpoint.allow_data_mismatch`` / ``allow_optimizer_change``), and logged if allowed.
    A data stream this code no longer computes (golden.StreamChangedError) and data and meta
    at different steps are refused too (no override)."""
    problems, start = [], -1
    try:
        start = data_checkpoint.check_state(loader_cfg, data_state, cfg.checkpoint.allow_data_mismatch)
    except data_checkpoint.StateMismatchError as e:
        problems.append(data_mismatch_text(e))
    except golden.StreamChangedError as e:
        problems.append(str(e))
    else:
        problems += [p for p in [position_problem(step, start, meta)] if p]
    changes = resume_changes(meta.get("config", {}), cfg, meta.get("model_resolved"))
    if changes:
        text = "optimizer/schedule/loss/model settings differ from the checkpointed run's:\n  " + "\n  ".join(changes)
        if not cfg.checkpoint.allow_optimizer_change:
            problems.append(text + "\nto resume with the new settings anyway, add the override "
                            "checkpoint.allow_optimizer_change=true")
        else:
            log.warning("checkpoint %d: %s\nRESUMING WITH THE NEW SETTINGS (checkpoint.allow_optimizer_change"
                        "=true)", step, text)
    if problems:
        raise ResumeRefused(f"cannot resume from checkpoint {step}:\n" + "\n".join(problems))
    return start


def _check_init_from(cfg: TrainConfig, meta: dict[str, Any]) -> None:
    """checkpoint.init_from's run must have had this config's model, loss, optimizer and skip-step
    settings (init_from_changes), but for those checkpoint.init_from_allow_changes names (logged)."""
    refused, allowed = init_from_changes(meta.get("config", {}), cfg, meta.get("model_resolved"),
                                         cfg.checkpoint.init_from_allow_changes)
    for line in allowed:
        log.warning("checkpoint.init_from: %s (allowed by checkpoint.init_from_allow_changes)", line)
    if refused:
        raise ResumeRefused(
            f"checkpoint.init_from={cfg.checkpoint.init_from}: its run's settings differ from this config's:\n  "
            + "\n  ".join(refused) + "\nto change a setting on purpose (e.g. rope_theta for a long-context "
            "extension), name it: checkpoint.init_from_allow_changes=[rope_theta]")


def check_finite_update(step: int, row: dict[str, Any]) -> None:
    """An update applied with a non-finite loss or gradient norm leaves non-finite parameters:
    stop before they are checkpointed (skip-step-dropped updates are harmless)."""
    if not row["skipped"] and not (math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"])):
        raise RunError(f"step {step}: loss {row['loss']}, grad norm {row['grad_norm']} were applied to the "
                       "parameters, which are no longer finite; stopping without saving them (lower lr, "
                       "or enable skip_step)")


def check_final_loss(row: dict[str, Any]) -> None:
    """A run that ends on a non-finite loss (updates the skip step dropped) did not succeed."""
    if row and not math.isfinite(row["loss"]):
        raise RunError(f"the run ended with a non-finite loss ({row['loss']}) at step {row['step']}; its "
                       "last checkpoint holds the parameters before the dropped updates")


def train(cfg: TrainConfig, run_dir: str | Path) -> dict[str, Any]:
    """Runs (or resumes) to ``cfg.steps``; returns the summary. Exits 0 early on SIGTERM."""
    run_dir = Path(run_dir).resolve()
    h, H = jax.process_index(), jax.process_count()
    primary = h == 0
    preemption = Preemption()

    # The manifests (fingerprints recomputed) and the model must agree before anything is built.
    manifests = data_contract.load_manifests(cfg.data)
    seq_len, _ = data_contract.check_data(manifests, model.get_config(cfg.model, **cfg.model_overrides),
                                          cfg.seq_len)
    data_contract.check_heldout_for_eval(manifests, cfg.eval_every)  # before step 0, not at step eval_every
    eval_labels = data_contract.check_eval_sets(manifests, cfg.eval.sets) if cfg.eval_every else []
    try:
        trackers_lib.check_installed(cfg.log)
    except ValueError as e:
        raise RefusedConfigError(str(e)) from None
    G = cfg.global_batch_size
    loader_cfg = LoaderConfig(data=cfg.data, global_batch_size=G, seed=cfg.seed, split="train",
                              weights=cfg.data_weights, order=cfg.data_order)
    data_contract.check_plan(loader_cfg, manifests)  # data_weights etc., before the run dir is written

    b = build(cfg)
    model_cfg, mesh = b.model_cfg, b.mesh
    mesh_lib.check_host_rows(mesh, G, seq_len, h, H)
    mesh_lib.check_microbatches(mesh, G, cfg.microbatches)
    attention_impl = check_attention(model_cfg, mesh, seq_len)
    log.info("process %d/%d, %d devices, mesh %s, model %s (%.3fM params), seq_len %d, G %d in %d microbatch(es), "
             "attention %s (attention_impl=%s), remat %s", h, H, jax.device_count(), dict(mesh.shape), cfg.model,
             model.count_params(model_cfg) / 1e6, seq_len, G, cfg.microbatches, attention_impl,
             cfg.model_overrides.get("attention_impl", model.get_config(cfg.model).attention_impl), model_cfg.remat)

    evaluator = (evaluate.Evaluator(b.eval_step, heldout.open_sets(manifests, eval_labels, cfg.eval.instances),
                                    mesh, G, cfg.eval_batches, h, H, cfg.eval.instances) if eval_labels else None)
    ckpt = Checkpoints(run_dir, cfg.checkpoint)  # the run's one checkpoint object, from here on
    state = _initial_state(cfg, b, ckpt, loader_cfg)
    optim.check_and_log_state(cfg, state.opt_state)
    train_step = b.train_step
    flops = model.flops_per_token(model_cfg, seq_len)
    peak = peak_lib.device_peak(cfg.log.peak_tflops_per_device, jax.devices()[0])
    log.info("%s", peak.why)
    metrics_log = logs.JsonlWriter(run_dir / logs.METRICS, state.step) if primary else None
    replay = _double_sharding_replay(cfg, loader_cfg)  # None: always, except the lessons experiment
    logged_hosts = [h] if replay is None else list(range(replay.simulated_hosts))
    logged_count = H if replay is None else replay.simulated_hosts
    if primary:
        logs.truncate_other_data_logs(run_dir, logged_count, state.step)
    data_logs = [logs.JsonlWriter(run_dir / logs.DATA_LOG_DIR / contract.data_log_name(x, logged_count), state.step)
                 for x in logged_hosts]
    progress = logs.Progress(cfg.steps, cfg.log.progress_every, primary)
    if primary:  # the resolved config, for people (the audit reads run.json)
        logs.write_summary(run_dir / logs.CONFIG, {"config": cfg.to_dict(), "process_count": H})
    it = make_loader(loader_cfg, h, H, start_step=state.step, sampler=replay,
                     unsafe_double_sharding_experiment=replay is not None)
    # run.json: the run as the audit sees it (G, seed, plan, order, hosts per step range), written at
    # every start before the first step; every host checks it, the primary writes it. The
    # double-sharding replay records its simulated hosts: the ones whose data logs it writes.
    data_contract.update_run_record(str(run_dir), data_contract.run_record(
        manifests=manifests, global_batch_size=G, seed=cfg.seed, weights=cfg.data_weights,
        loader_fingerprint=it.fingerprint, host_count=logged_count, order=it.plan.order,
        model={"name": cfg.model, "vocab_size": model_cfg.vocab_size, "params": model.count_params(model_cfg),
               "attention_impl": attention_impl}),
        state.step, write=primary, allow_stream_change=cfg.checkpoint.allow_data_mismatch)
    trackers = trackers_lib.Trackers(
        cfg.log, run_dir, state.step, lambda: logs.read_jsonl(run_dir / logs.METRICS),
        {"config": cfg.to_dict(), "data": list(cfg.data), "manifest_fingerprints": [m.fingerprint for m in manifests],
         "loader_fingerprint": it.fingerprint, "process_count": H, "params": model.count_params(model_cfg)},
        enabled=primary)
    preempted = False
    row: dict[str, Any] = {}
    try:
        while state.step < cfg.steps:
            s, t0 = state.step, time.perf_counter()
            batch = next(it)
            t_data = time.perf_counter() - t0
            state.params, state.opt_state, m = train_step(
                state.params, state.opt_state, np.int32(s), mesh_lib.global_batch(batch, mesh, G))
            row = {"step": s, **{k: float(v) for k, v in m.items()}}
            parts = ([(batch["index"], batch["example"])] if replay is None else
                     list(zip(replay.split(batch["index"]), replay.split(batch["example"]))))
            for writer, (index, example) in zip(data_logs, parts):
                writer.write(contract.data_log_row(s, index, example))
            state.data_sha256 = contract.chain_data_sha256(state.data_sha256, s, logs.gather_global(batch["example"]))
            state.step, state.tokens = s + 1, state.tokens + G * seq_len
            dt = time.perf_counter() - t0
            row["skipped"] = bool(row["skipped"])
            row.update(tokens=state.tokens, tokens_per_s=G * seq_len / dt, step_time_s=dt, data_time_s=t_data)
            row["tflops_per_device"] = flops * row["tokens_per_s"] / jax.device_count() / 1e12
            row["mfu"] = peak_lib.mfu(row["tflops_per_device"], peak)
            if evaluator and (state.step % cfg.eval_every == 0 or state.step == cfg.steps):
                t_eval = time.perf_counter()
                row.update(evaluator(state.params))
                row["eval_time_s"] = time.perf_counter() - t_eval
            if metrics_log:
                metrics_log.write(row)
            trackers.write(row)
            progress.update(s, row, dt)
            check_finite_update(s, row)
            preempted = preemption.agreed()
            due = cfg.checkpoint_every and state.step % cfg.checkpoint_every == 0
            if due or preempted or state.step == cfg.steps:
                ckpt.save(state.step, state.params, state.opt_state, it, state.meta(cfg, b.model_cfg))
            if preempted:
                break
        ckpt.wait()
        if state.step == cfg.steps:
            check_final_loss(row)
    finally:
        it.close()
        for writer in data_logs:
            writer.close()
        if metrics_log:
            metrics_log.close()
        trackers.close()
        if evaluator:
            evaluator.close()
        ckpt.close()
        preemption.restore()
    if preempted:
        log.warning("preempted: checkpoint %d saved in %s; exiting", state.step, ckpt.directory)
        return {"step": state.step, "preempted": True}
    return _summarize(run_dir, state, primary)


def check_attention(model_cfg: model.ModelConfig, mesh: jax.sharding.Mesh, seq_len: int) -> str:
    """The attention implementation this run uses ("xla" or "splash", resolved for the mesh's
    platform); a data seq_len it cannot run (splash block sizes, attention_chunk) or splash on GPU
    is a DataContractError naming the model field (exit 2), before step 0."""
    try:
        impl = model.attention.resolve_impl(model_cfg.attention_impl, model.attention.platform_of(mesh))
        model.attention.check_seq_len(model_cfg, seq_len, impl)
    except ValueError as e:
        raise data_contract.DataContractError(f"the model config cannot run this data (seq_len {seq_len}): {e}") from None
    return impl


def _double_sharding_replay(cfg: TrainConfig, loader_cfg: LoaderConfig) -> DoubleShardingReplay | None:
    """The double-sharding bug's sampler when the experiment's UNSAFE switch is set (else None).

    One process replays all simulated hosts and logs one data log per simulated host."""
    n = cfg.UNSAFE_double_sharding_experiment_hosts
    if not n:
        return None
    if jax.process_count() != 1:
        raise ValueError("UNSAFE_double_sharding_experiment_hosts replays the bug in a single process")
    log.error("UNSAFE_double_sharding_experiment_hosts=%d: replaying the DOUBLE-SHARDING BUG on purpose "
              "(the lessons experiment); this run's data is wrong and its audit will fail", n)
    _, plan = load_plan(loader_cfg)
    return DoubleShardingReplay(cfg.global_batch_size, n, plan.size)


def _summarize(run_dir: Path, state: RunState, primary: bool) -> dict[str, Any]:
    summary = {"step": state.step, "params_sha256": logs.params_sha256(state.params),
               "data_sha256": state.data_sha256, "tokens": state.tokens,
               "process_count": jax.process_count()}
    if primary:
        rows = logs.read_jsonl(run_dir / logs.METRICS)
        summary["last_losses"] = logs.last_losses(rows)
        held = [r["heldout_loss"] for r in rows if "heldout_loss" in r]
        summary["heldout_loss"] = held[-1] if held else None
        logs.write_summary(run_dir / logs.SUMMARY, summary)
        print(f"done: step {state.step}; metrics in {run_dir / logs.METRICS}, "
              f"summary in {run_dir / logs.SUMMARY}", flush=True)
    return summary
