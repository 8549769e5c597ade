"""`python -m bench.olmo_reference --config RECIPE --out REF.jsonl [key=value ...]` — the curve
OLMo-core 3.0.0 itself trains for a small olmax recipe, on the CPU, as a metrics table that
`python -m compare RUN REF.jsonl` reads unchanged (OLMo-core's metric names).

What runs is OLMo-core's own code (the test extra: torch CPU + ai2-olmo-core; never imported by
the package), configured from the olmax recipe as OLMo 3's scripts configure it
(`src/scripts/official/OLMo3/OLMo-3-1025-7B-pretrain-1.py`):

  model       `TransformerConfig.llama_like(...)` with OLMo 3's block (reordered norm, QK-norm over the
              whole projection, RoPE theta, SwiGLU, no biases, untied embeddings) and its
              `SlidingWindowAttentionConfig` (the recipe's layer types; the last layer full), on the
              `torch` attention backend (SDPA with a window mask: the only one on a CPU)
  weights     the olmax run's own initial parameters (`model.init` with the key `trainer.loop`
              draws from `init_seed`), or `checkpoint.init_from`'s params *and Adam state*, through
              the product's name/shape mapping (`trainer.convert.olmo_core_names`: model.hf's
              layout rules under OLMo-core's names; tests hold it equal to OLMo-core's HF reader)
  data        the recipe's token files (its manifest's mixture paths, listed order) through
              `NumpyFSLDatasetConfig` + `NumpyDataLoaderConfig(seed)`: AI2's batch order, which
              olmax's `data_order: olmo-core` reads
  step        `TransformerTrainModule` (its loss: `cross_entropy_loss` with z-loss, token-weighted
              over the batch; its microbatches: `rank_microbatch_size`; its clipping) with
              `SkipStepAdamWConfig` (betas, eps, weight decay, no decay on `embeddings.weight`,
              rolling window and sigma from `skip_step`) and the recipe's scheduler
              (`CosWithWarmup`, `LinearWithWarmup`, `ConstantWithWarmup`), driven by OLMo-core's
              own `Trainer.fit()` in this one process (no torch.distributed: the train module and
              the trainer both run undistributed on a CPU)
  held-out    every `eval.every` steps and after the last: each held-out source of the manifest
              (`split: heldout`, token files), its instances in file order (`NumpyFSLDataset`, as
              olmax's `eval.instances: packed` reads them), global_batch_size instances at a time,
              through `TransformerTrainModule.eval_batch`
              (OLMo-core's per-token cross-entropy), token-weighted: `eval/lm/<set>/CE loss`

Rows (JSON lines): `_step` (updates done), `train/CE loss`, `train/Z loss`, `optim/total grad norm`,
`optim/LR (group 0)`, `optim/step skipped`, `throughput/total tokens`, and at evaluations
`eval/lm/<set>/CE loss` — OLMo-core's own metric names, as its trainer records them. With
`--state OUT.npz` the final parameters, in olmax's layout, are saved too (the tests compare them).

The olmax recipe must be one OLMo-core can run on a CPU: `data_order: olmo-core`, float32 compute,
`document_masking: false` (OLMo-core's intra-document masking needs flash attention), a vocabulary
unpadded or padded as AI2 pads it (`vocab_padding: unmasked`: OLMo-core's model has
`padded_vocab_size` rows, every one in its softmax and z-loss; the weights travel with all rows),
`mesh` of one device. Anything else is refused with one line (exit 2).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from contract import Manifest
from contract.errors import Refused

log = logging.getLogger(__name__)

# olmax metric -> OLMo-core's name for it (what its trainer records; compare.table reads these)
CE, Z, GRAD_NORM, LR, SKIPPED, TOKENS = (
    "train/CE loss",
    "train/Z loss",
    "optim/total grad norm",
    "optim/LR (group 0)",
    "optim/step skipped",
    "throughput/total tokens",
)
HELDOUT = "eval/lm/{label}/CE loss"
STEP = "_step"
# not OLMo-core's: the same pre-clip gradients' norm summed in float64 (`metrics_callback`); OLMo-core's
# own (GRAD_NORM, torch's float32 `get_total_norm`) is low by up to ~2e-4 relative on the CPU at a
# 100k-row LM head (bench.olmo_scale)
GRAD_NORM_F64 = "bench/total grad norm (float64)"


class RecipeRefused(Refused, ValueError):
    """A recipe OLMo-core cannot run here (one line)."""


def check_recipe(cfg) -> None:
    """Refuse what the CPU reference cannot reproduce (see the module doc)."""
    mc = cfg.model_cfg()
    problems = []
    if cfg.data_order != "olmo-core":
        problems.append(f"data_order={cfg.data_order!r} (needs olmo-core: AI2's batch order)")
    if mc.compute_dtype != "float32" or mc.param_dtype != "float32":
        problems.append("model compute/param dtype must be float32")
    if cfg.document_masking:
        problems.append("document_masking must be false (OLMo-core masks documents only with flash attention)")
    if mc.scored_vocab_size != mc.padded_vocab_size:
        problems.append("vocab_padding must be unmasked with vocab_pad_multiple (OLMo-core scores every row)")
    if cfg.UNSAFE_double_sharding_experiment_hosts:
        problems.append("UNSAFE_double_sharding_experiment_hosts must be 0")
    if problems:
        raise RecipeRefused("the recipe cannot be run by OLMo-core on a CPU: " + "; ".join(problems))


# ---------------------------------------------------------------------------------------- model


def model_config(mc):
    """OLMo-core's TransformerConfig of an olmax ModelConfig (OLMo 3's structure)."""
    # optional: the test extra (OLMo-core)
    from olmo_core.nn.attention import AttentionBackendName, SlidingWindowAttentionConfig
    from olmo_core.nn.feed_forward import FeedForwardConfig
    from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig

    last_full = mc.layers[-1] == "full_attention"
    pattern = [mc.sliding_window if t == "sliding_attention" else -1 for t in mc.layers]
    return TransformerConfig.llama_like(
        d_model=mc.d_model,
        vocab_size=mc.padded_vocab_size,  # AI2's padded_vocab_size() rows (== vocab_size unpadded)
        n_layers=mc.n_layers,
        n_heads=mc.n_heads,
        n_kv_heads=mc.n_kv_heads,
        head_dim=mc.head_dim,
        qk_norm=True,
        layer_norm_eps=mc.rms_norm_eps,
        rope_theta=int(mc.rope_theta),
        block_name=TransformerBlockType.reordered_norm,
        feed_forward=FeedForwardConfig(hidden_size=mc.mlp_hidden, bias=False),
        sliding_window=SlidingWindowAttentionConfig(
            pattern=pattern, force_full_attention_on_first_layer=False, force_full_attention_on_last_layer=last_full
        ),
        attn_backend=AttentionBackendName.torch,
    )


def to_olmo_state(mc, params) -> dict:
    """olmax params (any array tree) -> OLMo-core model state dict (torch float32), by the product's
    one name/shape mapping (`trainer.convert.olmo_core_names`, model.hf's layout rules)."""
    import torch  # optional: the test extra (torch)

    from trainer.convert import olmo_core_names  # JAX after main's JAX_PLATFORMS=cpu

    return {k: torch.from_numpy(np.array(v, np.float32)) for k, v in olmo_core_names.iter_to_olmo(mc, params)}


def from_olmo_state(mc, state: dict) -> dict:
    """OLMo-core model state dict -> olmax params (numpy), by the same mapping."""
    from trainer.convert import olmo_core_names  # JAX after main's JAX_PLATFORMS=cpu

    return olmo_core_names.from_olmo_state(mc, state, lambda t: t.detach().float().numpy())


def initial_params(cfg) -> dict:
    """The olmax run's initial params (numpy): `model.init` with trainer.loop's init key."""
    import jax  # JAX after main's JAX_PLATFORMS=cpu

    import model  # JAX after main's JAX_PLATFORMS=cpu
    from trainer.loop import init_key

    return jax.tree.map(np.asarray, model.init(cfg.model_cfg(), init_key(cfg)))


# ------------------------------------------------------------------------------------ optimizer


def optim_config(cfg):
    from olmo_core.optim import OptimGroupOverride, SkipStepAdamWConfig  # optional: the test extra (OLMo-core)

    o, s = cfg.optimizer, cfg.skip_step
    if tuple(o.decay_exclude) != ("embed",):
        raise RecipeRefused(f"optimizer.decay_exclude={list(o.decay_exclude)}: OLMo 3 excludes the embeddings only")
    if s.enabled and not float(s.sigma).is_integer():
        raise RecipeRefused(f"skip_step.sigma={s.sigma}: OLMo-core's sigma_factor is an integer")
    if s.history_needed != max(2, s.window // 2) - 1:
        raise RecipeRefused(
            f"skip_step.min_history={s.min_history}: OLMo-core's skip step waits for max(2, window // 2) - 1 "
            "earlier steps (leave min_history unset)"
        )
    return SkipStepAdamWConfig(
        lr=cfg.lr,
        betas=(o.b1, o.b2),
        eps=o.eps,
        weight_decay=o.weight_decay,
        group_overrides=[OptimGroupOverride(params=["embeddings.weight"], opts={"weight_decay": 0.0})],
        rolling_interval_length=s.window,
        # skip_step.enabled=false: a sigma no loss reaches (OLMo 3 always skips; olmax may not)
        sigma_factor=int(s.sigma) if s.enabled else 10**9,
    )


def scheduler(cfg):
    """OLMo-core's scheduler of the recipe; it is evaluated at the trainer's global_step, which is 1
    at the first update: olmax's `schedule.step_offset: 1` is that (checked)."""
    # optional: the test extra (OLMo-core)
    from olmo_core.optim import ConstantWithWarmup, CosWithWarmup, LinearWithWarmup

    s = cfg.schedule
    if s.step_offset != 1:
        raise RecipeRefused(
            f"schedule.step_offset={s.step_offset}: OLMo-core's scheduler reads the step after the "
            "update (global_step is 1 at the first), which is olmax's schedule.step_offset=1"
        )
    t_max = cfg.decay_steps
    if s.kind == "cosine":
        return CosWithWarmup(warmup=s.warmup_steps, alpha_f=s.final_lr_ratio, t_max=t_max)
    if s.kind == "linear":
        return LinearWithWarmup(warmup=s.warmup_steps, alpha_f=s.final_lr_ratio, t_max=t_max)
    return ConstantWithWarmup(warmup=s.warmup_steps)


# ----------------------------------------------------------------------------------------- data


def token_files(manifest) -> tuple[list[str], dict[str, list[str]]]:
    """(train token files in OLMo-core's listed order, {held-out source: its token files})."""
    train, heldout = [], {}
    for src in manifest["mixture"]["sources"]:
        if src.get("format") != "tokens":
            raise RecipeRefused(f"source {src['name']!r} is not token files: OLMo-core's loader reads token files")
        if src.get("split") == "heldout":
            heldout[src["name"]] = list(src["paths"])
        else:
            train += list(src["paths"])
    return train, heldout


def tokenizer(manifest):
    from olmo_core.data import TokenizerConfig  # optional: the test extra (OLMo-core)

    t = manifest["tokenizer"]
    return TokenizerConfig(
        vocab_size=int(t["vocab_size"]), eos_token_id=int(t["eos_id"]), pad_token_id=int(t["pad_id"])
    )


def fsl_dataset(paths, manifest, seq_len: int, work_dir: str):
    from olmo_core.data import NumpyDatasetDType, NumpyFSLDatasetConfig  # optional: the test extra (OLMo-core)

    return NumpyFSLDatasetConfig(
        tokenizer=tokenizer(manifest),
        paths=list(paths),
        sequence_length=seq_len,
        max_target_sequence_length=seq_len,
        dtype=NumpyDatasetDType.uint32,
        work_dir=work_dir,
    ).build()


# ------------------------------------------------------------------------------------ callbacks


def metrics_callback(out: str, heldout_sets: dict, eval_every: int, steps: int, rows_per_batch: int):
    """A Callback that writes one row per step (the trainer's own recorded metrics) and evaluates
    the held-out sets, `rows_per_batch` instances at a time (built here: OLMo-core's Callback class
    is only importable with torch)."""
    import torch  # optional: the test extra (torch)
    from olmo_core.train.callbacks import Callback
    from olmo_core.train.train_module import TransformerTrainModule

    class Writer(Callback):
        def __init__(self):
            self.rows: dict[int, dict] = {}

        def pre_optim_step(self):
            # the accumulated, not yet clipped gradients (the train module clips in optim_step)
            tm = self.trainer.train_module
            assert isinstance(tm, TransformerTrainModule)
            grads = [p.grad for p in tm.model.parameters() if p.grad is not None]
            norm = math.sqrt(sum(float(g.double().square().sum()) for g in grads))
            self.rows.setdefault(self.trainer.global_step, {})[GRAD_NORM_F64] = norm

        def post_step(self):
            step = self.trainer.global_step
            if heldout_sets and (step % eval_every == 0 or step == steps):
                self.rows.setdefault(step, {}).update(self.evaluate())

        def evaluate(self) -> dict:
            tm = self.trainer.train_module
            assert isinstance(tm, TransformerTrainModule)
            out_row = {}
            for label, ds in heldout_sets.items():
                ce, n = 0.0, 0
                for start in range(0, len(ds), rows_per_batch):
                    rows = [ds[i]["input_ids"] for i in range(start, min(start + rows_per_batch, len(ds)))]
                    ids = torch.stack([torch.as_tensor(r, dtype=torch.long) for r in rows])
                    labels = torch.nn.functional.pad(ids[:, 1:], (0, 1), value=tm.label_ignore_index)
                    res = tm.eval_batch({"input_ids": ids}, labels=labels)
                    assert not isinstance(res, torch.Tensor) and res.ce_loss is not None  # labels given: losses
                    ce += float(res.ce_loss.double().sum())  # per-token CE, 0 where ignored
                    n += int((labels != tm.label_ignore_index).sum())
                out_row[HELDOUT.format(label=label)] = ce / n
            tm._set_model_mode("train")
            return out_row

        def log_metrics(self, step: int, metrics: dict[str, float]):
            row = self.rows.setdefault(step, {})
            for key in (CE, Z, GRAD_NORM, LR, SKIPPED):
                if key in metrics:
                    row[key] = float(metrics[key])
            row[TOKENS] = float(self.trainer.global_train_tokens_seen)

        def post_train(self):
            with open(out + ".tmp", "w") as f:
                for step in sorted(self.rows):
                    if CE not in self.rows[step] and not any(k.startswith("eval/") for k in self.rows[step]):
                        continue  # the trainer's step-0 bookkeeping row: no update, nothing to compare
                    f.write(json.dumps({STEP: step, **self.rows[step]}) + "\n")
            os.replace(out + ".tmp", out)

    return Writer()


# ------------------------------------------------------------------------------------------- run


def olmo_optim_state(mc, params_state: dict, opt_state) -> dict:
    """olmax's Adam state (optax ScaleByAdamState inside the chain / skip step) -> what
    SkipStepAdamW keeps per parameter: {fqn: {"step", "exp_avg", "exp_avg_sq"}}."""
    import optax  # JAX after main's JAX_PLATFORMS=cpu
    import torch  # optional: the test extra (torch)

    from trainer.optim import SkipStepState  # JAX after main's JAX_PLATFORMS=cpu

    inner = opt_state.inner_state if isinstance(opt_state, SkipStepState) else opt_state
    adam = next(s for s in inner if isinstance(s, optax.ScaleByAdamState))
    mu, nu = to_olmo_state(mc, adam.mu), to_olmo_state(mc, adam.nu)
    count = torch.tensor(float(np.asarray(adam.count)), dtype=torch.float32)
    return {k: {"step": count.clone(), "exp_avg": mu[k], "exp_avg_sq": nu[k]} for k in params_state}


def optim_state_dict(train_module, per_param: dict) -> dict:
    """The train module's flattened optimizer state dict with every parameter's state replaced."""
    sd = train_module.state_dict()["optim"]
    flat = {f"state.{k}.{n}": v for k, d in per_param.items() for n, v in d.items()}
    unmapped = sorted(k for k in sd if k.startswith("state.") and k not in flat)
    if unmapped:
        raise RecipeRefused(f"optimizer state entries with no olmax counterpart: {unmapped[:3]}")
    return {**sd, **flat}


def run(
    cfg, out: str, work_dir: str, state_out: str | None = None, save_to: str | None = None, start: str | None = None
) -> None:
    """Train the recipe with OLMo-core; write the table to `out` (and the final params to `state_out`).
    `save_to`: after the last update OLMo-core's own checkpointer saves the step there
    (`save_to/step<N>/`: `model_and_optim/` DCP + `train/rank0.pt`); `start`: an OLMo-core step
    directory the run starts from as AI2's next stage does (`load_optim_state=True,
    load_trainer_state=False`: its weights and SkipStepAdamW state, the step count from 0).

    On one torch thread (the caller's count restored after): a model this small (128 tokens a step,
    d 64) gains nothing from intra-op threads and loses to them when another process shares the
    cores — the tests' olmax runs train beside it (measured: 40 updates of the lessons' recipe took
    5.9 s on one thread against 29 s on two, load ~9 on 2 cores, bench/RESULTS.md). The tables are
    the same to the last digit either way (measured on every scenario)."""
    import torch  # optional: the test extra (torch)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _run(cfg, out, work_dir, state_out, save_to, start)
    finally:
        torch.set_num_threads(threads)


def _run(cfg, out: str, work_dir: str, state_out: str | None, save_to: str | None, start: str | None) -> None:
    import torch  # optional: the test extra (torch)

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    from olmo_core.train.train_module import TransformerTrainModule  # optional: the test extra (OLMo-core)

    check_recipe(cfg)
    if len(cfg.data) != 1:
        raise RecipeRefused("the reference reads one manifest (`data` with one entry)")
    manifest = Manifest.load(str(cfg.data[0]))
    mc = cfg.model_cfg()
    L, G = manifest.seq_len, cfg.global_batch_size
    train_files, heldout_files = token_files(manifest)

    if G % cfg.microbatches:
        raise RecipeRefused(f"microbatches={cfg.microbatches} does not divide global_batch_size={G}")
    olmo_model = model_config(mc).build(init_device="cpu")
    train_module = TransformerTrainModule(
        olmo_model,
        optim_config(cfg),
        rank_microbatch_size=(G // cfg.microbatches) * L,
        max_sequence_length=L,
        z_loss_multiplier=cfg.z_loss or None,
        max_grad_norm=cfg.optimizer.clip_norm,
        scheduler=scheduler(cfg),
        device=torch.device("cpu"),
    )
    # The weights go in through OLMo-core's own loading path (what its Trainer does with a
    # checkpoint), after the train module is built: building it initialises the model afresh
    # (parallelize_model -> init_weights), which would overwrite weights loaded before.
    init_opt = None
    if cfg.checkpoint.init_from:
        params, init_opt = restore_olmax(cfg)
    else:
        params = initial_params(cfg)
    state = to_olmo_state(mc, params)
    sd: dict[str, Any] = {"model": state}
    if init_opt is not None:  # as OLMo-3-1025-7B-midtrain.py: load_optim_state=True, load_trainer_state=False
        sd["optim"] = optim_state_dict(train_module, olmo_optim_state(mc, state, init_opt))
    train_module.load_state_dict(sd)

    loader, writer = loader_and_writer(cfg, manifest, (train_files, heldout_files), L, out, work_dir)
    trainer = trainer_config(cfg, work_dir, writer, save_folder=save_to).build(train_module, loader)
    if start:  # AI2's next stage: its checkpoint's model and optimizer state, no trainer state
        trainer.load_checkpoint(start, load_trainer_state=False, load_optim_state=True)
    trainer.fit()
    if save_to:  # OLMo-core's own checkpointer: save_to/step<N>/{model_and_optim,train}
        trainer.save_checkpoint()
    if state_out:
        save_params(from_olmo_state(mc, olmo_model.state_dict()), state_out)


def save_params(params, path: str) -> None:
    """olmax-layout params (a pytree of arrays) flat by path to `path`, written whole or not at all."""
    flat = flat_params(params)
    tmp = path + ".tmp.npz"  # np.savez names the file; then one rename
    np.savez(tmp, **cast(dict[str, Any], flat))
    os.replace(tmp, path)


def loader_and_writer(
    cfg,
    manifest,
    files: tuple[list[str], dict[str, list[str]]],
    seq_len: int,
    out: str,
    work_dir: str,
    dp_process_group=None,
):
    """(OLMo-core's data loader of the training token files (`files`: `token_files(manifest)`), in
    the recipe's batches and seed; the callback that writes the table to `out`, evaluating the
    held-out sets every `eval.every` updates). `dp_process_group`: the loader's, when one exists."""
    from olmo_core.data import NumpyDataLoaderConfig  # optional: the test extra (OLMo-core)

    (train_files, heldout_files), L, G = files, seq_len, cfg.global_batch_size
    ds = fsl_dataset(train_files, manifest, L, os.path.join(work_dir, "train"))
    loader = NumpyDataLoaderConfig(global_batch_size=G * L, seed=cfg.seed, num_workers=0, work_dir=work_dir).build(
        ds, dp_process_group=dp_process_group
    )
    heldout_sets = {
        label: fsl_dataset(paths, manifest, L, os.path.join(work_dir, "heldout", label))
        for label, paths in heldout_files.items()
    }
    for d in heldout_sets.values():
        d.prepare()
    return loader, metrics_callback(out, heldout_sets if cfg.eval.every else {}, cfg.eval.every, cfg.steps, G)


def trainer_config(cfg, work_dir: str, writer, save_folder: str | None = None, async_bookkeeping: bool | None = None):
    """OLMo-core's TrainerConfig of a reference run: `cfg.steps` updates, metrics collected every
    step, no checkpoints or evaluations of its own (`writer`, the table's callback, evaluates), on
    the CPU. `save_folder`: where `save_checkpoint` writes (default: under `work_dir`);
    `async_bookkeeping`: OLMo-core's (None, its default: a background thread where a process group
    exists; False: the metrics reduced in the step)."""
    from olmo_core.train import Duration, TrainerConfig  # optional: the test extra (OLMo-core)

    return TrainerConfig(
        save_folder=save_folder or os.path.join(work_dir, "save"),
        work_dir=work_dir,
        max_duration=Duration.steps(cfg.steps),
        metrics_collect_interval=1,
        cancel_check_interval=10**9,
        no_checkpoints=True,
        no_evals=True,
        callbacks={"olmax_reference": writer},
        device="cpu",
        async_bookkeeping=async_bookkeeping,
    )


def flat_params(tree) -> dict[str, np.ndarray]:
    """{"a/b/c": array}: a params pytree flat by olmax's paths (the layout of the final-state .npz files)."""
    return {"/".join(str(getattr(k, "key", k)) for k in p): np.asarray(v) for p, v in leaves(tree)}


def leaves(tree):
    import jax  # JAX after main's JAX_PLATFORMS=cpu

    return jax.tree_util.tree_flatten_with_path(tree)[0]


def restore_step(cfg, step_dir: str) -> tuple[Any, Any]:
    """(params, optimizer state) of an olmax checkpoint step directory (numpy leaves), restored
    through olmax's own checkpoint reader for the recipe's shapes."""
    import jax  # JAX after main's JAX_PLATFORMS=cpu

    from trainer.build import build  # JAX after main's JAX_PLATFORMS=cpu
    from trainer.checkpointing.files import restore_items

    abstract_params, abstract_opt = build(cfg).abstract_state()
    r = restore_items(Path(step_dir), abstract_params, abstract_opt, ("params", "opt_state"))
    return jax.tree.map(np.asarray, r["params"]), jax.tree.map(np.asarray, r["opt_state"])


def restore_olmax(cfg) -> tuple[Any, Any]:
    """`checkpoint.init_from`'s params and optimizer state (refused first as olmax refuses it)."""
    check_init_from(cfg)
    return restore_step(cfg, str(cfg.checkpoint.init_from))


def check_init_from(cfg) -> None:
    """Refuse `checkpoint.init_from` (one line) as olmax's trainer does, before OLMo-core builds
    anything: its run's settings must be this config's but for the learning rate, the schedule and
    what `checkpoint.init_from_allow_changes` names (`trainer.checkpointing.resume.init_from_changes`,
    the rule `trainer.loop` applies), then its arrays must have the shapes this config makes
    (`trainer.checkpointing.files.array_differences`: `rules.shape_differences`), e.g. a changed
    `skip_step.window` (the skip step's history buffers), which orbax would refuse mid-restore."""
    if not cfg.checkpoint.init_from:
        return
    from trainer.build import build  # JAX after main's JAX_PLATFORMS=cpu
    from trainer.checkpointing.files import array_differences, restore_json
    from trainer.checkpointing.resume import init_from_changes

    step_dir = Path(cfg.checkpoint.init_from)
    where = f"checkpoint.init_from={step_dir}"
    try:
        meta = restore_json(step_dir, "meta")
    except Exception as e:  # orbax raises many kinds for a missing or damaged item
        raise RecipeRefused(f"{where}: no readable meta item (a step directory of a trainer run?): {e}") from e
    refused, _ = init_from_changes(
        meta.get("config", {}), cfg, meta.get("model_resolved"), cfg.checkpoint.init_from_allow_changes
    )
    if refused:
        raise RecipeRefused(f"{where}: its run's settings differ from this config's: " + "; ".join(refused))
    differences = array_differences(step_dir, *build(cfg).abstract_state())
    if differences:
        raise RecipeRefused(f"{where} holds other arrays than this config makes: " + "; ".join(differences))


def check_writable(path: str) -> None:
    """`path`'s folder exists and this process can create files in it (OSError naming it otherwise):
    checked before any training, so a run never ends unable to write its table."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise OSError(f"{path}: folder {folder} does not exist")
    if os.path.isdir(path):
        raise OSError(f"{path} is a folder")
    with tempfile.NamedTemporaryFile(dir=folder):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.olmo_reference", description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="olmax trainer YAML")
    p.add_argument("--out", required=True, help="the metrics table to write (JSON lines)")
    p.add_argument("--work_dir", help="OLMo-core's work dir (default: a temporary one)")
    p.add_argument("--state", help="also save the final params (olmax layout) to this .npz")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides, as trainer.main takes them")
    a = p.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # olmax's init runs here too: on the CPU, as the reference
    from trainer.config.schema import load_config

    logging.basicConfig(level=logging.WARNING)
    try:
        cfg = load_config(a.config, list(a.overrides))
        for path in (a.out, a.state):
            if path:
                check_writable(path)
        check_recipe(cfg)
        optim_config(cfg)
        scheduler(cfg)
        check_init_from(cfg)
        with tempfile.TemporaryDirectory() as tmp:
            run(cfg, a.out, a.work_dir or tmp, a.state)
    except (RecipeRefused, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"reference: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
