"""Trainer configuration: typed frozen dataclasses, loaded from YAML, with dotted overrides.

One place for defaults (the dataclass fields below). A YAML file may name a ``base`` file
(relative to itself) whose values it overrides; command-line ``key=value`` pairs override both.
Values are parsed as YAML scalars (``steps=20``, ``lr=1e-3``, ``data=[a.json,b.json]``).

    cfg = load_config("trainer/configs/tiny.yaml", ["steps=20", "optimizer.mu_dtype=bfloat16"])
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, Callable

import yaml

from contract.run import ORDERS

FLOAT_DTYPES = ("float32", "float64", "bfloat16", "float16")
FULL_PRECISION = ("float32", "float64")  # Adam moment dtypes accepted without the opt-in flag
SCHEDULES = ("cosine", "linear", "constant")
EVAL_INSTANCES = ("packed", "padded")  # dataloader.heldout.INSTANCES (written out: no Grain import here)
WANDB_MODES = ("online", "offline", "disabled")  # wandb.init's modes


# ----------------------------------------------------------------------------- value rules

def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(f"bad trainer config: {message}")


def _positive(v: Any) -> bool:
    return v > 0


def _non_negative(v: Any) -> bool:
    return v >= 0


def _unit_open(v: Any) -> bool:
    return 0 <= v < 1


# Seeds are 32-bit: the data order's (dataloader.order.SEED_MODULUS: index_shuffle and Grain take
# 32-bit seeds) and JAX's key(seed), which keeps only the low 32 bits without x64 (2**32 would
# silently be seed 0). Written out here so that the config imports no JAX or Grain; a test
# checks it equals SEED_MODULUS.
SEED_END = 2**32


def _seed(v: Any) -> bool:
    return 0 <= v < SEED_END


def _weights(v: dict[str, float]) -> bool:
    return all(w >= 0 for w in v.values()) and any(w > 0 for w in v.values())


# Every numeric field (dotted key) and the values it may take; None always means "unset".
# Non-finite numbers are refused everywhere, before these rules (tests check that every numeric
# field of the dataclasses below has a rule here).
RULES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "data_weights": ("weights >= 0, not all 0", _weights),
    "steps": ("> 0", _positive),
    "global_batch_size": ("> 0", _positive),
    "seq_len": ("> 0", _positive),
    "seed": ("in [0, 2**32) (a 32-bit seed)", _seed),
    "init_seed": ("in [0, 2**32) (a 32-bit seed)", _seed),
    "lr": (">= 0", _non_negative),
    "z_loss": (">= 0", _non_negative),
    "microbatches": (">= 1 (1 = the whole batch at once)", _positive),
    "loss_chunk": (">= 0 (0 = full-sequence logits)", _non_negative),
    "checkpoint_every": (">= 0 (0 = never)", _non_negative),
    "eval_every": (">= 0 (0 = never)", _non_negative),
    "eval_batches": ("> 0 (unset = each held-out set whole)", _positive),
    "verify_data_gib": (">= 0 (unset = hash every shard; 0 = check their structure only)", _non_negative),
    "optimizer.b1": ("in [0, 1)", _unit_open),
    "optimizer.b2": ("in [0, 1)", _unit_open),
    "optimizer.eps": ("> 0 (Adam divides by sqrt(nu) + eps; nu is 0 for unused embedding rows)", _positive),
    "optimizer.weight_decay": (">= 0", _non_negative),
    "optimizer.clip_norm": ("> 0", _positive),
    "schedule.warmup_steps": (">= 0", _non_negative),
    "schedule.final_lr_ratio": ("in [0, 1] (a fraction of the peak lr)", lambda v: 0 <= v <= 1),
    "schedule.decay_steps": ("> 0 (unset = steps)", _positive),
    "schedule.step_offset": (">= 0", _non_negative),
    "skip_step.sigma": ("> 0", _positive),
    "skip_step.window": ("> 1", lambda v: v > 1),
    "skip_step.min_history": ("> 1", lambda v: v > 1),
    "mesh.data": ("-1 (the rest) or >= 1", lambda v: v == -1 or v >= 1),
    "mesh.fsdp": ("-1 (the rest) or >= 1", lambda v: v == -1 or v >= 1),
    "mesh.tensor": ("-1 (the rest) or >= 1", lambda v: v == -1 or v >= 1),
    "mesh.cpu_devices": (">= 0 (0 = the platform's)", _non_negative),
    "checkpoint.keep": (">= 1 (unset = keep all; 0 would delete every checkpoint, the last one too)", _positive),
    "checkpoint.keep_period": (">= 1 (unset = none)", _positive),
    "log.peak_tflops_per_device": ("'auto' (the chip's published peak, trainer/peak.py) or >= 0 (0 = no MFU)",
                                   lambda v: v == "auto" if isinstance(v, str) else v >= 0),
    "log.progress_every": (">= 0 (0 = never)", _non_negative),
    "UNSAFE_double_sharding_experiment_hosts": ("0 (training), or >= 2 simulated hosts for the experiment",
                                                lambda v: v == 0 or v >= 2),
}


def non_finite(value: Any, key: str) -> tuple[str, float] | None:
    """(dotted key, value) of the first non-finite float in ``value`` (nested dicts/lists too)."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (key, value)
    if isinstance(value, dict):
        items = [(f"{key}.{k}", v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        items = [(f"{key}[{i}]", v) for i, v in enumerate(value)]
    else:
        return None
    return next((bad for bad in (non_finite(v, k) for k, v in items) if bad is not None), None)


def check_values(obj: Any, prefix: str = "") -> None:
    """Refuse non-finite numbers in any field of dataclass ``obj`` and values outside RULES.

    Nested dataclasses check themselves (their own ``__post_init__``); ``prefix`` is the section
    ("optimizer.") so every message names the dotted key a user writes.
    """
    for f in dataclasses.fields(obj):
        key, value = prefix + f.name, getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            continue
        bad = non_finite(value, key)
        if bad is not None:
            _check(False, f"{bad[0]}={bad[1]!r} is not a finite number")
        rule = RULES.get(key)
        if rule is not None and value is not None:
            _check(rule[1](value), f"{key}={value!r}; must be {rule[0]}")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW (optax) with global-norm clipping.

    mu_dtype / nu_dtype: dtypes of Adam's first / second moments. Anything below float32 is
    refused unless the top-level ``allow_low_precision_optimizer_state`` is true (bf16 moments
    inflate the loss).
    decay_exclude: top-level parameter subtrees excluded from weight decay.
    """

    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    clip_norm: float = 1.0
    mu_dtype: str = "float32"
    nu_dtype: str = "float32"
    decay_exclude: tuple[str, ...] = ("embed",)

    def __post_init__(self) -> None:
        check_values(self, "optimizer.")
        for name in ("mu_dtype", "nu_dtype"):
            value = getattr(self, name)
            _check(value in FLOAT_DTYPES, f"optimizer.{name}={value!r}; expected one of {FLOAT_DTYPES}")


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
    """Learning-rate schedule over the update count (peak = ``TrainConfig.lr``).

    kind: "cosine" (linear warmup, cosine to final_lr_ratio x peak), "linear" (linear warmup,
    then linear to final_lr_ratio x peak) or "constant" (warmup then flat).
    decay_steps: length of warmup + decay; None means ``TrainConfig.steps``.
    step_offset: update s (0-based) uses the schedule at s + step_offset. 0: the first update's
      rate is the warmup's start (0). OLMo-core's trainer counts its step before the update, so
      its update s uses its schedule at s + 1 (the AI2 recipe sets 1).
    """

    kind: str = "cosine"
    warmup_steps: int = 2000
    final_lr_ratio: float = 0.1
    decay_steps: int | None = None
    step_offset: int = 0

    def __post_init__(self) -> None:
        check_values(self, "schedule.")
        _check(self.kind in SCHEDULES, f"schedule.kind={self.kind!r}; expected one of {SCHEDULES}")


@dataclasses.dataclass(frozen=True)
class SkipStepConfig:
    """OLMo 3 skip step: drop an update whose loss or grad norm exceeds the running mean by
    ``sigma`` standard deviations over the last ``window`` steps (needs ``min_history`` steps)."""

    enabled: bool = False
    sigma: float = 6.0
    window: int = 128
    min_history: int = 20

    def __post_init__(self) -> None:
        check_values(self, "skip_step.")
        _check(self.min_history <= self.window,
               f"skip_step.min_history={self.min_history} must be <= skip_step.window={self.window}")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device mesh ("data", "fsdp", "tensor") over all devices of all processes; -1 = the rest.

    cpu_devices: if > 0, number of CPU devices per process (jax_num_cpu_devices; CPU runs only).
    """

    data: int = 1
    fsdp: int = -1
    tensor: int = 1
    cpu_devices: int = 0

    def __post_init__(self) -> None:
        check_values(self, "mesh.")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Orbax checkpoints under ``run_dir/checkpoints``.

    keep: newest checkpoints kept (None = all); keep_period: also keep every step that is a
    multiple of it. init_from: a checkpoint step directory whose ``params`` and ``opt_state``
    start a fresh run (stage 2 from stage 1); ignored once run_dir has its own checkpoint.
    allow_data_mismatch: resume although the checkpoint's data state (manifest fingerprint,
    seed, global batch) differs from this config's — the data stream then does not continue
    the checkpointed one. allow_optimizer_change: resume although the optimizer, skip-step,
    learning-rate schedule, loss or model settings (``trainer.resume.RESUME_KEYS``) differ from the checkpointed run's. Both are refused, naming
    every difference, unless set (``checkpoint.allow_...=true`` on the command line).
    trust_unverified: resume a step that has no checksums although this code did not leave it
    pending (written by an olmax from before checksums were recorded): its checksums are
    recorded at resume instead of at save.
    """

    keep: int | None = 3
    keep_period: int | None = None
    async_save: bool = True
    init_from: str | None = None
    allow_data_mismatch: bool = False
    allow_optimizer_change: bool = False
    trust_unverified: bool = False

    def __post_init__(self) -> None:
        check_values(self, "checkpoint.")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """What the held-out evaluation reads (when: ``eval_every``; how much: ``eval_batches``).
    instances: "packed" (a set's held-out records, as trained) or "padded" (OLMo-core's LM-eval
    instances: one document each, cut to seq_len, PAD-filled; ``dataloader.heldout``).
    sets: held-out sources evaluated, each on its own (None = all); see ``trainer.evaluate``."""

    instances: str = "packed"
    sets: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        check_values(self, "eval.")
        _check(self.instances in EVAL_INSTANCES, f"eval.instances={self.instances!r}; expected one of {EVAL_INSTANCES}")
        if self.sets is not None:
            _check(len(self.sets) > 0 and all(self.sets), "eval.sets must name at least one source (or be unset: all)")
            _check(len(set(self.sets)) == len(self.sets), f"eval.sets={list(self.sets)} names a set twice")


@dataclasses.dataclass(frozen=True)
class WandbConfig:
    """Weights & Biases (extra ``olmax[wandb]``; ``trainer.trackers``). name: None = the run dir's
    name; mode: "online", "offline" (under ``run_dir/wandb``, no network; ``wandb sync`` later), "disabled"."""

    project: str = "olmax"
    name: str | None = None
    entity: str | None = None
    mode: str = "online"

    def __post_init__(self) -> None:
        _check(bool(self.project), "log.wandb.project must not be empty")
        _check(self.mode in WANDB_MODES, f"log.wandb.mode={self.mode!r}; expected one of {WANDB_MODES}")


@dataclasses.dataclass(frozen=True)
class LogConfig:
    """peak_tflops_per_device: denominator of ``mfu``, the dense bf16 peak of one device in
    TFLOP/s: "auto" looks the device kind up in trainer/peak.py's table of published peaks (an
    unknown kind, e.g. a CPU, logs MFU as absent and why); a number overrides it; 0 = no MFU.
    progress_every: console progress line every N steps (0 = never).
    tensorboard: TensorBoard event files under ``run_dir/tensorboard`` (every scalar of metrics.jsonl).
    wandb: Weights & Biases settings (None = off)."""

    peak_tflops_per_device: float | str = "auto"
    progress_every: int = 1
    tensorboard: bool = False
    wandb: WandbConfig | None = None

    def __post_init__(self) -> None:
        check_values(self, "log.")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs. ``steps`` counts optimizer updates.

    data: manifest paths (``DIR/manifest.json``) of the tokenize job; data_weights:
    {source name: weight} overriding the manifests' mixture weights (None = as tokenized). seed: data-order seed; init_seed:
    parameter-init RNG seed. seq_len: if set, must equal the manifests' seq_len.
    data_order: "grain" (weighted plan, Grain index_shuffle) or "olmo-core" (AI2's OLMo-core batch
    order over every instance in listed order; data_weights do not apply; dataloader.olmo_order).
    eval_every: held-out evaluation period (0 = never), and after the last step; eval_batches: cap
    on the batches of each held-out set per evaluation (None = all of it; the same examples every
    time); eval: which sets, and how their instances are built (EvalConfig).
    verify_data_gib: at start-up each process hashes its share of the shards the run reads and
    compares them with the manifests' sha256 (trainer.preflight), at most this many GiB per
    process (None = every shard; 0 = none); shards past it are only structure-checked, as the
    start-up log lists.
    deterministic: ask XLA for deterministic GPU kernels (``--xla_gpu_deterministic_ops``;
    the embedding gradient is a scatter-add, atomic and run-to-run different on GPU without
    it), which bit-exact resume needs; costs some GPU speed, no effect on CPU/TPU.
    UNSAFE_double_sharding_experiment_hosts: 0 (always, for training). H ≥ 2 replays the case
    study's double-sharding bug on H simulated hosts in one process (`dataloader.double_sharding`)
    and overrides the start-up guard that refuses it — only for the ``make lessons`` experiment,
    which measures the bug; the audit fails such a run.
    document_masking: attention stays within each packed document (the loader's
    ``segment_ids``) and RoPE positions restart at each document (its ``positions``);
    False attends across the whole packed example with positions 0..T-1.
    microbatches: gradient accumulation. Each step sums the token-weighted losses and gradients of
    N microbatches of the global batch inside the jitted step (``trainer.step``); the global
    batch, data stream, data log and audit are unchanged, and so is the update up to float
    rounding, so a resume may change it (not a ``RESUME_KEYS`` setting). Each batch shard's rows
    (global_batch_size / (data x fsdp devices)) must divide by N.
    loss_chunk: the cross-entropy and z-loss are computed ``loss_chunk`` positions at a time, with
    the LM head inside the chunk loop and each chunk rematerialised in the backward pass, so the
    float32 ``[G, T, V]`` logits never exist at once (``trainer.loss.chunked_loss_sums``; same
    value and gradient up to rounding, not a resume setting). 0: the full logits (``model.forward``).
    """

    data: tuple[str, ...] = ("out/sample/manifest.json",)
    data_weights: dict[str, float] | None = None
    model: str = "olmo3-tiny"
    model_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    steps: int = 100
    global_batch_size: int = 8
    seq_len: int | None = None
    seed: int = 0
    data_order: str = "grain"
    init_seed: int = 0
    lr: float = 3e-4
    z_loss: float = 1e-5
    checkpoint_every: int = 50
    eval_every: int = 25
    eval_batches: int | None = None
    verify_data_gib: float | None = None
    allow_low_precision_optimizer_state: bool = False
    UNSAFE_double_sharding_experiment_hosts: int = 0
    deterministic: bool = True
    document_masking: bool = True
    microbatches: int = 1
    loss_chunk: int = 1024
    optimizer: OptimizerConfig = OptimizerConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    skip_step: SkipStepConfig = SkipStepConfig()
    mesh: MeshConfig = MeshConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    eval: EvalConfig = EvalConfig()
    log: LogConfig = LogConfig()

    def __post_init__(self) -> None:
        """Values that cannot be right are refused here, naming the key (sections check
        themselves the same way: ``check_values`` with RULES)."""
        check_values(self)
        _check(len(self.data) > 0 and all(self.data), "data must name at least one manifest, no empty path")
        _check(self.data_order in ORDERS, f"data_order={self.data_order!r}; expected one of {sorted(ORDERS)}")
        H = self.UNSAFE_double_sharding_experiment_hosts
        _check(H == 0 or (H >= 2 and self.global_batch_size % H == 0),
               f"UNSAFE_double_sharding_experiment_hosts={H}: 0, or ≥ 2 simulated hosts dividing "
               f"global_batch_size {self.global_batch_size}")

    @property
    def decay_steps(self) -> int:
        return self.schedule.decay_steps if self.schedule.decay_steps is not None else self.steps

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def check_state_precision(cfg: TrainConfig) -> None:
    """Refuse sub-fp32 Adam moments unless the config opts in (checked before JAX starts)."""
    o = cfg.optimizer
    low = [f"{n}={getattr(o, n)}" for n in ("mu_dtype", "nu_dtype") if getattr(o, n) not in FULL_PRECISION]
    if low and not cfg.allow_low_precision_optimizer_state:
        raise ValueError(
            f"refusing low-precision optimizer state ({', '.join(low)}): bf16 Adam moments silently "
            "demote updates and inflate the loss. Set allow_low_precision_optimizer_state: true "
            "(override allow_low_precision_optimizer_state=true) if you really mean it.")


