"""`python -m bench.olmo_scale --out DIR [--steps N] [--seq_len L]` — olmax against OLMo-core 3.0.0
at shapes that exercise what the toy comparison cannot (issue #58, items 3 and 4a).

The model: d_model 256 (4 heads of 64, SwiGLU 768), 4 layers in OLMo 3's pattern (sliding,
sliding, sliding, full; window 256 < the 1024-token sequence, so RoPE θ 5e5 rotates over 1024
positions and the window mask cuts), the dolma2 tokenizer's 100,278 ids padded as AI2 pads them
(`vocab_pad_multiple: 128`, `vocab_padding: unmasked`: 100,352 embedding and LM-head rows, every
one in the softmax and z-loss, as OLMo-core's `padded_vocab_size()` model), the chunked loss in
chunks of 256 positions; float32 on both sides. The data: real text, the embedded sample's
documents (`pipelines.sample`: code, prose, math, round-robin) tokenized with olmax's dolma2
tokenizer (`pipelines.dolma2_tokenizer.dolma2`, `encode_ordinary` + EOS), as token files both
trainers read (OLMo-core's `NumpyFSLDataset`, olmax's `data_order: olmo-core`) and a held-out set.

The runs, each `--steps` updates of 2 sequences (bench.olmo_step_for_step's machinery: olmax by
`trainer.main` in a process beside this one, OLMo-core by `bench.olmo_reference`), all from
OLMo-core's own `init_weights` (`BENCH_INITS`; `build(inits=...)` can add runs from olmax's
`model.init`): the model built and initialised by OLMo-core with `init_seed` INIT_SEED, saved as an
OLMo-core DCP step, imported by `python -m trainer.convert from-olmo-core --fresh_moments` (the
product's import; every tensor checked equal, bit for bit, to OLMo-core's), both trained from that
step (`checkpoint.init_from`):

  olmax / OLMo-core, 1 microbatch     the comparison
  olmax / OLMo-core, 2 microbatches   each framework against itself under a change that should not
                                      matter (float32 rounding of another reduction order): the
                                      self-control, the scale of the cross differences

Writes DIR/figures.json (every pair's largest per-step differences, the final parameters'
differences, the ratios to the self-gaps) and DIR/figures.md (the same as tables), and prints the
markdown. tests/bench/test_olmo_scale.py runs the same code with fewer updates (ci_extra).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from bench import olmo_bounds as bounds
from bench import olmo_reference as ref_lib
from bench import olmo_step_for_step as sfs
from contract.outputs import write_atomic
from trainer.config.schema import load_config

D_MODEL, N_LAYERS, N_HEADS, HEAD_DIM, MLP = 256, 4, 4, 64, 768
WINDOW, SEQ_LEN, G, PAD_MULTIPLE, LOSS_CHUNK = 256, 1024, 2, 128, 256
STEPS, HELDOUT_INSTANCES, EVAL_EVERY = 30, 2, 10
INIT_SEED = 2026  # OLMo-core's TransformerConfig.init_seed for the olmo_core_oc runs (its default is 0)
# which runs: {init: the microbatch splits trained from it, on both sides}; "olmax": model.init's
# weights (init_seed), "olmo-core": OLMo-core's init_weights imported (INIT_SEED)
BENCH_INITS: dict[str, tuple[int, ...]] = {"olmo-core": (1, 2)}
SIDES = {"olmax": "olmax", "olmo-core": "OLMo-core"}


# ----------------------------------------------------------------------------------------- data


def sample_documents() -> Iterator[str]:
    """The embedded sample's documents (`pipelines.sample.build_sample`), code, prose and math
    taken in turn, each source's parts in order."""
    from pipelines.sample import build_sample  # its build reads the standard library: only when needed

    root = Path(build_sample())

    def texts(folder: str) -> Iterator[str]:
        for part in sorted((root / folder).iterdir()):
            data = part.read_bytes()
            if part.name.endswith(".gz"):
                data = gzip.decompress(data)
            elif part.name.endswith(".zst"):
                data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
            for line in data.decode("utf-8").splitlines():
                yield json.loads(line)["text"]

    sources = [texts("code"), texts("prose"), texts("math")]
    while sources:
        for it in list(sources):
            doc = next(it, None)
            if doc is None:
                sources.remove(it)
            else:
                yield doc


