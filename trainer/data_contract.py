"""The trainer's side of the data contract: read and check the manifests against the model at
start-up, and write the run record (run.json) that hands the run to the audit.

No JAX here: these are pure checks and a small JSON file, testable without a device.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from contract import HELDOUT, INDEX_SHUFFLE, HostRange, Manifest, Order, RunRecord, TokenizerInfo
from contract.errors import Refused
from contract.rundir import RunDir
from trainer.trackers import check_labels

if TYPE_CHECKING:  # (no JAX at this module's import: the model package imports it)
    from dataloader import LoaderConfig
    from dataloader.plan import Plan
    from model import ModelConfig

log = logging.getLogger(__name__)


class DataContractError(Refused, ValueError):
    """The data does not fit the model or the run it would resume (the message says what differs)."""


MIXTURES_DIR = "data_manifests/mixtures"  # the recipes' convention: out/NAME is built from MIXTURES_DIR/NAME.yaml


def load_manifests(paths: Sequence[str]) -> list[Manifest]:
    """Every manifest of the run, validated with its fingerprint recomputed (ManifestError); one
    that cannot be read (not built yet, unreadable) is a DataContractError naming the file and,
    when it is missing, the command that builds it."""
    out = []
    for p in paths:
        try:
            out.append(Manifest.load(p))
        except FileNotFoundError:
            raise DataContractError(f"data: manifest {p} not found; {build_hint(p)}") from None
        except OSError as e:
            raise DataContractError(f"data: cannot read manifest {p} ({type(e).__name__}: {e})") from None
    return out


def build_hint(manifest_path: str) -> str:
    """How a missing manifest is made: the tokenize command writing into its folder (with the
    mixture of the same name when the recipes' one exists)."""
    folder = os.path.dirname(manifest_path) or "."
    mixture = os.path.join(MIXTURES_DIR, f"{os.path.basename(os.path.normpath(folder))}.yaml")
    if not os.path.isfile(mixture):
        mixture = "MIXTURE.yaml"
    return (
        f"it is built by `python -m pipelines.tokenize --mixture {mixture} --output {folder}` "
        "(run that first, or fix the path in `data`)"
    )


def check_tokenizer_fits_model(tok: TokenizerInfo, model_cfg: ModelConfig, where: str) -> None:
    """The manifest's tokenizer must be the model's: same vocabulary size, EOS and PAD ids, and
    the same BPE ranks (sha256), unless the model config leaves its ranks unknown (None).

    model_cfg: a ModelConfig (vocab_size, eos_id, pad_id, ranks_sha256). A model with a bigger vocabulary would
    score ids the data never holds (pad the embedding with `vocab_pad_multiple` instead); a
    smaller one would index out of its embedding; another EOS/PAD would mask the wrong tokens.
    """
    diffs = [
        f"{name}: data {got}, model {want}"
        for name, got, want in (
            ("vocab_size", tok.vocab_size, model_cfg.vocab_size),
            ("eos_id", tok.eos_id, model_cfg.eos_id),
            ("pad_id", tok.pad_id, model_cfg.pad_id),
            ("ranks_sha256", tok.ranks_sha256, model_cfg.ranks_sha256),
        )
        if got != want and not (name == "ranks_sha256" and want is None)
    ]
    if diffs:
        raise DataContractError(
            f"{where}: tokenizer {tok.name!r} does not fit the model config ({'; '.join(diffs)}): "
            f"tokenize the data with the model's tokenizer or choose a model whose vocabulary matches"
        )


def check_data(manifests: Sequence[Manifest], model_cfg: ModelConfig, seq_len: int | None) -> tuple[int, TokenizerInfo]:
    """Start-up checks: one seq_len and one tokenizer over all manifests, the tokenizer fits the model,
    seq_len equals the config's when set. Returns (seq_len, tokenizer)."""
    first = manifests[0]
    for m in manifests[1:]:
        if m.seq_len != first.seq_len or m.tokenizer != first.tokenizer:
            raise DataContractError(
                f"{m.path} and {first.path} disagree on seq_len or tokenizer "
                f"({m.seq_len}, {m.tokenizer} vs {first.seq_len}, {first.tokenizer})"
            )
    if seq_len is not None and seq_len != first.seq_len:
        raise DataContractError(f"config seq_len={seq_len} but {first.path} holds seq_len={first.seq_len}")
    check_tokenizer_fits_model(first.tokenizer, model_cfg, first.path)
    return first.seq_len, first.tokenizer


def check_heldout_for_eval(manifests: Sequence[Manifest], eval_every: int) -> int:
    """Start-up check: with `eval.every` > 0 the run evaluates on the held-out split, so the
    manifests must hold held-out examples (else the first evaluation, `eval.every` steps in,
    would fail). Returns the number of held-out examples."""
    n = sum(int(entry["splits"][HELDOUT]["examples"]) for m in manifests for entry in m["sources"].values())
    if eval_every > 0 and n == 0:
        raise DataContractError(
            f"eval.every={eval_every} but the data holds no held-out examples "
            f"({', '.join(m.path or '<manifest>' for m in manifests)}): the first evaluation would fail at "
            f"step {eval_every}. Set eval.every=0, or add a held-out source: a second manifest in `data` "
            "built from a mixture whose sources say `split: heldout` (for AI2's token files: "
            "`python -m pipelines.mixture from-olmo-mix ... --split heldout`), or a heldout_fraction > 0"
        )
    return n


def check_eval_sets(manifests: Sequence[Manifest], sets: Sequence[str] | None) -> list[str]:
    """Start-up check: the held-out sets to evaluate (`eval.sets`, or every source with held-out
    examples), each a source with held-out examples, none named like the trackers' overall."""
    from dataloader.heldout import choose_sets  # imported here: no Grain/JAX at this module's import

    try:
        labels = choose_sets(manifests, sets)
        check_labels(labels)
    except ValueError as e:
        raise DataContractError(str(e)) from None
    return labels


def check_plan(loader_cfg: LoaderConfig, manifests: Sequence[Manifest]) -> Plan:
    """The loader's plan, built (data_weights name known sources, the weights can be met): checked
    at start-up, before anything is written into the run dir, and kept (``Checked.plan``) for the
    loader. manifests: its data, as `load_manifests` read them."""
    from dataloader.loader import load_plan  # imported here: no Grain/JAX at this module's import

    try:
        return load_plan(loader_cfg, manifests)[1]
    except ValueError as e:
        raise DataContractError(f"the data plan cannot be built: {e}") from None


# Run-record fields that define the data stream: a resumed run must not change them (weights act
# through the loader fingerprint: an override that leaves the plan unchanged is the same stream).
STREAM_FIELDS = (
    "global_batch_size",
    "seed",
    "split",
    "manifest_fingerprints",
    "loader_fingerprint",
    "order",
    "seq_len",
    "tokenizer",
)


def run_record(
    *,
    manifests: Sequence[Manifest],
    global_batch_size: int,
    seed: int,
    weights: Mapping[str, float] | None,
    loader_fingerprint: str,
    host_count: int,
    model: Mapping[str, Any],
    order: Order = INDEX_SHUFFLE,
    split: str = "train",
) -> RunRecord:
    """A fresh run's record (hosts: `host_count` from step 0)."""
    return RunRecord(
        global_batch_size=global_batch_size,
        seed=seed,
        split=split,
        data=tuple(m.path for m in manifests),
        manifest_fingerprints=tuple(m.fingerprint for m in manifests),
        weights=None if weights is None else {k: float(v) for k, v in weights.items()},
        loader_fingerprint=loader_fingerprint,
        order=order,
        seq_len=manifests[0].seq_len,
        tokenizer=manifests[0].tokenizer,
        hosts=(HostRange(0, host_count),),
        model=dict(model),
    )


def update_run_record(
    run: RunDir, fresh: RunRecord, start_step: int, write: bool = True, allow_stream_change: bool = False
) -> RunRecord:
    """Writes the run's run.json (``run.run_record``) for a (re)start at `start_step` and returns it.

    From step 0 the fresh record is written. On a resume, the existing record's stream fields must
    equal the fresh one's (else DataContractError: the resumed stream would not continue the run's)
    and its host ranges are cut at `start_step` and continued with this start's host count.
    write=False: check and return only (non-primary hosts). allow_stream_change (the trainer's
    ``checkpoint.allow_data_mismatch``): a changed stream is logged and recorded instead; the
    audit then checks every step against the new stream, so steps before `start_step` differ.
    """
    path = run.run_record
    if start_step == 0 or not path.exists():
        if start_step:
            log.warning("%s is missing: writing one that dates this host count from step 0", path)
        if write:
            fresh.write(run)
        return fresh
    old = RunRecord.load(path)
    diffs = [
        f"{k}: run.json has {getattr(old, k)!r}, this start has {getattr(fresh, k)!r}"
        for k in STREAM_FIELDS
        if getattr(old, k) != getattr(fresh, k)
    ]
    if diffs:
        message = f"resuming {run} at step {start_step} with another data stream:\n  " + "\n  ".join(diffs)
        if not allow_stream_change:
            raise DataContractError(message)
        log.warning(
            "%s\nrecording the new stream in run.json (checkpoint.allow_data_mismatch=true); the "
            "audit will not match the steps before %d",
            message,
            start_step,
        )
    new = dataclasses.replace(fresh, hosts=old.restarted(start_step, fresh.hosts[0].host_count).hosts)
    if write:
        new.write(run)
    return new