# ----------------------------------------------------------------------------- loading

def load_config(path: str | Path | None = None, overrides: typing.Sequence[str] = ()) -> TrainConfig:
    """TrainConfig from a YAML file (or the defaults when None) plus ``key=value`` overrides."""
    raw = _load_yaml(Path(path)) if path is not None else {}
    for item in overrides:
        key, value = parse_override(item)
        set_dotted(raw, key, value)
    return from_dict(TrainConfig, raw)


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key repeated in one mapping (PyYAML keeps the last one
    silently and offers no option to refuse it, hence this small subclass)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:  # unhashable key: SafeLoader's own error says so
                continue
            line = key_node.start_mark.line + 1
            if key in first:
                raise ValueError(f"{key_node.start_mark.name}:{line}: duplicate key {key!r} (first at line "
                                 f"{first[key]}); a key may appear once per mapping (no silent last-wins)")
            first[key] = line
        return super().construct_mapping(node, deep=deep)


def _load_yaml(path: Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    path = path.resolve()
    if path in _seen:
        raise ValueError(f"config base cycle: {' -> '.join(map(str, _seen + (path,)))}")
    with open(path) as f:
        try:
            raw = yaml.load(f, Loader=_UniqueKeyLoader) or {}
        except yaml.YAMLError as e:
            raise ValueError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a trainer config must be a YAML mapping")
    base = raw.pop("base", None)
    if base is None:
        return raw
    merged = _load_yaml(path.parent / base, _seen + (path,))
    _deep_merge(merged, raw)
    return merged


def _deep_merge(into: dict[str, Any], other: dict[str, Any]) -> None:
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict) and key != "model_overrides":
            _deep_merge(into[key], value)
        else:
            into[key] = value