def sample_tokens(n: int) -> np.ndarray:
    """uint32 [n]: the sample's documents in dolma2 ids, each followed by EOS; the last id EOS.
    ValueError when the sample holds fewer than n ids."""
    from pipelines.dolma2_tokenizer import DOLMA2, dolma2  # tiktoken's ranks: only when data is written

    enc, out, have = dolma2(), [], 0
    for doc in sample_documents():
        ids = enc.encode_ordinary(doc) + [DOLMA2.eos_id]
        out.append(np.asarray(ids, np.uint32))
        have += len(ids)
        if have >= n:
            ids_all = np.concatenate(out)[:n]
            ids_all[-1] = DOLMA2.eos_id
            return ids_all
    raise ValueError(f"the embedded sample holds {have} dolma2 ids, fewer than the {n} asked for")


def write_data(root: str, seq_len: int, train_instances: int, heldout_instances: int = HELDOUT_INSTANCES) -> str:
    """Token files (train, then held-out: the sample's next ids) + a contract manifest; its path."""
    from pipelines.dolma2_tokenizer import DOLMA2  # tiktoken's ranks: only when data is written

    n_train, n_held = train_instances * seq_len, heldout_instances * seq_len
    ids = sample_tokens(n_train + n_held)
    train, heldout = ids[:n_train].copy(), ids[n_train:].copy()
    train[-1] = DOLMA2.eos_id  # every file ends a document (write_token_dataset's rule)
    tokenizer = {
        "name": DOLMA2.name,
        "ranks_sha256": DOLMA2.ranks_sha256,
        "vocab_size": DOLMA2.vocab_size,
        "eos_id": DOLMA2.eos_id,
        "pad_id": DOLMA2.pad_id,
    }
    return sfs.write_token_dataset(root, seq_len, [train], heldout, tokenizer)


# ------------------------------------------------------------------------------------ scenarios


def recipe(manifest: str, steps: int, seq_len: int, *extra: str) -> list[str]:
    """trainer.main overrides (on trainer/configs/tiny.yaml: olmo3-tiny, dolma2's vocabulary)."""
    return [
        f"data=[{manifest}]",
        "data_order=olmo-core",
        "model_overrides.compute_dtype=float32",
        f"model_overrides.d_model={D_MODEL}",
        f"model_overrides.n_layers={N_LAYERS}",  # layer_types re-derived: sliding, sliding, sliding, full
        f"model_overrides.n_heads={N_HEADS}",
        f"model_overrides.n_kv_heads={N_HEADS}",
        f"model_overrides.head_dim={HEAD_DIM}",
        f"model_overrides.mlp_hidden={MLP}",
        f"model_overrides.sliding_window={WINDOW}",
        f"model_overrides.max_seq_len={seq_len}",
        f"model_overrides.vocab_pad_multiple={PAD_MULTIPLE}",
        "model_overrides.vocab_padding=unmasked",
        "document_masking=false",
        f"global_batch_size={G}",
        f"steps={steps}",
        "lr=3e-3",
        "schedule.kind=cosine",
        f"schedule.warmup_steps={max(1, steps // 6)}",
        "schedule.final_lr_ratio=0.1",
        "schedule.step_offset=1",
        "skip_step.enabled=true",
        f"loss_chunk={LOSS_CHUNK}",
        f"eval.every={min(EVAL_EVERY, steps)}",
        "eval_batches=null",
        "checkpoint.every=0",
        "downstream.every=0",
        "mesh.cpu_devices=1",
        "verify_data_gib=0",
        "log.progress_every=0",
        *extra,
    ]


@dataclasses.dataclass
class Run:
    side: str  # "olmax" | "olmo-core"
    path: str  # olmax: the run dir; OLMo-core: its table (JSON lines)
    overrides: list[str]
    steps: int
    state: str | None = None  # OLMo-core's final params (.npz, olmax's layout)


def run_name(side: str, init: str, mb: int) -> str:
    return f"{side}_from_{init}_mb{mb}"


