"""Trainer configuration: typed frozen pydantic models, loaded from YAML, with dotted overrides.

One place for defaults and the values each key may take (the fields below: pydantic bounds, or
``check`` with the rule in the field's ``description``). ``trainer.config.loading`` reads the YAML
(``base`` files, ``key=value`` overrides) and turns a refusal into one line naming the key.

    cfg = load_config("trainer/configs/tiny.yaml", ["steps=20", "optimizer.mu_dtype=bfloat16"])
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from contract.config_model import (
    Finite,
    Float,
    FloatOrStr,
    Int,
    OptFloat,
    OptInt,
    OptStrs,
    Strs,
    below,
    check,
    nearest,
    refuse,
)
from contract.downstream import PRESETS as DOWNSTREAM_PRESETS
from contract.downstream import task_labels as downstream_task_labels
from contract.olmo_eval_labels import LABELS as OLMO_EVAL_LABELS
from contract.run import ORDERS
from trainer.config.context import context_refusal
from trainer.config.loading import ConfigError, Model, load

if TYPE_CHECKING:
    from model import ModelConfig

FLOAT_DTYPES = ("float32", "float64", "bfloat16", "float16")
FULL_PRECISION = ("float32", "float64")  # Adam moment dtypes accepted without the opt-in flag
SCHEDULES = ("cosine", "linear", "constant")
EVAL_INSTANCES = ("packed", "padded")  # dataloader.heldout.INSTANCES (written out: no Grain import here)
WANDB_MODES = ("online", "offline", "disabled")  # wandb.init's modes
DOWNSTREAM_PRECISIONS = ("bfloat16", "float32")  # trainer.downstream.metric.DTYPES
DOWNSTREAM_TASKS_DIR = "out/downstream/olmo3-fast"  # python -m pipelines.downstream_tasks --out's default here

# Seeds are 32-bit: the data order's (dataloader.order.SEED_MODULUS: index_shuffle and Grain take
# 32-bit seeds) and JAX's key(seed), which keeps only the low 32 bits without x64 (2**32 would
# silently be seed 0). Written out here so that the config imports no JAX or Grain; a test
# checks it equals SEED_MODULUS.
SEED_END = 2**32
SEED = "in [0, 2**32) (a 32-bit seed)"
# Step counts: the jitted step takes its step as an int32 and optax counts updates in int32, so a
# step (and the schedule's step + step_offset) must be below 2**31.
STEP_END = 2**31
StepInt = Annotated[Int, below(STEP_END, "2**31", "the step counter is int32")]
OptStepInt = Annotated[OptInt, below(STEP_END, "2**31", "the step counter is int32")]
MESH_AXIS = "-1 (the rest) or >= 1"
Dtype = Literal[FLOAT_DTYPES]  # type: ignore[valid-type]  # one tuple: the values listed once
MeshAxis = Annotated[Int, check(lambda v: v == -1 or v >= 1)]
PeakTflops = Annotated[FloatOrStr, check(lambda v: v == "auto" if isinstance(v, str) else v >= 0)]
Weights = Annotated[
    dict[str, Float] | None, check(lambda v: all(w >= 0 for w in v.values()) and any(w > 0 for w in v.values()))
]


class OptimizerConfig(Model):
    """AdamW (optax) with global-norm clipping.

    mu_dtype / nu_dtype: dtypes of Adam's first / second moments. Anything below float32 is
    refused unless the top-level ``allow_low_precision_optimizer_state`` is true (bf16 moments
    inflate the loss).
    decay_exclude: top-level parameter subtrees excluded from weight decay.
    """

    where = "optimizer."
    b1: Float = Field(0.9, ge=0, lt=1, description="in [0, 1)")
    b2: Float = Field(0.95, ge=0, lt=1, description="in [0, 1)")
    eps: Float = Field(
        1e-8, gt=0, description="> 0 (Adam divides by sqrt(nu) + eps; nu is 0 for unused embedding rows)"
    )
    weight_decay: Float = Field(0.1, ge=0, description=">= 0")
    clip_norm: Float = Field(1.0, gt=0, description="> 0")
    mu_dtype: Dtype = "float32"
    nu_dtype: Dtype = "float32"
    decay_exclude: Strs = ("embed",)


class ScheduleConfig(Model):
    """Learning-rate schedule over the update count (peak = ``TrainConfig.lr``).

    kind: "cosine" (linear warmup, cosine to final_lr_ratio x peak), "linear" (linear warmup,
    then linear to final_lr_ratio x peak) or "constant" (warmup then flat).
    decay_steps: length of warmup + decay; None means ``TrainConfig.steps``.
    step_offset: update s (0-based) uses the schedule at s + step_offset. 0: the first update's
      rate is the warmup's start (0). OLMo-core's trainer counts its step before the update, so
      its update s uses its schedule at s + 1 (the AI2 recipe sets 1).
    """

    where = "schedule."
    kind: Literal[SCHEDULES] = "cosine"  # type: ignore[valid-type]
    warmup_steps: StepInt = Field(2000, ge=0, description=">= 0")
    final_lr_ratio: Float = Field(0.1, ge=0, le=1, description="in [0, 1] (a fraction of the peak lr)")
    decay_steps: OptStepInt = Field(None, gt=0, description="> 0 (unset = steps)")
    step_offset: StepInt = Field(0, ge=0, description=">= 0")


class SkipStepConfig(Model):
    """OLMo 3 skip step (OLMo-core's ``SkipStepOptimizer``): drop an update whose loss or grad norm
    exceeds the mean of the last ``window`` steps by more than ``sigma`` sample standard deviations,
    once ``min_history`` earlier steps were seen. ``min_history`` unset (the default) is OLMo-core's
    rule, ``max(2, window // 2) - 1`` earlier steps (its ``get_step_factor`` waits for
    ``max(2, rolling_interval_length // 2)`` losses, the current one included): 63 at window 128."""

    where = "skip_step."
    enabled: bool = False
    sigma: Float = Field(6.0, gt=0, description="> 0")
    window: Int = Field(128, gt=1, description="> 1")
    min_history: OptInt = Field(None, gt=1, description="> 1 (unset = max(2, window // 2) - 1, OLMo-core's)")

    @model_validator(mode="after")
    def _history_fits_the_window(self) -> SkipStepConfig:
        if self.min_history is not None and self.min_history > self.window:
            raise refuse(f"skip_step.min_history={self.min_history} must be <= skip_step.window={self.window}")
        return self

    @property
    def history_needed(self) -> int:
        """Earlier steps seen before an update can be skipped."""
        return self.min_history if self.min_history is not None else max(2, self.window // 2) - 1


class MeshConfig(Model):
    """Device mesh ("data", "fsdp", "tensor") over all devices of all processes; -1 = the rest.

    context: context parallelism (``model.context_parallel``): each sequence's positions split over
    this many devices (a mesh axis "context" between "fsdp" and "tensor", present only when > 1),
    attention all-gathering K and V; seq_len must divide into 2 x context chunks (the zig-zag
    layout). The loader's rows are split over data x fsdp x context, every device reading whole
    rows (``trainer.mesh.batch_shards``), and laid out by position inside the step, so each host's
    loader slice is any other run's with that many hosts. 1 (the default, recorded only when set):
    no such axis, the program it always was.
    cpu_devices: if > 0, number of CPU devices per process (jax_num_cpu_devices; CPU runs only).
    """

    where = "mesh."
    data: MeshAxis = Field(1, description=MESH_AXIS)
    fsdp: MeshAxis = Field(-1, description=MESH_AXIS)
    context: Int = Field(1, ge=1, description=">= 1 (1 = no context parallelism)", exclude_if=lambda v: v == 1)
    tensor: MeshAxis = Field(1, description=MESH_AXIS)
    cpu_devices: Int = Field(0, ge=0, description=">= 0 (0 = the platform's)")


class CheckpointConfig(Model):
    """Orbax checkpoints under ``run_dir/checkpoints``.

    every: save every this many steps (0 = never), and after the last (was the top-level ``checkpoint_every``).
    keep: newest checkpoints kept (None = all); keep_period: also keep every step that is a multiple of it.
    init_from: a checkpoint step directory whose ``params`` and ``opt_state`` start a fresh run (stage 2 from
    stage 1); ignored once run_dir has its own checkpoint. Its run's model, loss, optimizer and
    skip-step settings must be this config's (``trainer.checkpointing.resume.init_from_changes``: what a resume
    compares, less the learning rate and schedule, which a new stage sets anew), else it is refused
    naming each difference.
    init_from_allow_changes: the settings init_from may change on purpose, by name (``rope_theta``
    or ``model.rope_theta`` for a long-context extension, ``document_masking``, ``optimizer`` ...);
    each change is logged.
    allow_data_mismatch: resume although the checkpoint's data state (manifest fingerprint, seed, global
    batch) differs from this config's — the data stream then does not continue the checkpointed one.
    allow_optimizer_change: resume although the optimizer, skip-step, learning-rate schedule, loss or model
    settings (``trainer.checkpointing.resume.RESUME_KEYS``) differ from the checkpointed run's. Both are refused, naming
    every difference, unless set (``checkpoint.allow_...=true`` on the command line).
    trust_unverified: resume a step that has no checksums that no olmax marked pending
    (written by an olmax from before checksums were recorded): its checksums are recorded at resume instead.
    """

    where = "checkpoint."
    every: Int = Field(50, ge=0, description=">= 0 (0 = never)")
    keep: OptInt = Field(
        3, ge=1, description=">= 1 (unset = keep all; 0 would delete every checkpoint, the last one too)"
    )
    keep_period: OptInt = Field(None, ge=1, description=">= 1 (unset = none)")
    async_save: bool = True
    init_from: str | None = None
    # left out of the record while empty, so that a run's recorded config (config.json, checkpoint
    # meta) is the same bytes as before the field existed and older runs' records still compare
    init_from_allow_changes: Strs = Field((), exclude_if=lambda v: not v)
    allow_data_mismatch: bool = False
    allow_optimizer_change: bool = False
    trust_unverified: bool = False


class EvalConfig(Model):
    """The held-out evaluation: when (``every`` steps, 0 = never, and after the last; was the top-level
    ``eval_every``), what it reads (how much: ``eval_batches``).
    instances: "packed" (a set's held-out records, as trained) or "padded" (OLMo-core's LM-eval
    instances: one document each, cut to seq_len, PAD-filled; ``dataloader.heldout``).
    sets: held-out sources evaluated, each on its own (None = all); see ``trainer.heldout_eval``."""

    where = "eval."
    every: Int = Field(25, ge=0, description=">= 0 (0 = never)")
    instances: Literal[EVAL_INSTANCES] = "packed"  # type: ignore[valid-type]
    sets: OptStrs = None

    @model_validator(mode="after")
    def _sets_are_named_once(self) -> EvalConfig:
        if self.sets is not None and not (len(self.sets) > 0 and all(self.sets)):
            raise refuse("eval.sets must name at least one source (or be unset: all)")
        if self.sets is not None and len(set(self.sets)) != len(self.sets):
            raise refuse(f"eval.sets={list(self.sets)} names a set twice")
        return self


class DownstreamConfig(Model):
    """Downstream evaluation as AI2 logs it (OLMo-core's in-loop tasks, olmo_eval's ICLMetric;
    ``trainer.downstream``), keys ``eval/downstream/<label> (<metric label>)``.

    tasks: olmo_eval task labels and/or presets (``olmo3-fast``: OLMo 3's 26 in-loop tasks,
    contract.downstream.PRESETS), as a list or comma-separated as the builder's ``--tasks``; each is
    checked against olmo_eval's labels at load (contract.olmo_eval_labels), a typo naming the nearest.
    every: steps between passes (0 = off, the default; was ``downstream.interval``).
    tasks_dir: the frozen instances ``python -m pipelines.downstream_tasks --tasks ... --out DIR``
    writes (relative to the working directory, as ``data`` is); checked at start-up when every > 0
    (``trainer.downstream.check.check_downstream``), never at load.
    precision: per-instance log-likelihoods rounded to bfloat16 as AI2's bf16 logits are (the
    default), or float32.
    batch_size: rows of seq_len tokens per downstream forward pass (unset = a training microbatch's rows;
    at most global_batch_size, checked with the run's config).
    clean_from: an audit (its audit.json or --out folder) that ran check 8 against the same task files
    (``python -m audit ... --eval-tasks tasks_dir``): each task is also logged on the instances that
    audit did not find in the training data, under its keys with " clean" appended (unset = not)."""

    where = "downstream."
    tasks: Strs = ()
    every: StepInt = Field(0, ge=0, description=">= 0 (0 = off)")
    tasks_dir: str = DOWNSTREAM_TASKS_DIR
    precision: Literal[DOWNSTREAM_PRECISIONS] = "bfloat16"  # type: ignore[valid-type]
    batch_size: OptInt = Field(None, gt=0, description="> 0 (unset = a training microbatch's rows)")
    clean_from: str | None = Field(None, exclude_if=lambda v: v is None)  # recorded only when set

    @model_validator(mode="after")
    def _tasks_are_known(self) -> DownstreamConfig:
        known = set(OLMO_EVAL_LABELS)
        for spec in (p.strip() for t in self.tasks for p in t.split(",")):
            if spec not in DOWNSTREAM_PRESETS and spec not in known:
                guess = nearest(spec, [*DOWNSTREAM_PRESETS, *OLMO_EVAL_LABELS])
                raise refuse(
                    f"downstream.tasks: unknown task {spec!r}"
                    + (f" (did you mean {guess!r}?)" if guess else "")
                    + f"; a preset ({', '.join(DOWNSTREAM_PRESETS)}) or an olmo_eval label"
                )
        if self.every and not self.labels:
            raise refuse(
                f"downstream.every={self.every} with no downstream.tasks: name the tasks "
                "(e.g. olmo3-fast) or set every 0"
            )
        if not self.tasks_dir:
            raise refuse("downstream.tasks_dir must not be empty")
        return self

    @property
    def labels(self) -> list[str]:
        """The task labels, presets expanded, each once, in the order named."""
        return downstream_task_labels(",".join(self.tasks))


class WandbConfig(Model):
    """Weights & Biases (extra ``olmax[wandb]``; ``trainer.trackers``). name: None = the run dir's
    name; mode: "online", "offline" (under ``run_dir/wandb``, no network; ``wandb sync`` later), "disabled"."""

    where = "log.wandb."
    project: str = "olmax"
    name: str | None = None
    entity: str | None = None
    mode: Literal[WANDB_MODES] = "online"  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _project_is_named(self) -> WandbConfig:
        if not self.project:
            raise refuse("log.wandb.project must not be empty")
        return self


class LogConfig(Model):
    """peak_tflops_per_device: denominator of ``mfu``, the dense bf16 peak of one device in
    TFLOP/s: "auto" looks the device kind up in trainer/peak.py's table of published peaks (an
    unknown kind, e.g. a CPU, logs MFU as absent and why); a number overrides it; 0 = no MFU.
    progress_every: console progress line every N steps (0 = never).
    tensorboard: TensorBoard event files under ``run_dir/tensorboard`` (every scalar of metrics.jsonl).
    wandb: Weights & Biases settings (None = off)."""

    where = "log."
    peak_tflops_per_device: PeakTflops = Field(
        "auto", description="'auto' (the chip's published peak, trainer/peak.py) or >= 0 (0 = no MFU)"
    )
    progress_every: Int = Field(1, ge=0, description=">= 0 (0 = never)")
    tensorboard: bool = False
    wandb: WandbConfig | None = None


LIBTPU_FLAG_NAME = re.compile(r"[a-z][a-z0-9_]*")  # as libtpu spells its flags, less the leading --


class TrainConfig(Model):
    """Everything one training run needs. ``steps`` counts optimizer updates.

    data: manifest paths (``DIR/manifest.json``) of the tokenize job; data_weights: {source name: weight}
    overriding the manifests' mixture weights (None = as tokenized). seed: data-order seed; init_seed:
    parameter-init RNG seed. seq_len: if set, must equal the manifests' seq_len.
    data_order: "grain" (weighted plan, Grain index_shuffle) or "olmo-core" (AI2's OLMo-core batch order over
    every instance in listed order; data_weights do not apply; dataloader.olmo_order).
    eval_batches: cap on the batches of each held-out set per evaluation (None = all of it; the same examples
    every time); eval: when (``eval.every``), which sets, and how their instances are built (EvalConfig).
    Each section owns its period: ``eval.every``, ``checkpoint.every``, ``downstream.every`` (the
    old ``eval_every``, ``checkpoint_every``, ``downstream.interval`` are read as aliases: ``RENAMED``).
    verify_data_gib: at start-up each process hashes its share of the shards the run reads and compares them
    with the manifests' sha256 (trainer.preflight), at most this many GiB per process (None = every shard;
    0 = none); shards past it are only structure-checked, as the start-up log lists. Once per run: shards
    hashed equal are recorded in ``run_dir/data_verified.json`` (path, size, mtime, sha256), and later starts
    hash only the shards that changed or are not recorded yet, plus verify_data_sample random others
    (dataloader.verify).
    deterministic: ask XLA for deterministic GPU kernels (``--xla_gpu_deterministic_ops``; the embedding
    gradient is a scatter-add, atomic and run-to-run different on GPU without it), which bit-exact resume
    needs; costs some GPU speed, no effect on CPU/TPU.
    UNSAFE_double_sharding_experiment_hosts: 0 (always, for training). H ≥ 2 replays the case study's
    double-sharding bug on H simulated hosts in one process (`dataloader.double_sharding`) and overrides the
    start-up guard that refuses it — only for the ``make lessons`` experiment, which measures the bug; the
    audit fails such a run.
    document_masking: attention stays within each packed document (the loader's ``segment_ids``) and RoPE
    positions restart at each document (its ``positions``); False attends across the whole packed example
    with positions 0..T-1.
    microbatches: gradient accumulation. Each step sums the token-weighted losses and gradients of N
    microbatches of the global batch inside the jitted step (``trainer.step``); the global batch, data
    stream, data log and audit are unchanged, and so is the update up to float rounding, so a resume may
    change it (not a ``RESUME_KEYS`` setting). Each batch shard's rows (global_batch_size / (data x fsdp
    devices)) must divide by N.
    loss_chunk: the cross-entropy and z-loss are computed at most ``loss_chunk`` positions at a time (the
    fewest chunks that cover seq_len, each as short as that allows: seq 512 is one chunk of 512), with the LM head
    inside the chunk loop and each chunk rematerialised in the backward pass, so the float32 ``[G, T, V]``
    logits never exist at once (``trainer.loss.chunked_loss_sums``; same value and gradient up to rounding,
    not a resume setting). 0: the full logits (``model.forward``).
    loss_backward: with ``loss_chunk`` > 0, how the training step differentiates the chunked loss.
    ``fused`` (default): each chunk's gradient with respect to its logits is formed from the softmax the
    loss already holds, and the LM head's two gradient matmuls run in the forward pass, in the compute
    dtype (``trainer.loss.fused_chunked_objective``): 3 head matmuls per chunk. ``recompute``: autodiff
    through the rematerialised chunks (4 head matmuls per chunk, the gradient matmuls on float32
    cotangents). Same value and gradient up to rounding; not a resume setting. Evaluation needs no
    gradient and runs the chunked sums either way.
    libtpu_flags: libtpu compiler flags this recipe runs with, name → value (``{xla_tpu_scoped_vmem_limit_kib:
    98304}``), put into ``LIBTPU_INIT_ARGS`` before the backend starts (``trainer.libtpu_flags``; a flag the
    environment already sets keeps its value). Compiler settings, not the function computed: not a resume
    setting. Read by libtpu only (no effect on a CPU).
    fused_update: the skip step decides by a select instead of ``lax.cond`` (``trainer.optim.skip_step``),
    so XLA can fuse Adam, weight decay and the parameter step into one pass over the float32 state
    instead of materialising the update between them (only with ``skip_step.enabled``). The same values
    (both compute the update and keep it or the old state); off by default; recorded only when on; not
    a resume setting.
    downstream: in-loop downstream tasks (DownstreamConfig; off by default).
    """

    # keys that moved: read under their old name (a recipe, an override, a checkpoint's recorded config)
    renamed: ClassVar[dict[str, str]] = {
        "eval_every": "eval.every",
        "checkpoint_every": "checkpoint.every",
        "downstream.interval": "downstream.every",
    }

    data: Strs = ("out/sample/manifest.json",)
    data_weights: Weights = Field(None, description="weights >= 0, not all 0")
    model: str = "olmo3-tiny"
    model_overrides: Annotated[dict[str, Any], Finite] = Field(default_factory=dict)
    steps: StepInt = Field(100, gt=0, description="> 0")
    global_batch_size: Int = Field(8, gt=0, description="> 0")
    seq_len: OptInt = Field(None, gt=0, description="> 0")
    seed: Int = Field(0, ge=0, lt=SEED_END, description=SEED)
    data_order: Literal[tuple(sorted(ORDERS))] = "grain"  # type: ignore[valid-type]
    init_seed: Int = Field(0, ge=0, lt=SEED_END, description=SEED)
    lr: Float = Field(3e-4, ge=0, description=">= 0")
    z_loss: Float = Field(1e-5, ge=0, description=">= 0")
    eval_batches: OptInt = Field(None, gt=0, description="> 0 (unset = each held-out set whole)")
    verify_data_gib: OptFloat = Field(
        None, ge=0, description=">= 0 (unset = hash every shard; 0 = check their structure only)"
    )
    verify_data_sample: Int = Field(64, ge=0, description=">= 0 shards re-hashed at random per start")
    allow_low_precision_optimizer_state: bool = False
    UNSAFE_double_sharding_experiment_hosts: Annotated[Int, check(lambda v: v == 0 or v >= 2)] = Field(
        0, description="0 (training), or >= 2 simulated hosts for the experiment"
    )
    deterministic: bool = True
    document_masking: bool = True
    microbatches: Int = Field(1, ge=1, description=">= 1 (1 = the whole batch at once)")
    loss_chunk: Int = Field(1024, ge=0, description=">= 0 (0 = full-sequence logits)")
    loss_backward: Literal["fused", "recompute"] = "fused"
    # recorded only when set, so a recipe without flags records the same bytes as before the key existed
    libtpu_flags: dict[str, Int | bool | str] = Field(default_factory=dict, exclude_if=lambda v: not v)
    fused_update: bool = Field(False, exclude_if=lambda v: not v)  # recorded only when on, as libtpu_flags
    optimizer: OptimizerConfig = OptimizerConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    skip_step: SkipStepConfig = SkipStepConfig()
    mesh: MeshConfig = MeshConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    eval: EvalConfig = EvalConfig()
    log: LogConfig = LogConfig()
    # left out of the record while at its default (off, no tasks), as checkpoint.init_from_allow_changes is:
    # the recorded config of a run that does not use it is the same bytes as before the section existed
    downstream: DownstreamConfig = Field(DownstreamConfig(), exclude_if=lambda v: v == DownstreamConfig())

    @model_validator(mode="after")
    def _data_and_hosts(self) -> TrainConfig:
        for name, value in self.libtpu_flags.items():
            if not LIBTPU_FLAG_NAME.fullmatch(name) or (
                isinstance(value, str) and (not value or any(c.isspace() for c in value))
            ):
                raise refuse(
                    f"libtpu_flags.{name}={value!r}: a flag name is lower-case letters, digits and _ without its "
                    "leading --, and its value one word (e.g. libtpu_flags.xla_tpu_scoped_vmem_limit_kib=98304)"
                )
        if not (len(self.data) > 0 and all(self.data)):
            raise refuse("data must name at least one manifest, no empty path")
        last = max(self.steps, self.decay_steps) + self.schedule.step_offset
        if last >= STEP_END:
            raise refuse(
                f"schedule.step_offset={self.schedule.step_offset} with steps={self.steps} and "
                f"decay_steps={self.decay_steps}: the schedule's step reaches {last}; must be < 2**31 "
                "(the step counter is int32)"
            )
        ds_rows = self.downstream.batch_size
        if ds_rows is not None and ds_rows > self.global_batch_size:
            raise refuse(
                f"downstream.batch_size={ds_rows} is more than global_batch_size {self.global_batch_size}: a "
                "downstream forward pass of more rows than a whole training batch is not one the run's memory "
                f"was sized for (its tokens [{ds_rows}, seq_len] alone); at most {self.global_batch_size}"
            )
        H = self.UNSAFE_double_sharding_experiment_hosts
        if H and self.global_batch_size % H:
            raise refuse(
                f"UNSAFE_double_sharding_experiment_hosts={H}: 0, or ≥ 2 simulated hosts dividing "
                f"global_batch_size {self.global_batch_size}"
            )
        return self

    @model_validator(mode="after")
    def _model_builds(self) -> TrainConfig:
        """``model`` + ``model_overrides`` make a ModelConfig: each override a ModelConfig field of
        that field's type (the model's own checks, ``model.config``), refused at load naming
        ``model_overrides.KEY`` (an unknown key with the nearest field)."""
        from model.config import ModelConfigError  # model imports JAX: not at config load (trainer.main's JAX settings)

        try:
            self.model_cfg()
        except ModelConfigError as e:
            if e.field in self.model_overrides:  # the user's key, as the YAML file or command line wrote it
                raise refuse(f"model_overrides.{e.reason} (model={self.model!r})") from None
            raise refuse(f"model={self.model!r} with model_overrides={self.model_overrides}: {e}") from None
        except (KeyError, TypeError, ValueError) as e:
            reason = e.args[0] if isinstance(e, KeyError) and e.args else e
            raise refuse(f"model={self.model!r} with model_overrides={self.model_overrides}: {reason}") from None
        return self

    @model_validator(mode="after")
    def _context_parallel_runs(self) -> TrainConfig:
        """What ``mesh.context`` > 1 cannot run, refused at load (``context_refusal``)."""
        reason = (
            context_refusal(self.mesh.context, self.seq_len, self.loss_chunk, self.model_cfg())
            if self.mesh.context > 1
            else None
        )
        if reason:
            raise refuse(reason)
        return self

    def model_cfg(self) -> ModelConfig:
        """The ModelConfig this config names (``model`` + ``model_overrides``), as configured: the
        one place it is made (``attention_impl: auto`` is resolved per platform by
        ``model.attention.resolved``: once, by a run's start-up, into ``trainer.startup.Checked``).
        Importing ``model`` imports JAX without starting its backend, so ``trainer.main``'s JAX
        settings still apply after a config is loaded."""
        return model_config(self)

    @property
    def decay_steps(self) -> int:
        return self.schedule.decay_steps if self.schedule.decay_steps is not None else self.steps

    def to_dict(self) -> dict[str, Any]:
        """Plain values, tuples kept (what checkpoints and run records store)."""
        return self.model_dump()


def check_state_precision(cfg: TrainConfig) -> None:
    """Refuse sub-fp32 Adam moments unless the config opts in (checked before JAX starts)."""
    o = cfg.optimizer
    low = [f"{n}={getattr(o, n)}" for n in ("mu_dtype", "nu_dtype") if getattr(o, n) not in FULL_PRECISION]
    if low and not cfg.allow_low_precision_optimizer_state:
        raise ConfigError(
            f"refusing low-precision optimizer state ({', '.join(low)}): bf16 Adam moments silently "
            "demote updates and inflate the loss. Set allow_low_precision_optimizer_state: true "
            "(override allow_low_precision_optimizer_state=true) if you really mean it."
        )


def model_config(cfg: TrainConfig) -> ModelConfig:
    """``cfg.model_cfg()``: the model config's one call site."""
    from model import get_config  # model imports JAX: not at this module's import (see ModelConfigError above)

    return get_config(cfg.model, **cfg.model_overrides)


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> TrainConfig:
    """TrainConfig from a YAML file (or the defaults when None) plus ``key=value`` overrides; a
    file's model_overrides replace its base's whole (a model is not merged field by field)."""
    return load(TrainConfig, path, overrides, whole=("model_overrides",))
