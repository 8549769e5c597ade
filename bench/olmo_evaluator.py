"""`python -m bench.olmo_evaluator --config RECIPE --state FINAL.npz [key=value ...]` — held-out
loss as OLMo-core 3.0.0's own evaluator scores it, beside olmax's, per set (JSON on stdout).

Held-out loss as OLMo-core 3.0.0's own evaluator scores it: `LMEvaluatorCallbackConfig` (the
callback OLMo 3's scripts add as `lm_evaluator`) over the `NumpyPaddedFSLDataset` it requires,
built from a recipe's held-out token files, run through its own `EvaluatorCallback.perform_eval`
(its `NumpyFSLDataLoader`, `TransformerTrainModule.eval_batch`, `LMEvaluator.update_metrics`).

What OLMo-core's evaluator computes (olmo_core/eval/lm_evaluator.py, data/utils.py `get_labels`):
per set (metadata `label` of the token file), a `MeanMetric` over per-token CE. Each instance is
one document (the span of a file ending at an EOS, cut to seq_len ids), PAD-filled; its
`label_mask` is True on the document's n ids. The labels are the ids shifted left by one, so a
document has n - 1 targets (its last position's label is the fill or past the end: ignored, CE 0).
But `update_metrics` selects the per-token CE with the *unshifted* label_mask: n values, the n - 1
targets' CE and one 0. So its

    eval/lm/<set>/CE loss = Σ CE over the set's targets / Σ n = Σ CE / (targets + documents),

while olmax's `heldout/<set>/loss` (trainer/heldout_eval.py with `eval.instances: padded`, the
same instances: dataloader/heldout.py) is Σ CE / targets: the token-weighted mean over the
targets it scored. The numerators are the same sum; OLMo-core's denominator counts one more
position per document. `score` returns OLMo-core's own MeanMetric state (Σ, weight) besides its
reported value, so that a test can hold each part against olmax's (tests/trainer/test_olmo_evaluator.py).

The other difference, by OLMo-core's loader: it shuffles the instances of all sets together
(seed 0) and drops the last len % instances-per-batch of them. `score` runs it with
`instances_per_batch` (default 1: the train module's eval batch spec, `rank_microbatch_size` tokens,
one instance) so that no instance is dropped and both sides score every document; `dropped`
reports what a larger batch leaves out.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from bench import olmo_reference as ref_lib
from contract import Manifest

LM = "lm_evaluator"  # the callback's name in OLMo 3's scripts


def padded_dataset_config(manifest, heldout_files: dict[str, list[str]], seq_len: int, work_dir: str):
    """OLMo-core's padded LM-evaluation dataset over the held-out token files, each file labelled
    with its set (as `NumpyPaddedFSLDatasetConfig.from_data_mix` labels a validation mix)."""
    from olmo_core.data import NumpyDatasetDType, NumpyPaddedFSLDatasetConfig  # optional: the test extra

    paths = [p for files in heldout_files.values() for p in files]
    metadata = [{"label": label} for label, files in heldout_files.items() for _ in files]
    return NumpyPaddedFSLDatasetConfig(
        tokenizer=ref_lib.tokenizer(manifest),
        paths=paths,
        metadata=metadata,
        sequence_length=seq_len,
        dtype=NumpyDatasetDType.uint32,
        work_dir=work_dir,
    )


def score(cfg, params, work_dir: str, instances_per_batch: int = 1, float64_sums: bool = False) -> dict[str, Any]:
    """OLMo-core's LM evaluator over the recipe's held-out sets with `params` (olmax layout).
    Returns {"loss": {set: eval/lm/<set>/CE loss}, "sum": {set: its MeanMetric's Σ},
    "weight": {set: its MeanMetric's weight}, "documents": {set: its instances}, "instances": the
    dataset's size, "dropped": the instances its loader left out}. `float64_sums`: its MeanMetric
    accumulates in float64 instead of its float32 (one rounding per document less: what is left is
    the per-token CE's own arithmetic). On one torch thread (the caller's count restored after)."""
    import torch  # optional: the test extra (torch)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _score(cfg, params, work_dir, instances_per_batch, float64_sums=float64_sums)
    finally:
        torch.set_num_threads(threads)


def _trainer(cfg, params, work_dir: str, instances_per_batch: int, packed: bool = False):
    """OLMo-core's Trainer with the recipe's model (weights `params`), its train loader (the
    collator the evaluator takes) and an evaluator callback: the LM-evaluator callback over the
    padded dataset, or (`packed`) an `EvaluatorCallback` holding an `LMEvaluator` over the packed
    instances (`packed_batches`)."""
    import torch  # optional: the test extra (torch)
    from olmo_core.data import NumpyDataLoaderConfig  # optional: the test extra (OLMo-core)
    from olmo_core.eval.lm_evaluator import LMEvaluator
    from olmo_core.train import Duration, TrainerConfig
    from olmo_core.train.callbacks import EvaluatorCallback, LMEvaluatorCallbackConfig
    from olmo_core.train.train_module import TransformerTrainModule

    ref_lib.check_recipe(cfg)
    if len(cfg.data) != 1:
        raise ref_lib.RecipeRefused("the reference reads one manifest (`data` with one entry)")
    manifest = Manifest.load(str(cfg.data[0]))
    mc, L = cfg.model_cfg(), manifest.seq_len
    train_files, heldout_files = ref_lib.token_files(manifest)
    if not heldout_files:
        raise ref_lib.RecipeRefused("the manifest has no held-out source to evaluate")
    train_module = TransformerTrainModule(
        ref_lib.model_config(mc).build(init_device="cpu"),
        ref_lib.optim_config(cfg),
        rank_microbatch_size=instances_per_batch * L,  # the eval batch spec: this many tokens a batch
        max_sequence_length=L,
        device=torch.device("cpu"),
    )
    train_module.load_state_dict({"model": ref_lib.to_olmo_state(mc, params)})
    ds = ref_lib.fsl_dataset(train_files, manifest, L, os.path.join(work_dir, "train"))
    loader = NumpyDataLoaderConfig(
        global_batch_size=cfg.global_batch_size * L, seed=cfg.seed, num_workers=0, work_dir=work_dir
    ).build(ds)
    evaluator: Any
    if packed:
        batches = packed_batches(manifest, heldout_files, L, instances_per_batch, os.path.join(work_dir, "heldout"))
        lm = LMEvaluator(name="lm", batches=batches, labels=list(heldout_files), device=torch.device("cpu"))
        evaluator = EvaluatorCallback(evaluators=[lm], eval_interval=None)
    else:
        evaluator = LMEvaluatorCallbackConfig(
            eval_dataset=padded_dataset_config(manifest, heldout_files, L, os.path.join(work_dir, "heldout")),
            eval_interval=None,
        )
    return TrainerConfig(
        save_folder=os.path.join(work_dir, "save"),
        work_dir=work_dir,
        max_duration=Duration.steps(1),
        no_checkpoints=True,
        callbacks={LM: evaluator},
        device="cpu",
    ).build(train_module, loader)


def _score(
    cfg, params, work_dir: str, instances_per_batch: int, packed: bool = False, float64_sums: bool = False
) -> dict[str, Any]:
    import torch  # optional: the test extra (torch)

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    trainer = _trainer(cfg, params, work_dir, instances_per_batch, packed)
    callback = trainer.callbacks[LM]
    if float64_sums:  # its MeanMetric's running Σ and weight in float64: the per-token CE as it computes them
        for metric in callback.evaluators[0].metrics.values():
            metric.weighted_sum, metric.weight = metric.weighted_sum.double(), metric.weight.double()
    callback.perform_eval()  # OLMo-core's own eval loop: what it records as eval/lm/<set>/CE loss
    (evaluator,) = callback.evaluators
    reported = {
        k.removesuffix("/CE loss"): float(v) for k, v in evaluator.compute_metrics().items() if k.endswith("/CE loss")
    }
    out: dict[str, Any] = {
        "loss": reported,
        "sum": {label: float(m.weighted_sum) for label, m in evaluator.metrics.items()},
        "weight": {label: float(m.weight) for label, m in evaluator.metrics.items()},
    }
    if packed:
        documents: dict[str, int] = {}
        for b in evaluator.batches:
            label = b["metadata"][0]["label"]
            documents[label] = documents.get(label, 0) + len(b["input_ids"])
        return {**out, "documents": documents, "instances": sum(documents.values()), "dropped": 0}
    dataset = evaluator.batches.dataset
    per_batch = evaluator.batches.global_batch_size // dataset.sequence_length
    return {
        **out,
        "documents": _documents(dataset),
        "instances": len(dataset),
        "dropped": len(dataset) - evaluator.total_batches * per_batch,
    }


def _documents(dataset) -> dict[str, int]:
    """{set: its instances (documents)} of OLMo-core's padded dataset, by each file's metadata label."""
    out: dict[str, int] = {}
    for i in range(len(dataset)):
        label = dataset[i]["metadata"]["label"]
        out[label] = out.get(label, 0) + 1
    return out


def score_packed(cfg, params, work_dir: str) -> dict[str, Any]:
    """OLMo-core's `LMEvaluator` and `EvaluatorCallback.perform_eval` over the fixed-length instances
    olmax's `eval.instances: packed` and the step-for-step harness score (each set's records in file
    order, global_batch_size a batch, no label_mask: every position's CE selected, the last one's
    label past the end, CE 0): the same keys as `score`. `LMEvaluatorCallbackConfig` itself only
    takes a padded dataset; this is its evaluator over the other instances."""
    import torch  # optional: the test extra (torch)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _score(cfg, params, work_dir, cfg.global_batch_size, packed=True)
    finally:
        torch.set_num_threads(threads)


def packed_batches(manifest, heldout_files: dict[str, list[str]], seq_len: int, per_batch: int, work_dir: str):
    """Each held-out set's `NumpyFSLDataset` instances (bench.olmo_reference.fsl_dataset: the harness's)
    in file order, `per_batch` a batch, as OLMo-core's collator hands them to an evaluator:
    {"input_ids": int64 [k, L], "metadata": [{"label": set}] * k}."""
    import torch  # optional: the test extra (torch)

    out = []
    for label, paths in heldout_files.items():
        ds = ref_lib.fsl_dataset(paths, manifest, seq_len, os.path.join(work_dir, label))
        ds.prepare()
        for start in range(0, len(ds), per_batch):
            rows = [
                torch.as_tensor(ds[i]["input_ids"], dtype=torch.long)
                for i in range(start, min(start + per_batch, len(ds)))
            ]
            out.append({"input_ids": torch.stack(rows), "metadata": [{"label": label}] * len(rows)})
    return out


def olmax_sums(cfg, params, instances: str = "padded") -> dict[str, tuple[float, float]]:
    """olmax's held-out evaluator (trainer.heldout_eval) over the recipe's held-out sets as
    `instances`: {set: (Σ CE, target tokens)}, what its `heldout/<set>/loss` divides."""
    import jax  # JAX after main's JAX_PLATFORMS=cpu

    from dataloader import heldout  # JAX after main's JAX_PLATFORMS=cpu
    from trainer import heldout_eval
    from trainer.build import build

    manifests = [Manifest.load(str(p)) for p in cfg.data]
    built = build(cfg)
    sets = heldout.open_sets(manifests, heldout.heldout_sources(manifests), instances)
    ev = heldout_eval.Evaluator(
        built.eval_step, sets, built.mesh, cfg.global_batch_size, None, 0, 1, instances=instances
    )
    try:
        return ev.sums(jax.tree.map(np.asarray, params))
    finally:
        ev.close()


def load_state(path: str) -> dict:
    """The harness's `--state` npz ({'a/b/c': array}) -> olmax's params tree ({'a': {'b': {'c': ...}}})."""
    out: dict = {}
    with np.load(path) as flat:
        for key in flat.files:
            *parents, leaf = key.split("/")
            node = out
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = flat[key]
    return out


def table(cfg, params, work_dir: str) -> dict[str, dict[str, float]]:
    """{set: both sides' figures}: olmax's padded and packed loss, OLMo-core's reported CE loss
    over each, their sums, the targets and documents, and the sums' difference per target."""
    padded, packed = olmax_sums(cfg, params, "padded"), olmax_sums(cfg, params, "packed")
    theirs = score(cfg, params, os.path.join(work_dir, "padded"))
    theirs64 = score(cfg, params, os.path.join(work_dir, "padded64"), float64_sums=True)
    theirs_packed = score_packed(cfg, params, os.path.join(work_dir, "packed"))
    out = {}
    for label, (ce, targets) in padded.items():
        pce, ptargets = packed[label]
        out[label] = {
            "documents": theirs["documents"][label],
            "targets": targets,
            "olmax_padded_loss": ce / targets,
            "olmo_core_padded_CE_loss": theirs["loss"][label],
            "olmo_core_padded_weight": theirs["weight"][label],
            "padded_sum_diff_per_target": abs(theirs["sum"][label] - ce) / targets,
            "padded_float64_sum_diff_per_target": abs(theirs64["sum"][label] - ce) / targets,
            "olmax_packed_loss": pce / ptargets,
            "olmo_core_packed_CE_loss": theirs_packed["loss"][label],
            "packed_sum_diff_per_target": abs(theirs_packed["sum"][label] - pce) / ptargets,
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.olmo_evaluator", description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="olmax trainer YAML (a recipe bench.olmo_reference runs)")
    p.add_argument("--state", required=True, help="the weights to score: bench.olmo_reference --state's .npz")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides, as trainer.main takes them")
    a = p.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # olmax's evaluator runs here too: on the CPU
    from trainer.config.schema import load_config

    logging.basicConfig(level=logging.WARNING)
    try:
        cfg = load_config(a.config, list(a.overrides))
        ref_lib.check_recipe(cfg)
        params = load_state(a.state)
        with tempfile.TemporaryDirectory() as tmp:
            figures = table(cfg, params, tmp)
    except (ref_lib.RecipeRefused, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