def scenarios(
    root: Path,
    data: str,
    steps: int,
    seq_len: int,
    inits: dict[str, tuple[int, ...]],
    init_step: str | None,
    extra: Sequence[str] = (),
) -> dict[str, Run]:
    """The runs of `inits` (see BENCH_INITS), each on both sides; `init_step`: OLMo-core's init
    imported; `extra`: recipe overrides for every run (both sides read the same recipe)."""
    runs = {}
    for init, splits in inits.items():
        start = [f"checkpoint.init_from={init_step}"] if init == "olmo-core" else []
        for mb in splits:
            over = recipe(data, steps, seq_len, f"microbatches={mb}", *start, *extra)
            name = run_name("olmax", init, mb)
            runs[name] = Run("olmax", str(root / "runs" / name), over, steps)
            name = run_name("olmo-core", init, mb)
            runs[name] = Run("olmo-core", str(root / f"{name}.jsonl"), over, steps, str(root / f"{name}.npz"))
    return runs


def pairs_of(inits: dict[str, tuple[int, ...]]) -> tuple[dict[str, tuple[str, str]], list[str], list[str]]:
    """({label: (run a, run b)}: a − b, the cross labels, the self-control labels)."""
    pairs, cross, selfs = {}, [], []
    for init, splits in inits.items():
        for mb in splits:
            label = f"olmax vs OLMo-core, {init} init, {mb} microbatch(es)"
            pairs[label] = (run_name("olmax", init, mb), run_name("olmo-core", init, mb))
            cross.append(label)
        if len(splits) > 1:
            for side in SIDES:
                label = f"{SIDES[side]} self, {init} init, {splits[0]} vs {splits[1]} microbatches"
                pairs[label] = (run_name(side, init, splits[0]), run_name(side, init, splits[1]))
                selfs.append(label)
    return pairs, cross, selfs


# ----------------------------------------------------------------------------- OLMo-core's init


def olmo_core_init(cfg, seed: int, step_dir: Path) -> dict:
    """OLMo-core's own initial weights: `model_config(...)` with `init_seed=seed`, built on the CPU and
    `init_weights` (what `TransformerTrainModule` calls through `parallelize_model`), saved as an
    OLMo-core step (`step_dir/model_and_optim/`, DCP, model only). Returns its state dict."""
    import torch  # optional: the test extra (torch)
    import torch.distributed.checkpoint as dcp

    mc = cfg.model_cfg()
    model = dataclasses.replace(ref_lib.model_config(mc), init_seed=seed).build(init_device="cpu")
    model.init_weights(max_seq_len=cfg.model_cfg().max_seq_len, device=torch.device("cpu"))
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    dcp.save({"model": state}, checkpoint_id=str(step_dir / "model_and_optim"), no_dist=True)
    return state


def import_init(overrides: list[str], seed: int, root: Path) -> tuple[str, dict]:
    """OLMo-core's init (`olmo_core_init`) → an olmax step by `trainer.convert from-olmo-core
    --fresh_moments` (its CLI's entry point); (the olmax step, figures: each tensor of the import
    against OLMo-core's, and the OLMo-core weights the reference will train from against them)."""
    from trainer.convert.__main__ import main as convert  # JAX after main's JAX_PLATFORMS=cpu

    cfg = load_config(sfs.TINY, overrides)
    state = olmo_core_init(cfg, seed, root / "olmo_core_init")
    out = str(root / "olmax_init")
    args = ["from-olmo-core", str(root / "olmo_core_init"), "--out", out, "--config", sfs.TINY, "--fresh_moments"]
    if convert([*args, *overrides]):
        raise RuntimeError("trainer.convert from-olmo-core failed")
    return out, import_figures(cfg, state, out, seed)


def import_figures(cfg, state: dict, out: str, seed: int) -> dict:
    """The olmax step `out` (from-olmo-core's import of OLMo-core's state dict `state`) against it:
    each tensor's largest difference, the OLMo-core weights bench.olmo_reference will train from
    (the step mapped back) against OLMo-core's own, the fresh optimizer state's largest entry."""
    import jax  # JAX after main's JAX_PLATFORMS=cpu

    params, opt = ref_lib.restore_step(cfg, out)
    mc = cfg.model_cfg()
    imported = ref_lib.from_olmo_state(mc, state)
    back = ref_lib.to_olmo_state(mc, params)  # what bench.olmo_reference loads into OLMo-core's model
    pairs = zip(jax.tree.leaves(params), jax.tree.leaves(imported), strict=True)
    moments = [np.abs(x).max() for x in jax.tree.leaves(opt) if np.ndim(x) and np.size(x)]
    return {
        "init_seed": seed,
        "tensors": len(state),
        "import_max_abs": float(max(np.abs(a - b).max() for a, b in pairs)),
        "reference_start_max_abs": float(max(float((back[k] - v).abs().max()) for k, v in state.items())),
        "fresh_moments_max_abs": float(max(moments, default=0.0)),
        "std": {k: float(v.std()) for k, v in state.items() if v.ndim == 2},
    }


