"""Where people watch a run: TensorBoard event files and Weights & Biases (primary process only).

Every scalar of a metrics.jsonl row goes to each tracker at the row's step (olmax's 0-based step:
row s is the update on batch s), under OLMo-core's metric names where OLMo-core has one
(`tag`), so an olmax run and AI2's sit side by side in the same tools; held-out sets also get
their perplexity (`eval/lm/<set>/PPL`, as OLMo-core's LMEvaluator logs it).

Resume: the trainer re-runs the steps after its last checkpoint k, and metrics.jsonl is cut back
to the rows before k. TensorBoard: each start writes a new event file that begins with a
SessionLog.START at step k (`purge_step`): TensorBoard's readers drop every event of an earlier
file at step ≥ k, so each step holds the values of the run that continued. Every row is flushed
before the next step (EventFileWriter.flush waits for its queue), so the steps before a
checkpoint are in the event files before that checkpoint is written. A tracker turned on for a
run that already has steps (no event files yet, or no W&B run id) first gets those steps from
metrics.jsonl. W&B: the run id is kept in run_dir/trackers.json and the run resumed with it;
steps W&B already holds are not sent again (W&B keeps the first value of a step; an exact resume
re-computes the same losses).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import secrets
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from contract import downstream as ds
from contract.rundir import RunDir

if TYPE_CHECKING:
    from trainer.config.schema import LogConfig, WandbConfig

log = logging.getLogger(__name__)

TENSORBOARD_DIR = RunDir.TENSORBOARD
TRACKERS_STATE = RunDir.TRACKERS_STATE  # {"wandb_run_id": ...}
OVERALL_LABEL = "overall"  # the held-out sets' token-weighted mean, beside the sets in eval/lm/

# metrics.jsonl key → tracker tag (OLMo-core's names where it logs the same quantity).
TAGS = {
    "loss": "train/CE loss",
    "z_loss": "train/Z loss",
    "target_tokens": "train/target tokens",
    "grad_norm": "optim/total grad norm",
    "lr": "optim/LR (group 0)",
    "skipped": "optim/step skipped",
    "tokens": "throughput/total tokens",
    "tokens_per_s": "throughput/tokens per second",
    "step_time_s": "throughput/step time (s)",
    "data_time_s": "throughput/data wait (s)",
    "eval_time_s": "throughput/eval time (s)",
    "tflops_per_device": "throughput/TFLOPs per device",
    "mfu": "throughput/MFU",
    "heldout_loss": f"eval/lm/{OVERALL_LABEL}/CE loss",
    "heldout_tokens": f"eval/lm/{OVERALL_LABEL}/tokens",
}
# Keys already in OLMo-core's namespace go to the trackers as they are: the downstream metrics,
# 'eval/downstream/<label> (<metric label>)' (trainer.downstream.metric.metric_key), spaces and
# parentheses included (TensorBoard tags and W&B keys are any string; '/' groups them in both).
OLMO_CORE_PREFIXES = (ds.METRIC_KEY_PREFIX + "/",)
HELDOUT_PREFIX = "heldout/"  # trainer.heldout_eval's per-set keys: heldout/<set>/loss, heldout/<set>/tokens
SET_SUFFIXES = {"loss": "CE loss", "tokens": "tokens"}


def tag(key: str) -> str:
    """The tracker name of a metrics.jsonl key (pure): TAGS, `heldout/<set>/loss` →
    `eval/lm/<set>/CE loss`, a key in OLMo-core's namespace (OLMO_CORE_PREFIXES) itself, anything
    else `olmax/<key>`."""
    if key in TAGS:
        return TAGS[key]
    if key.startswith(OLMO_CORE_PREFIXES):
        return key
    if key.startswith(HELDOUT_PREFIX):
        label, _, what = key[len(HELDOUT_PREFIX) :].rpartition("/")
        if label and what in SET_SUFFIXES:
            return f"eval/lm/{label}/{SET_SUFFIXES[what]}"
    return f"olmax/{key}"


def scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """One metrics row → {tag: value} (pure): every number and bool of the row but its step
    (None = not measured, left out), plus the perplexity of each held-out loss."""
    out = {}
    for key, value in row.items():
        if key == "step" or value is None or not isinstance(value, (int, float, bool)):
            continue
        out[tag(key)] = float(value)
        if key == "heldout_loss" or (key.startswith(HELDOUT_PREFIX) and key.endswith("/loss")):
            ppl = tag(key).removesuffix("CE loss") + "PPL"
            out[ppl] = math.exp(value) if value < 700 else math.inf
    return out


def check_labels(labels: Iterable[str]) -> None:
    """A held-out set named like the overall would share its tracker names: refused."""
    if OVERALL_LABEL in labels:
        raise ValueError(
            f"a held-out set is named {OVERALL_LABEL!r}, the trackers' name of the sets' "
            "token-weighted mean (eval/lm/overall/...): rename the source"
        )


def check_installed(log_cfg: LogConfig) -> None:
    """The configured trackers' packages are importable (ValueError naming the extra otherwise),
    checked before the run directory is written."""
    if log_cfg.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ValueError("log.tensorboard is true but tensorboard is not installed: pip install tensorboard")
    if log_cfg.wandb is not None and importlib.util.find_spec("wandb") is None:
        raise ValueError("log.wandb is set but wandb is not installed: pip install 'olmax[wandb]'")


class TensorBoard:
    """Event files under run_dir/tensorboard, written with TensorBoard's own EventFileWriter."""

    def __init__(self, run: RunDir, start_step: int):
        # the tensorboard extra: imported where it is configured (check_installed said it is there)
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._pb = event_pb2
        folder = run.tensorboard
        self.fresh = not (folder.is_dir() and any(folder.glob("events.out.tfevents.*")))
        self._writer = EventFileWriter(str(folder))
        if not self.fresh:  # drop what an earlier start logged from start_step on
            self._writer.add_event(
                event_pb2.Event(step=start_step, session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START))
            )

    def write(self, step: int, values: Mapping[str, float]) -> None:
        from tensorboard.compat.proto import summary_pb2  # the tensorboard extra (as above)

        summary = summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in values.items()]
        )
        self._writer.add_event(self._pb.Event(step=step, summary=summary))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class Wandb:
    """A W&B run (resumed by the id in run_dir/trackers.json)."""

    def __init__(self, cfg: WandbConfig, run: RunDir, config: Mapping[str, Any]):
        import wandb  # the wandb extra: imported only where log.wandb is configured

        state_path = run.trackers_state
        state = json.loads(state_path.read_text()) if state_path.is_file() else {}
        self.fresh = "wandb_run_id" not in state
        run_id = state.get("wandb_run_id") or secrets.token_hex(6)  # W&B ids: [a-z0-9]
        if self.fresh:
            tmp = state_path.with_suffix(".tmp")
            tmp.write_text(json.dumps({**state, "wandb_run_id": run_id}) + "\n")
            os.replace(tmp, state_path)
        self.run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            name=cfg.name or run.path.name,
            mode=cfg.mode,
            id=run_id,
            resume="allow",
            dir=str(run),
            config=dict(config),
            allow_val_change=True,
            settings=wandb.Settings(console="off"),
        )
        try:  # steps W&B holds already (a run resumed online); a disabled run has none
            self._first_new = int(self.run.step or 0)
        except Exception:  # noqa: BLE001 — wandb's disabled/shared runs refuse .step in their own ways
            self._first_new = 0

    def write(self, step: int, values: Mapping[str, float]) -> None:
        if step >= self._first_new:
            self.run.log(dict(values), step=step)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.run.finish()


class Trackers:
    """The configured trackers of the primary process (none elsewhere). `write(row)` each metrics
    row; `close()` at the end."""

    def __init__(
        self,
        log_cfg: LogConfig,
        run: RunDir,
        start_step: int,
        earlier_rows: Callable[[], Iterable[Mapping[str, Any]]],
        config: Mapping[str, Any],
        enabled: bool,
    ):
        self._all: list[Any] = []
        if not enabled:
            return
        if log_cfg.tensorboard:
            self._all.append(TensorBoard(run, start_step))
        if log_cfg.wandb is not None:
            self._all.append(Wandb(log_cfg.wandb, run, config))
        new = [t for t in self._all if t.fresh]
        if new and start_step > 0:  # a tracker turned on mid-run starts with the steps logged before
            for row in earlier_rows():
                if row["step"] < start_step:
                    for t in new:
                        t.write(int(row["step"]), scalars(row))
            for t in new:
                t.flush()

    def write(self, row: Mapping[str, Any]) -> None:
        values = scalars(row)
        for t in self._all:
            t.write(int(row["step"]), values)
            t.flush()

    def close(self) -> None:
        for t in self._all:
            t.close()
