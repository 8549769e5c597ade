"""``python -m trainer.convert to-olmo-core STEP --out DIR``: an olmax checkpoint step (or a run
directory: its newest step) → an OLMo-core step directory that OLMo-core 3.0.0 loads and continues
(``Trainer.load_checkpoint(DIR, load_optim_state=True, load_trainer_state=False)``, as AI2's
next-stage scripts load): ``DIR/model_and_optim/`` (DCP: ``model.*`` and SkipStepAdamW's flattened
state, ``optim.state.<param>.{exp_avg,exp_avg_sq,step}`` and ``optim.param_groups.<param>.{lr,
initial_lr,betas,eps,weight_decay}`` from the run's recorded optimizer settings, no weight decay on
the embeddings as OLMo 3), ``DIR/.metadata.json`` and ``DIR/train/rank0.pt``.

``train/rank0.pt`` holds only ``global_step`` (Adam's count): olmax's data position and RNG have no
OLMo-core counterpart, so continue it as a new stage (``load_trainer_state=False``). The skip
step's history is not written (OLMo-core keeps it outside its state dict). Streamed: one layer of
one olmax leaf read at a time (``olmax_read``), one DCP save per tensor (``dcp_write``); the
directory is built in a hidden sibling of ``--out`` and renamed into place.
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from contract.errors import Refused
from trainer.convert.from_olmo_core import Progress, check_out

NAME = "to-olmo-core"


class ExportRefused(Refused, ValueError):
    """A step this command cannot export (one line)."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        NAME,
        help="olmax checkpoint step -> OLMo-core step directory (model_and_optim DCP with Adam state)",
        description=__doc__,
    )
    p.add_argument("step", help="an olmax step directory (RUN/checkpoints/N) or a run directory")
    p.add_argument("--out", required=True, help="the OLMo-core step directory to write (must not exist)")
    p.add_argument("--step", dest="step_number", type=int, default=None, help="the step of a run directory")


def run(args: argparse.Namespace) -> int:
    from trainer.convert.olmax_read import OlmaxStep  # JAX after JAX_PLATFORMS (__main__)

    out = check_out(args.out)
    step = OlmaxStep.open(args.step, args.step_number, items=("params", "opt_state"))
    adam = step.adam()
    if adam is None:
        raise ExportRefused(f"{step.dir}: no Adam state (mu, nu, count) in its opt_state: nothing to continue")
    tmp = out.parent / f".{out.name}.{secrets.token_hex(6)}.tmp"
    tmp.mkdir()
    try:
        written, count = write(step, adam, tmp)
        (tmp / ".metadata.json").write_text(json.dumps({"ephemeral": False, "version": "3.0.0"}))
        write_train_state(tmp / "train", count)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {out}: {written / 1e9:.3f} GB, Adam count {count}")
    print(
        f"continue it with OLMo-core: trainer.load_checkpoint('{out}', load_optim_state=True, load_trainer_state=False)"
    )
    return 0


def groups(config: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """(a param group's settings, the top-level params without weight decay) of a run's config."""
    from trainer.config.schema import TrainConfig  # pydantic only

    defaults = TrainConfig().to_dict()
    o = {**defaults["optimizer"], **config.get("optimizer", {})}
    lr = float(config.get("lr", defaults["lr"]))
    group = {"lr": lr, "initial_lr": lr, "betas": (float(o["b1"]), float(o["b2"])), "eps": float(o["eps"])}
    return {**group, "weight_decay": float(o["weight_decay"])}, set(o["decay_exclude"])


def write(step: Any, adam: Any, folder: Path) -> tuple[int, int]:
    """model_and_optim/ of ``step``; returns (bytes of tensors written, Adam's count)."""
    import torch  # torch: a converting host's dependency (the test extra)

    from trainer.convert import olmo_core_names as names  # JAX after JAX_PLATFORMS (__main__)
    from trainer.convert.dcp_write import DcpWriter

    mc = step.model_cfg
    count = int(step.read(adam.count))
    params = {t.path: t for t in step.tensors("params")}
    group, no_decay = groups(step.meta.get("config", {}))
    out = DcpWriter(folder / "model_and_optim")
    progress = Progress(sum(t.nbytes for t in params.values()) * 3, NAME)
    for e in names.entries(mc):
        sources = {"model.": params[e.path], "exp_avg": adam.mu[e.path], "exp_avg_sq": adam.nu[e.path]}
        for kind, tensor in sources.items():
            piece = olmo_tensor(step, tensor, e, mc)
            key = f"model.{e.olmo}" if kind == "model." else f"optim.state.{e.olmo}.{kind}"
            values: dict[str, Any] = {key: torch.from_numpy(piece)}
            if kind == "exp_avg":
                values[f"optim.state.{e.olmo}.step"] = torch.tensor(float(count))
                decay = 0.0 if e.path[0] in no_decay else group["weight_decay"]
                values |= {f"optim.param_groups.{e.olmo}.{k}": v for k, v in {**group, "weight_decay": decay}.items()}
            out.add(values)
            progress.add(piece.nbytes)
            del piece, values
    out.finish()
    return progress.done, count


BLOCK_BYTES = 64 << 20  # the LM head is transposed this many bytes of columns at a time


def olmo_tensor(step: Any, tensor: Any, e: Any, mc: Any) -> np.ndarray:
    """``e``'s OLMo-core tensor (float32, contiguous) from the olmax leaf ``tensor``. The LM head
    (olmax ``[D, V]``, OLMo-core ``[V, D]``) is read in column blocks into its transposed place, so
    the export never holds it twice (the 7B's is 1.6 GB); every other tensor is one layer's slice."""
    if e.path != ("lm_head", "kernel"):
        return np.ascontiguousarray(e.to_olmo(step.read(tensor, e.layer), mc), np.float32)
    d, v = tensor.shape
    out = np.empty((v, d), np.float32)
    cols = max(1, BLOCK_BYTES // (4 * d))
    for a in range(0, v, cols):
        b = min(a + cols, v)  # tensorstore does not clip a slice to the bounds as numpy does
        out[a:b] = step.read_part(tensor, (slice(None), slice(a, b))).T
    return out


def write_train_state(folder: Path, count: int) -> None:
    import torch  # torch: a converting host's dependency (the test extra)

    folder.mkdir()
    torch.save({"global_step": count}, folder / "rank0.pt")