# ------------------------------------------------------------------------------------------ build


def build(
    root: Path,
    steps: int = STEPS,
    seq_len: int = SEQ_LEN,
    inits: dict[str, tuple[int, ...]] = BENCH_INITS,
    parallel: bool = False,
    sequential: bool = False,
    extra: Sequence[str] = (),
) -> dict:
    """Data, the import of OLMo-core's init (when `inits` names it), then the runs: the olmax runs in
    one process beside this one and OLMo-core's here, one after another; or (`parallel`) every run in
    its own process at once (OLMo-core's by `python -m bench.olmo_reference`); or (`sequential`) every
    run in its own process, one at a time (the least memory: one run's). `extra`: recipe overrides
    for every run. {"runs", "init", ...}."""
    root = Path(root)
    t0 = time.monotonic()
    data = write_data(str(root / "data"), seq_len, G * steps + G)
    init_step, init = None, None
    if "olmo-core" in inits:
        init_step, init = import_init(recipe(data, steps, seq_len, *extra), INIT_SEED, root)
    runs = scenarios(root, data, steps, seq_len, inits, init_step, extra)
    seconds = run_sequentially(root, runs) if sequential else run_together(root, runs, parallel)
    seconds["total"] = round(time.monotonic() - t0, 1)
    return {
        "runs": runs,
        "inits": dict(inits),
        "init": init,
        "seconds": seconds,
        "data": data,
        "seq_len": seq_len,
        "extra": list(extra),
    }


def run_together(root: Path, runs: dict[str, Run], parallel: bool) -> dict[str, float]:
    """`build`'s default and `parallel` layouts; {run: seconds} of the runs timed here."""
    olmax = [(r.path, r.overrides) for r in runs.values() if r.side == "olmax"]
    stems = [root / f"olmax{i}" for i in range(len(olmax))] if parallel else [root / "olmax"]
    procs = [sfs.start_olmax(stem, [o] if parallel else olmax) for stem, o in zip(stems, olmax, strict=False)]
    references = {name: r for name, r in runs.items() if r.side == "olmo-core"}
    seconds: dict[str, float] = {}
    refs: dict[str, subprocess.Popen] = {}
    try:
        if parallel:
            refs = {name: start_reference(root, name, r) for name, r in references.items()}
            for name, proc in refs.items():
                sfs.wait_olmax(root / f"reference_{name}", proc, timeout=6 * 3600)
        for name, r in references.items() if not parallel else ():
            t = time.monotonic()
            ref_lib.run(load_config(sfs.TINY, r.overrides), r.path, str(root / f"work_{name}"), r.state)
            seconds[name] = round(time.monotonic() - t, 1)
        for stem, proc in zip(stems, procs, strict=True):
            sfs.wait_olmax(stem, proc, timeout=6 * 3600)
    finally:
        for proc in [*procs, *refs.values()]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return seconds


def run_sequentially(root: Path, runs: dict[str, Run]) -> dict[str, float]:
    """Every run in its own process, one after another (olmax's by bench.olmo_step_for_step,
    OLMo-core's by bench.olmo_reference): at most one run's memory at a time (measured at the bench's
    shapes: OLMo-core's 1-microbatch run ~6.6 GB, its 2048 x 100,352 float32 logits, their softmax
    and gradient; olmax's ~2.6 GB). {run: seconds}."""
    seconds: dict[str, float] = {}
    for name, r in runs.items():
        t = time.monotonic()
        if r.side == "olmax":
            stem = root / f"olmax_{name}"
            proc = sfs.start_olmax(stem, [(r.path, r.overrides)])
        else:
            stem = root / f"reference_{name}"
            proc = start_reference(root, name, r)
        try:
            sfs.wait_olmax(stem, proc, timeout=6 * 3600)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        seconds[name] = round(time.monotonic() - t, 1)
    return seconds


