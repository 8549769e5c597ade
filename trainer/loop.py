"""One training run: set up (or restore) the state, then step, log, evaluate and checkpoint.

Call after ``jax.distributed.initialize`` (multi-host) — see ``trainer.main``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

import contract
import model
from contract.errors import Stopped
from contract.rundir import RunDir
from dataloader import LoaderConfig, golden, make_loader
from dataloader import checkpoint as data_checkpoint
from dataloader.double_sharding import DoubleShardingReplay, experiment_sampler
from dataloader.loader import DataIterator, HostSliceSampler, Sampler
from dataloader.plan import Plan
from trainer import data_contract, logs, optim, startup
from trainer import evaluators as evaluators_lib
from trainer import mesh as mesh_lib
from trainer import peak as peak_lib
from trainer.build import Built, build
from trainer.checkpointing.checkpoints import Checkpoints, RefusedConfigError, key_from_json, key_to_json
from trainer.checkpointing.resume import init_from_changes, resume_changes
from trainer.config.schema import TrainConfig
from trainer.mesh import PyTree
from trainer.preemption import Preemption
from trainer.step_log import StepLogger

log = logging.getLogger(__name__)


class RunError(Stopped, RuntimeError):
    """The run stops for the reason in the message (exit 1)."""


class ResumeRefused(RunError, RefusedConfigError):
    """The config does not fit the checkpoint it would resume (exit 2, like any refused config).
    A RefusedConfigError too, so trainer.checkpointing.checkpoints passes it on as a refusal, unwrapped."""


@dataclasses.dataclass
class RunState:
    params: PyTree
    opt_state: PyTree
    step: int  # updates applied = the next loader step
    rng: jax.Array  # training RNG (typed key), checkpointed bit-exactly
    data_sha256: str  # hash of the stream consumed so far (contract.chain_data_sha256)
    tokens: int  # tokens consumed so far (incl. PAD)
    # summary.json's running part, saved in each checkpoint's meta; None: restored from a checkpoint
    # saved without it (the step logger then reads it from the log's tail)
    summary: logs.RunningSummary | None = dataclasses.field(default_factory=logs.RunningSummary)

    def meta(self, cfg: TrainConfig, model_cfg: model.ModelConfig, seq_len: int) -> dict[str, Any]:
        """The checkpoint's meta item; ``model_resolved``: the ModelConfig the run used, so a
        resume compares the model itself, not its name as today's code resolves it; ``seq_len``:
        the data's (``Checked.seq_len``), which scoring the step after the fact checks its task
        files' context length with; ``summary``: summary.json's running part up to this step."""
        assert self.summary is not None, "the step logger sets it before the first step"
        return {
            "step": self.step,
            "rng": key_to_json(self.rng),
            "data_sha256": self.data_sha256,
            "tokens": self.tokens,
            "process_count": jax.process_count(),
            "device_count": jax.device_count(),
            "config": cfg.to_dict(),
            "model_resolved": dataclasses.asdict(model_cfg),
            "seq_len": seq_len,
            "summary": self.summary.to_json(),
        }


def _initial_state(cfg: TrainConfig, b: Built, ckpt: Checkpoints, loader_cfg: LoaderConfig, plan: Plan) -> RunState:
    """The run's own newest intact checkpoint, else ``checkpoint.init_from``'s state, else a fresh one."""
    abstract_params, abstract_opt = b.abstract_state()
    checked: dict[int, int] = {}  # step → its data position, from check

    def check(step: int, meta: dict[str, Any], data: dict[str, Any]) -> None:  # before any array is read
        checked[step] = _check_resume(cfg, loader_cfg, plan, step, data, meta)

    found = ckpt.restore_latest(abstract_params, abstract_opt, check)  # the newest intact step
    if found is not None:
        latest, r = found
        meta = r["meta"]
        _check_positions(latest, checked[latest], meta)
        log.info(
            "restored checkpoint %d from %s (written by %d process(es))", latest, ckpt.directory, meta["process_count"]
        )
        saved = meta.get("summary")  # (a checkpoint saved before the summary was kept has none)
        return RunState(
            r["params"],
            r["opt_state"],
            latest,
            key_from_json(meta["rng"]),
            meta["data_sha256"],
            int(meta["tokens"]),
            None if saved is None else logs.RunningSummary.from_json(saved),
        )
    init_rng, train_rng = jax.random.split(jax.random.key(cfg.init_seed))  # init_rng = init_key(cfg)
    started = ckpt.restore_init_from(
        abstract_params,
        abstract_opt,  # None unless checkpoint.init_from
        lambda meta: _check_init_from(cfg, meta),
    )
    if started is not None:  # a new stage: Adam's state goes on, the skip step's history starts anew
        params, opt_state = started[0], optim.without_skip_history(started[1])
    else:
        params, opt_state = b.init_state(init_rng)
    return RunState(params, opt_state, 0, train_rng, "", 0)


def init_key(cfg: TrainConfig) -> jax.Array:
    """The key a fresh run's parameters are drawn with (``model.init(model_cfg, init_key(cfg))``):
    bench.olmo_reference gives OLMo-core the same initial weights through it."""
    return jax.random.split(jax.random.key(cfg.init_seed))[0]


def data_mismatch_text(e: data_checkpoint.StateMismatchError) -> str:
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
    return (
        f"its data item is at step {data_step}, its meta says step {meta.get('step')!r}: the data "
        "position would not match the parameters, so it cannot be resumed exactly (move it aside "
        "to resume from an older step)"
    )


def _check_positions(step: int, data_step: int, meta: dict[str, Any]) -> None:
    problem = position_problem(step, data_step, meta)
    if problem:
        raise ResumeRefused(f"cannot resume from checkpoint {step}: {problem}")


def _check_resume(
    cfg: TrainConfig, loader_cfg: LoaderConfig, plan: Plan, step: int, data_state: dict, meta: dict[str, Any]
) -> int:
    """The loader step to resume from. A different data stream or different optimizer/schedule
    settings than the checkpoint's are refused together, each naming the override that allows
    it (``checkpoint.allow_data_mismatch`` / ``allow_optimizer_change``), and logged if allowed.
    A data stream this code no longer computes (golden.StreamChangedError) and data and meta
    at different steps are refused too (no override)."""
    problems, start = [], -1
    try:
        start = data_checkpoint.check_state(loader_cfg, data_state, cfg.checkpoint.allow_data_mismatch, plan)
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
            problems.append(
                text + "\nto resume with the new settings anyway, add the override "
                "checkpoint.allow_optimizer_change=true"
            )
        else:
            log.warning(
                "checkpoint %d: %s\nRESUMING WITH THE NEW SETTINGS (checkpoint.allow_optimizer_change=true)", step, text
            )
    if problems:
        raise ResumeRefused(f"cannot resume from checkpoint {step}:\n" + "\n".join(problems))
    return start


def _check_init_from(cfg: TrainConfig, meta: dict[str, Any]) -> None:
    """checkpoint.init_from's run must have had this config's model, loss, optimizer and skip-step
    settings (init_from_changes), but for those checkpoint.init_from_allow_changes names (logged)."""
    refused, allowed = init_from_changes(
        meta.get("config", {}), cfg, meta.get("model_resolved"), cfg.checkpoint.init_from_allow_changes
    )
    for line in allowed:
        log.warning("checkpoint.init_from: %s (allowed by checkpoint.init_from_allow_changes)", line)
    if refused:
        raise ResumeRefused(
            f"checkpoint.init_from={cfg.checkpoint.init_from}: its run's settings differ from this config's:\n  "
            + "\n  ".join(refused)
            + "\nto change a setting on purpose (e.g. rope_theta for a long-context "
            "extension), name it: checkpoint.init_from_allow_changes=[rope_theta]"
        )


def check_finite_update(step: int, row: dict[str, Any]) -> None:
    """An update applied with a non-finite loss or gradient norm leaves non-finite parameters:
    stop before they are checkpointed (skip-step-dropped updates are harmless)."""
    if not row["skipped"] and not (math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"])):
        raise RunError(
            f"step {step}: loss {row['loss']}, grad norm {row['grad_norm']} were applied to the "
            "parameters, which are no longer finite; stopping without saving them (lower lr, "
            "or enable skip_step)"
        )


def check_final_loss(row: dict[str, Any]) -> None:
    """A run that ends on a non-finite loss (updates the skip step dropped) did not succeed."""
    if row and not math.isfinite(row["loss"]):
        raise RunError(
            f"the run ended with a non-finite loss ({row['loss']}) at step {row['step']}; its "
            "last checkpoint holds the parameters before the dropped updates"
        )


def train(checked: startup.Checked, run: RunDir, preemption: Preemption | None = None) -> dict[str, Any]:
    """Runs (or resumes) to ``checked.cfg.steps``; returns the summary. Exits 0 early on SIGTERM or a
    first Ctrl-C. The loop's one door: checked is ``trainer.preflight.prepare``'s (every start-up
    check passed, the run directory locked), and nothing here checks the config again (a config
    alone is a TypeError); run: the run directory as the command line resolved it
    (``contract.cli.run_dir``); preemption: the signals' handlers (``trainer.main`` installs them
    when its checks passed); made (and put back on return) here if None."""
    if not isinstance(checked, startup.Checked):
        raise TypeError(
            f"train takes the start-up's Checked (trainer.preflight.prepare(cfg, run)), not {type(checked).__name__}"
        )
    cfg = checked.cfg
    h, H, G = jax.process_index(), jax.process_count(), cfg.global_batch_size
    preempted, row = False, {}
    with contextlib.ExitStack() as stack:  # every resource of the run, closed in reverse on any exit
        if preemption is None:  # first: a SIGTERM while the run starts is a preemption too
            preemption = Preemption()
            stack.callback(preemption.restore)
        b, seq_len = build(checked), checked.seq_len
        _log_start(checked, b)
        evaluators = evaluators_lib.make_evaluators(checked, b, h, H)
        for evaluator in evaluators:
            stack.callback(evaluator.close)
        ckpt = Checkpoints(run, cfg.checkpoint)  # the run's one checkpoint object, from here on
        stack.callback(ckpt.close)
        state = _initial_state(cfg, b, ckpt, checked.loader_cfg, checked.plan)
        optim.check_and_log_state(cfg, state.opt_state)
        # (a checkpoint is saved after an update: step 0 is a fresh or init_from state, none of this run's)
        preemption.started, preemption.checkpoint = True, state.step or None
        it, logger = _open_stream(checked, b, run, state, stack)
        metrics = _Metrics(logger, G * seq_len)
        while state.step < cfg.steps:
            s, t0 = state.step, time.perf_counter()
            batch = next(it)
            t_data = time.perf_counter() - t0
            lr = b.schedule(s)  # OLMo-core's float64 rate, applied as float32, logged as it is
            state.params, state.opt_state, m = b.train_step(  # dispatched: the device runs it while the host goes on
                state.params, state.opt_state, np.float32(lr), mesh_lib.global_batch(batch, b.mesh, G)
            )
            logger.data(s, batch)
            state.data_sha256 = contract.chain_data_sha256(state.data_sha256, s, logs.gather_global(batch["example"]))
            state.step, state.tokens = s + 1, state.tokens + G * seq_len
            metrics.read_previous()  # step s-1's metrics, one step late: step s is already queued behind it
            metrics.hold(s, {**m, "lr": lr}, t0, t_data, state.tokens)
            preempted = preemption.agreed(state.step, ckpt.manager)
            save = bool(cfg.checkpoint.every and state.step % cfg.checkpoint.every == 0) or state.step == cfg.steps
            due = [e for e in evaluators if evaluators_lib.due(e, state.step, cfg.steps)]
            if save or preempted or due:  # a boundary: wait for this step (its metrics, checks and evaluations)
                row = metrics.read(functools.partial(_evaluate, due, state.params))
            if save or preempted:
                ckpt.save(state.step, state.params, state.opt_state, it, state.meta(cfg, b.model_cfg, checked.seq_len))
                preemption.checkpoint = state.step
            if preempted:
                break
        ckpt.wait()
        if state.step == cfg.steps:
            check_final_loss(row)
    if preempted:
        log.warning(
            "preempted: checkpoint %d (after step %d) saved in %s; exiting (rerun the same command to resume)",
            state.step,
            state.step - 1,
            ckpt.directory,
        )
        return {"step": state.step, "preempted": True}
    return _summarize(run, state, h == 0)


def _evaluate(due: list[evaluators_lib.PeriodicEvaluator], params: PyTree, row: dict[str, Any]) -> None:
    """Adds the keys of each evaluation ``due`` after this step to its metrics ``row``."""
    for e in due:
        row.update(e(params))


class _Metrics:
    """The loop's metrics rows, read one step late (as MaxText logs): the step dispatched last is
    held, and read (``float``: waits for it) once the next one is dispatched, so the host never
    waits on the device between steps; at a boundary (checkpoint, evaluation, preemption, the last
    step) the loop reads the step it just dispatched. A row's content is the same either way: its
    ``step_time_s`` is the time between two reads (the step's period when steps run back to back)."""

    def __init__(self, logger: StepLogger, step_tokens: int):
        self.logger, self.step_tokens = logger, step_tokens
        self.held: tuple[int, dict[str, jax.Array | float], float, float, int] | None = None
        self.last_read = 0.0

    def hold(self, step: int, metrics: dict[str, jax.Array | float], t0: float, t_data: float, tokens: int) -> None:
        self.held = (step, metrics, t0, t_data, tokens)

    def read_previous(self) -> None:
        if self.held is not None:
            self.read()

    def read(self, extend: Callable[[dict[str, Any]], object] | None = None) -> dict[str, Any]:
        """The held step's row: read, timed, extended (its evaluations), written and checked."""
        assert self.held is not None
        step, metrics, t0, t_data, tokens = self.held
        row = {"step": step, **{k: float(v) for k, v in metrics.items()}}  # waits for the step
        now = time.perf_counter()
        dt, self.last_read, self.held = now - max(t0, self.last_read), now, None
        self.logger.speed(row, tokens, self.step_tokens, dt, t_data)
        if extend is not None:
            extend(row)
        self.logger.write(step, row, dt)
        check_finite_update(step, row)
        return row


def _log_start(checked: startup.Checked, b: Built) -> None:
    cfg, m = checked.cfg, b.model_cfg
    log.info(
        "process %d/%d, %d devices, mesh %s, model %s (%.3fM params), seq_len %d, G %d in %d microbatch(es), "
        "attention %s (attention_impl=%s), remat %s",
        jax.process_index(),
        jax.process_count(),
        jax.device_count(),
        dict(b.mesh.shape),
        cfg.model,
        model.count_params(m) / 1e6,
        checked.seq_len,
        cfg.global_batch_size,
        cfg.microbatches,
        checked.attention_impl,
        checked.attention_configured,
        m.remat,
    )


def _open_stream(
    checked: startup.Checked, b: Built, run: RunDir, state: RunState, stack: contextlib.ExitStack
) -> tuple[DataIterator, StepLogger]:
    """The step logger and the loader from ``state.step``, closed by ``stack``; run.json written
    (checked against the run's record first) before the first step."""
    cfg, m, primary, H = checked.cfg, b.model_cfg, jax.process_index() == 0, jax.process_count()
    peak = peak_lib.device_peak(cfg.log.peak_tflops_per_device, jax.devices()[0])
    (log.debug if peak.tflops is None and jax.devices()[0].platform == "cpu" else log.info)("%s", peak.why)
    sampler = _sampler(cfg, checked.plan)  # this host's slice; the lessons experiment injects its own
    logger = StepLogger(cfg, run, state.step, model.flops_per_token(m, checked.seq_len), peak, sampler, state.summary)
    state.summary = logger.summary  # the logger adds every row; each checkpoint's meta saves it
    stack.callback(logger.close)
    if primary:  # the resolved config, for people (the audit reads run.json)
        logs.write_summary(run.config, {"config": cfg.to_dict(), "process_count": H})
    it = make_loader(
        checked.loader_cfg,
        jax.process_index(),
        H,
        start_step=state.step,
        sampler=sampler,
        unsafe_double_sharding_experiment=isinstance(sampler, DoubleShardingReplay),  # the guard's own opt-in
        loaded=(checked.manifests, checked.plan),  # start-up's read and plan, not again
    )
    stack.callback(it.close)
    # run.json: the run as the audit sees it (G, seed, plan, order, hosts per step range), written at
    # every start before the first step; every host checks it, the primary writes it. The
    # double-sharding replay records its simulated hosts: the ones whose data logs it writes.
    data_contract.update_run_record(
        run,
        data_contract.run_record(
            manifests=checked.manifests,
            global_batch_size=cfg.global_batch_size,
            seed=cfg.seed,
            weights=cfg.data_weights,
            loader_fingerprint=it.fingerprint,
            host_count=logger.logged_count,
            order=it.plan.order,
            model={
                "name": cfg.model,
                "vocab_size": m.vocab_size,
                "params": model.count_params(m),
                "attention_impl": checked.attention_impl,
            },
        ),
        state.step,
        write=primary,
        allow_stream_change=cfg.checkpoint.allow_data_mismatch,
    )
    logger.open_trackers(
        state.step,
        {
            "config": cfg.to_dict(),
            "data": list(cfg.data),
            "manifest_fingerprints": [x.fingerprint for x in checked.manifests],
            "loader_fingerprint": it.fingerprint,
            "process_count": H,
            "params": model.count_params(m),
        },
    )
    return it, logger


def _sampler(cfg: TrainConfig, plan: Plan) -> Sampler:
    """This host's slice of each global batch; the double-sharding bug's sampler when the lessons
    experiment's UNSAFE switch is set (one process replays all simulated hosts, and the step logger
    writes a data log per simulated host: the sampler says which)."""
    replay = experiment_sampler(cfg.UNSAFE_double_sharding_experiment_hosts, cfg.global_batch_size, plan.size)
    if replay is None:
        return HostSliceSampler(cfg.global_batch_size, jax.process_index(), jax.process_count())
    n = replay.simulated_hosts
    if jax.process_count() != 1:
        raise ValueError("UNSAFE_double_sharding_experiment_hosts replays the bug in a single process")
    log.error(
        "UNSAFE_double_sharding_experiment_hosts=%d: replaying the DOUBLE-SHARDING BUG on purpose "
        "(the lessons experiment); this run's data is wrong and its audit will fail",
        n,
    )
    return replay


def _summarize(run: RunDir, state: RunState, primary: bool) -> dict[str, Any]:
    summary = {
        "step": state.step,
        "params_sha256": logs.params_sha256(state.params),
        "data_sha256": state.data_sha256,
        "tokens": state.tokens,
        "process_count": jax.process_count(),
    }
    if primary:
        assert state.summary is not None
        summary |= state.summary.to_json()  # kept as the run went, not read back from metrics.jsonl
        logs.write_summary(run.summary, summary)
        print(
            f"done: {state.step} steps{f' (last step {state.step - 1})' if state.step else ''}; "
            f"metrics in {run.metrics}, "
            f"summary in {run.summary}",
            flush=True,
        )
    return summary