def parse_override(item: str) -> tuple[str, Any]:
    """``"optimizer.mu_dtype=bfloat16"`` → ``("optimizer.mu_dtype", "bfloat16")`` (YAML-parsed value)."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"override {item!r} is not of the form key=value")
    if not text.strip():
        return key.strip(), None
    try:  # the YAML files' loader: a key repeated in an inline mapping is refused, not last-wins
        return key.strip(), yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        raise ValueError(f"override {item!r}: not valid YAML: {e}") from None
    except ValueError as e:  # _UniqueKeyLoader's duplicate key, named by its place in the override
        raise ValueError(f"override {item!r}: {str(e).removeprefix('<unicode string>:1: ')}") from None


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"override {key!r}: {part!r} is not a section")
    node[parts[-1]] = value


def from_dict(cls: type, raw: dict[str, Any], where: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, checking keys and coercing values to field types."""
    if not isinstance(raw, dict):
        raise ValueError(f"bad trainer config: {where or 'config'} must be a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - fields)
    if unknown:
        raise ValueError(f"bad trainer config: unknown key(s) {[where + k for k in unknown]}; "
                         f"valid keys of {where or 'the top level'}: {sorted(fields)}")
    values = {name: _coerce(hints[name], value, f"{where}{name}") for name, value in raw.items()}
    return cls(**values)


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(option, value, key)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError("; ".join(errors))
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key + ".")
    if origin is tuple:
        (item_tp, _ellipsis) = typing.get_args(tp)
        items = value if isinstance(value, (list, tuple)) else [value]
        return tuple(_coerce(item_tp, v, key) for v in items)
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ValueError(f"bad trainer config: {key} must be a mapping, got {value!r}")
        args = typing.get_args(tp)
        if not args:
            return dict(value)
        return {_coerce(args[0], k, key): _coerce(args[1], v, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "3e-4" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is Any:
        return value
    raise ValueError(f"bad trainer config: {key}={value!r} is not a {getattr(tp, '__name__', tp)}")