def start_reference(root: Path, name: str, r: Run) -> subprocess.Popen:
    """`python -m bench.olmo_reference` of run `r` in its own process (output in root/reference_NAME.log)."""
    assert r.state is not None
    env = {**os.environ, "PYTHONPATH": str(sfs.ROOT), "JAX_PLATFORMS": "cpu"}
    args = ["--config", sfs.TINY, "--out", r.path, "--state", r.state, "--work_dir", str(root / f"work_{name}")]
    (root / f"work_{name}").mkdir()
    with open(root / f"reference_{name}.log", "w") as log:  # the child holds its own copy
        return subprocess.Popen(
            [sys.executable, "-m", "bench.olmo_reference", *args, *r.overrides],
            cwd=sfs.ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


# ---------------------------------------------------------------------------------------- figures


def curves(r: Run) -> dict[str, np.ndarray]:
    """Per update (1-based), the logged train CE, z-loss, grad norm; the held-out CE where evaluated;
    `grad_norm_f64`: the pre-clip gradients' norm summed in float64 where the run records it
    (OLMo-core's: bench.olmo_reference's GRAD_NORM_F64 beside its own float32 one; olmax's logged
    norm is that already: XLA's float32 reduction is within ~1e-8 of float64 here), else absent."""
    if r.side == "olmax":
        rows = {s + 1: row for s, row in sfs.rows_of(r.path).items()}
        keys = ("loss", "z_loss", "grad_norm", "heldout/val/loss", "grad_norm")
    else:
        rows = sfs.ref_rows(r.path)
        keys = (ref_lib.CE, ref_lib.Z, ref_lib.GRAD_NORM, ref_lib.HELDOUT.format(label="val"), ref_lib.GRAD_NORM_F64)
    steps = list(range(1, r.steps + 1))
    if any(s not in rows or keys[0] not in rows[s] for s in steps):
        raise ValueError(f"{r.path}: not every one of the {r.steps} updates logged")
    out = {k: np.array([float(rows[s][src]) for s in steps]) for k, src in zip(("loss", "z", "grad_norm"), keys)}
    out["heldout_steps"] = np.array([s for s in steps if keys[3] in rows[s]])
    out["heldout"] = np.array([float(rows[s][keys[3]]) for s in out["heldout_steps"]])
    if all(keys[4] in rows[s] for s in steps):
        out["grad_norm_f64"] = np.array([float(rows[s][keys[4]]) for s in steps])
    return out


def final_params(r: Run) -> dict[str, np.ndarray]:
    """The parameters after the last update, olmax's layout, {path: array}."""
    if r.side == "olmo-core":
        assert r.state is not None
        return dict(np.load(r.state))
    params, _ = ref_lib.restore_step(load_config(sfs.TINY, r.overrides), f"{r.path}/checkpoints/{r.steps}")
    return ref_lib.flat_params(params)


def gap(a: Run, b: Run, ca: dict, cb: dict, pa: dict, pb: dict) -> dict[str, Any]:
    """a − b: the largest per-update differences, per-update loss differences, the final params'."""
    if not np.array_equal(ca["heldout_steps"], cb["heldout_steps"]) or pa.keys() != pb.keys():
        raise ValueError(f"{a.path} and {b.path} evaluated at other steps or hold other tensors")
    loss = ca["loss"] - cb["loss"]
    gn_logged = ca["grad_norm"] / cb["grad_norm"] - 1
    # the float64 norms where both runs have them (olmax's logged one is; OLMo-core's own is float32)
    gn = ca["grad_norm_f64"] / cb["grad_norm_f64"] - 1 if "grad_norm_f64" in ca and "grad_norm_f64" in cb else None
    other = [k for k in pa if k != sfs.EMBED]
    d_other = np.concatenate([(pa[k] - pb[k]).ravel() for k in other])
    n_other = np.concatenate([pb[k].ravel() for k in other])
    return {
        "loss_abs": float(np.abs(loss).max()),
        "z_abs": float(np.abs(ca["z"] - cb["z"]).max()),
        "grad_norm_rel": float(np.abs(gn_logged if gn is None else gn).max()),
        "grad_norm_logged_rel": float(np.abs(gn_logged).max()),
        "grad_norm_f64": gn is not None,
        "heldout_abs": float(np.abs(ca["heldout"] - cb["heldout"]).max()),
        "params_abs": float(np.abs(d_other).max()),
        "params_rel_norm": float(np.linalg.norm(d_other) / np.linalg.norm(n_other)),
        "embed_abs": float(np.abs(pa[sfs.EMBED] - pb[sfs.EMBED]).max()),
        "embed_rel_norm": float(np.linalg.norm(pa[sfs.EMBED] - pb[sfs.EMBED]) / np.linalg.norm(pb[sfs.EMBED])),
        "loss_by_update": [float(x) for x in loss],
        "grad_norm_rel_by_update": [float(x) for x in (gn_logged if gn is None else gn)],
        "grad_norm_logged_rel_by_update": [float(x) for x in gn_logged],
    }


QUANTITIES = (
    "loss_abs",
    "z_abs",
    "grad_norm_rel",
    "grad_norm_logged_rel",
    "heldout_abs",
    "params_abs",
    "params_rel_norm",
    "embed_abs",
)


def figures(built: dict) -> dict[str, Any]:
    """Every pair's gap (`pairs_of`), each cross pair's ratio to the larger self-gap per quantity
    (the self-controls of every init built), the first and last losses, the import's figures and
    the timings."""
    runs: dict[str, Run] = built["runs"]
    named, cross, selfs = pairs_of(built["inits"])
    c = {name: curves(r) for name, r in runs.items()}
    p = {name: final_params(r) for name, r in runs.items()}
    pairs = {label: gap(runs[a], runs[b], c[a], c[b], p[a], p[b]) for label, (a, b) in named.items()}
    self_gap = {q: max(pairs[s][q] for s in selfs) for q in QUANTITIES} if selfs else None
    ratios = {
        label: {q: pairs[label][q] / self_gap[q] if self_gap and self_gap[q] else None for q in QUANTITIES}
        for label in cross
    }
    same_init = lambda label: [s for s in selfs if s.split(", ")[1] == label.split(", ")[1]]
    per_update = {k: per_update_bounds(pairs, k, same_init(k), c[named[k][0]]) for k in cross if same_init(k)}
    first = next(iter(runs.values()))
    mc = load_config(sfs.TINY, first.overrides).model_cfg()
    return {
        "shape": {
            "d_model": mc.d_model,
            "layers": list(mc.layers),
            "window": mc.sliding_window,
            "seq_len": built["seq_len"],
            "vocab": mc.vocab_size,
            "padded_vocab": mc.padded_vocab_size,
            "scored_vocab": mc.scored_vocab_size,
            "global_batch": G,
            "updates": first.steps,
        },
        "loss_first_last": {n: [float(c[n]["loss"][0]), float(c[n]["loss"][-1])] for n in runs},
        "by_update": {n: {k: [float(x) for x in v] for k, v in c[n].items() if k != "heldout_steps"} for n in runs},
        "pairs": pairs,
        "cross": cross,
        "self": selfs,
        "self_gap": self_gap,
        "ratio_to_self_gap": ratios,
        "per_update_bounds": per_update,
        "extra": list(built.get("extra", ())),
        "init": built["init"],
        "seconds": built["seconds"],
    }


def per_update_bounds(pairs: dict, label: str, selfs: list[str], curve: dict) -> dict[str, dict]:
    """Issue 58's control-relative check, update by update, as `bench.olmo_bounds` makes it: the
    cross gap of the train CE and of the grad norm (float64 norms where recorded) against the running
    maximum of both frameworks' own 1-vs-2-microbatch gaps (`selfs`: olmax's, OLMo-core's, from the
    same init), floored at FLOOR_ULPS float32 ulps of the quantity (`curve`: the olmax run's)."""
    out = {}
    for q, key in (("loss", "loss_by_update"), ("grad_norm", "grad_norm_rel_by_update")):
        cross, ox, oc = (np.abs(np.asarray(pairs[k][key], np.float64)) for k in (label, *selfs))
        out[q] = bounds.bounded(cross, ox, oc, bounds.floor(q, np.asarray(curve[q], np.float64)))
    return out


def markdown(f: dict) -> str:
    """figures.json as two tables (the gaps; the ratios) and the import's line."""
    fmt = lambda v: "–" if v is None else f"{v:.2g}"
    lines = ["| pair | " + " | ".join(QUANTITIES) + " |", "|---" * (len(QUANTITIES) + 1) + "|"]
    lines += [f"| {k} | " + " | ".join(fmt(v[q]) for q in QUANTITIES) + " |" for k, v in f["pairs"].items()]
    lines += ["", "| cross pair ÷ larger self-gap | " + " | ".join(QUANTITIES) + " |"]
    lines += ["|---" * (len(QUANTITIES) + 1) + "|"]
    lines += [f"| {k} | " + " | ".join(fmt(v[q]) for q in QUANTITIES) + " |" for k, v in f["ratio_to_self_gap"].items()]
    if f.get("per_update_bounds"):
        lines += [
            "",
            "| cross pair, per update ÷ the self-gaps' envelope (floor 4 ulps) | train CE max (p50) | grad norm max (p50) |",
        ]
        lines += ["|---|---|---|"]
        for k, b in f["per_update_bounds"].items():
            ce, gn = b["loss"], b["grad_norm"]
            lines.append(
                f"| {k} | {ce['ratio_max']:.3g} ({ce['ratio_p50']:.2g}) | {gn['ratio_max']:.3g} ({gn['ratio_p50']:.2g}) |"
            )
    lines += ["", *per_update_table(f)]
    if f["init"]:
        i = f["init"]
        lines += [
            "",
            f"OLMo-core's init_weights (init_seed {i['init_seed']}, {i['tensors']} tensors) imported by "
            f"from-olmo-core: max |olmax − OLMo-core| {i['import_max_abs']:.3g}; the reference's start "
            f"{i['reference_start_max_abs']:.3g}; fresh moments max {i['fresh_moments_max_abs']:.3g}",
        ]
    return "\n".join(lines) + "\n"


def per_update_table(f: dict) -> list[str]:
    """Per update: each pair's train-CE difference and grad-norm ratio − 1 (float64 norms where
    recorded), the cross pairs first; markdown lines."""
    labels = [*f["cross"], *f["self"]]
    head = ["update", *(f"ΔCE {k}" for k in labels), *(f"Δgn/gn {k}" for k in labels)]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for i in range(len(f["pairs"][labels[0]]["loss_by_update"])):
        ce = [f"{f['pairs'][k]['loss_by_update'][i]:+.1e}" for k in labels]
        gn = [f"{f['pairs'][k]['grad_norm_rel_by_update'][i]:+.1e}" for k in labels]
        lines.append(f"| {i + 1} | " + " | ".join(ce + gn) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.olmo_scale", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for the data, the runs and figures.json/.md (must not exist)")
    p.add_argument("--steps", type=int, default=STEPS, help=f"updates per run (default {STEPS})")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--parallel", action="store_true", help="every run in its own process at once (~15 GB)")
    how.add_argument(
        "--sequential", action="store_true", help="every run in its own process, one at a time (~7 GB: one run's)"
    )
    p.add_argument("--seq_len", type=int, default=SEQ_LEN, help=f"tokens per sequence (default {SEQ_LEN})")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a recipe override for every run, both sides (repeatable), e.g. optimizer.clip_norm=1e9",
    )
    a = p.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # olmax's init runs here too: on the CPU, as the reference
    out = Path(a.out)
    if out.exists():
        print(f"error: --out {out} exists; choose a new folder", file=sys.stderr)
        return 2
    if a.steps < 1 or a.seq_len <= WINDOW:
        print(f"error: --steps must be >= 1 and --seq_len > the window {WINDOW}", file=sys.stderr)
        return 2
    if bad := [x for x in a.set if "=" not in x]:
        print(f"error: --set {bad[0]!r} is not KEY=VALUE", file=sys.stderr)
        return 2
    out.mkdir(parents=True)
    result = figures(build(out, a.steps, a.seq_len, parallel=a.parallel, sequential=a.sequential, extra=a.set))
    write_atomic(out / "figures.json", json.dumps(result, indent=1) + "\n")
    md = markdown(result)
    write_atomic(out / "figures.md", md)
    print(md, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
