"""Pure rules of trainer.checkpointing.checkpoints: no I/O, no collectives, so tests prove them directly.

What they decide: whether a step's listing fits its checksum file (listing_reason); what the
processes agree on before any of them acts on a step: the step list (agreed_steps), each step's
verdict (agreed_reason, then resume_verdict: unsealed by a crash, legacy, or trusted) and each
restore's outcome (agreed_outcome); which step a resume takes or why it refuses to start
(no_intact_error); how the arrays a config makes differ from a checkpoint's (shape_differences);
and how a failed write reads (write_failed). The caller gathers each process's row (every
process the same rows) and every process applies the same rule, so all of them take the same
branch and reach the same collectives in the same order. Also the layout's names, the errors
(with their exit codes) and the PRNG key's exact JSON form.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from contract.errors import Refused, Stopped
from contract.rundir import RunDir

# The layout under run_dir (trainer.checkpointing.checkpoints's docstring draws it)
CHECKPOINTS = RunDir.CHECKPOINTS  # run_dir/checkpoints/<step>/: orbax's steps
REJECTED = RunDir.CHECKPOINTS_REJECTED  # run_dir/checkpoints_rejected/<step>[.n]: steps set aside, + .reason.txt
PENDING = RunDir.CHECKPOINTS_PENDING  # run_dir/checkpoints_pending/<step>: saved by this code, not yet sealed
CHECKSUMS = "olmax_checksums.json"  # run_dir/checkpoints/<step>/olmax_checksums.json: sha256 of its files
ITEMS = ("params", "opt_state", "data", "meta")
# orbax's commit record: the step-level files orbax writes or updates *at* the commit (the step
# metadata's commit timestamp, the commit marker), i.e. after the step was sealed. Restoring reads
# no byte of them (trainer.checkpointing.files.restore_items reads each item through its own
# handler), so the checksums cover every file of every item and these two are left out.
COMMIT_RECORD = ("_CHECKPOINT_METADATA", "commit_success.txt")
LIGHT = ("data", "meta")  # the small JSON items, read (and checked) before the arrays

UNSEALED = (
    f"no {CHECKSUMS}: the run stopped after this step was written but before its checksums were, so it is not trusted"
)
LEGACY = (
    f"no {CHECKSUMS} and never marked pending: written without checksums (by an olmax from before they were recorded?)"
)

INTACT, UNSEALED_CODE, DAMAGED = 0, 1, 2  # verdict codes
CODE_NAMES = {INTACT: "intact", UNSEALED_CODE: f"no {CHECKSUMS}", DAMAGED: "damaged"}


class CheckpointError(Stopped, RuntimeError):
    """A checkpoint that cannot be trusted, or a state that must not be saved (exit 1)."""


class RefusedConfigError(Refused, CheckpointError):
    """The config does not fit a checkpoint (or names one that is not there): the trainer exits
    2 as for any config it refuses, and no checkpoint is moved."""


class ConfigMismatchError(RefusedConfigError):
    """An intact step holds other arrays (names, shapes) than the config makes: the config
    changed (model, model_overrides, optimizer or skip_step settings), not the checkpoint. The
    step is kept where it is."""


def verdict_code(reason: str | None) -> int:
    return INTACT if reason is None else UNSEALED_CODE if reason == UNSEALED else DAMAGED


def agreed_reason(
    where: str, local: str | None, codes: Sequence[int], digests: Sequence[bytes], process_index: int
) -> str | None:
    """Pure: the verdict every process takes on the step ``where`` names, from each process's own
    (``codes[i]``, verdict_code of its reason; ``digests[i]``, sha256 of the checksum file it
    read). Processes that see a shared directory differently (NFS, GCSFuse caches) have a file
    system problem, not a damaged step: any disagreement (other codes, or other checksum files
    read) raises CheckpointError on every process, naming what each saw, so that nothing falls
    back, nothing is moved and, above all, no process re-seals a step another one sees sealed.
    Otherwise the shared verdict: None (intact), UNSEALED (no process sees a checksum file), or
    this process's reason why the step is damaged."""
    if len(set(codes)) > 1 or (codes[0] == INTACT and len(set(digests)) > 1):
        seen = ", ".join(
            f"process {i}: {CODE_NAMES.get(c, c)}"
            + (f" (checksum file sha256 {bytes(d).hex()[:12]})" if c == INTACT else "")
            for i, (c, d) in enumerate(zip(codes, digests))
        )
        raise CheckpointError(
            f"checkpoint {where}: the processes see this step differently ({seen}; process "
            f"{process_index} says: {local or 'intact'}). That is a file-system problem (a cache "
            "that lags, a mount that differs), not damage, so the run stops without falling back or "
            "moving anything: make every process see the same files, then resume"
        )
    return None if codes[0] == INTACT else UNSEALED if codes[0] == UNSEALED_CODE else local


def listing_reason(items: Sequence[str], recorded: dict[str, str], present: Sequence[str]) -> str | None:
    """Pure: why a step's listing (``present``, relative paths) does not fit its checksum file's
    ``recorded`` files (None when it does). A checksum file that lists no file of an item vouches
    for nothing. orbax's COMMIT_RECORD may be present unrecorded (steps sealed before their
    commit); where a checksum file records it (steps sealed after it), it is verified too."""
    empty = [item for item in items if not any(n.startswith(f"{item}/") for n in recorded)]
    if empty:
        return f"{CHECKSUMS} records no file of item(s) {', '.join(empty)}"
    missing = sorted(set(recorded) - set(present))
    extra = sorted(set(present) - set(recorded) - set(COMMIT_RECORD))
    if missing:
        return f"{len(missing)} recorded file(s) missing, e.g. {missing[0]}"
    if extra:
        return f"{len(extra)} file(s) not in {CHECKSUMS}, e.g. {extra[0]}"
    return None


def agreed_steps(where: str, listings: Sequence[Sequence[int]]) -> list[int]:
    """Pure: the steps (newest first) every process lists, from each process's own listing of
    ``where`` (orbax's all_steps is per process). Processes that list different steps would pair
    their collectives with other steps' or wait forever, so a difference raises CheckpointError
    (on every process, as for a step they see differently)."""
    lists = [sorted({int(s) for s in steps}, reverse=True) for steps in listings]
    if any(steps != lists[0] for steps in lists):
        seen = "; ".join(f"process {i}: {steps}" for i, steps in enumerate(lists))
        raise CheckpointError(
            f"the processes list different checkpoints in {where} ({seen}). That is a file-system "
            "problem (a cache that lags, a mount that differs), so the run stops without falling "
            "back or moving anything: make every process see the same files, then resume"
        )
    return lists[0]


RESTORED, REFUSED, FAILED = 0, 1, 2  # outcome codes of a restore on one process


def agreed_outcome(where: str, codes: Sequence[int], local: BaseException | None) -> BaseException | None:
    """Pure: the error this process raises after a restore of ``where`` (None when every process
    restored it). A process that failed raises its own error (``local``); the others raise one
    naming the processes that failed, of the same kind (a refused config, exit 2, or a failure,
    exit 1), so no process trains on while another stopped."""
    if all(c == RESTORED for c in codes):
        return None
    if local is not None:
        return local
    worst = max(codes)
    failed = [i for i, c in enumerate(codes) if c == worst]
    kind = RefusedConfigError if worst == REFUSED else CheckpointError
    return kind(
        f"checkpoint {where}: process(es) {failed} could not "
        f"{'resume with this config' if worst == REFUSED else 'restore it'} (their log says "
        "why), so this process stops too"
    )


def resume_verdict(reason: str | None, pending: bool, trust_unverified: bool) -> tuple[str | None, bool]:
    """Pure: (the verdict a resume takes on a step, whether to seal it now) from its agreed
    verification ``reason`` and whether any process sees it marked pending. A step without
    checksums (UNSEALED) that this code marked pending is what a crash between orbax's commit
    and the checksums leaves: not trusted. Unmarked, it was written without checksums (LEGACY):
    refused unless ``trust_unverified``, which seals it now and takes it."""
    if reason != UNSEALED or pending:
        return reason, False
    return (None, True) if trust_unverified else (LEGACY, False)


def no_intact_error(where: str, skipped: Sequence[tuple[int, str]]) -> CheckpointError | None:
    """Pure: with no intact step in ``where`` (``skipped``: each step, newest first, and why),
    the error that refuses to start over them, or None when the run starts from step 0: every
    step only lacks the checksums a crash kept it from getting (right after the first save)."""
    if all(why == UNSEALED for _, why in skipped):
        return None
    legacy = any(why == LEGACY for _, why in skipped)
    return CheckpointError(
        f"no intact checkpoint in {where}:\n  "
        + "\n  ".join(f"step {s}: {why}" for s, why in skipped)
        + "\nrefusing to start this run from scratch over them; move the directory away to do that"
        + (
            "; to resume a step written without checksums, add the override checkpoint.trust_unverified=true"
            if legacy
            else ""
        )
    )


def array_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """{dotted path: shape} of the arrays of a pytree (arrays, ShapeDtypeStructs or orbax's
    ArrayMetadata), named as orbax names them in a checkpoint (``inner_state.1.mu.embed.embedding``)."""

    def name(key: Any) -> str:
        for attr in ("name", "key", "idx"):
            if hasattr(key, attr):
                return str(getattr(key, attr))
        return str(key)

    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {".".join(name(k) for k in path): tuple(leaf.shape) for path, leaf in leaves}


def shape_differences(stored: dict[str, tuple[int, ...]], wanted: dict[str, tuple[int, ...]]) -> list[str]:
    """Pure: how the arrays a config makes (``wanted``) differ from a checkpoint's (``stored``),
    one line each (the first few of each kind), empty when they match."""
    only_stored = sorted(set(stored) - set(wanted))
    only_wanted = sorted(set(wanted) - set(stored))
    reshaped = sorted(k for k in set(stored) & set(wanted) if stored[k] != wanted[k])
    lines = [f"{k}: checkpoint has shape {stored[k]}, config makes {wanted[k]}" for k in reshaped[:3]]
    if only_stored:
        lines.append(f"{len(only_stored)} array(s) only in the checkpoint, e.g. {only_stored[0]}")
    if only_wanted:
        lines.append(f"{len(only_wanted)} array(s) only in the config's state, e.g. {only_wanted[0]}")
    return lines


def key_to_json(key: jax.Array) -> dict[str, Any]:
    """A typed PRNG key → JSON (its implementation name and raw uint32 words, exactly)."""
    data = np.asarray(jax.random.key_data(key))
    return {"impl": str(jax.random.key_impl(key)), "data": data.astype(np.uint32).tolist()}


def key_from_json(obj: dict[str, Any]) -> jax.Array:
    return jax.random.wrap_key_data(jax.numpy.asarray(np.asarray(obj["data"], dtype=np.uint32)), impl=obj["impl"])


def write_error_reason(error: BaseException) -> str:
    """The cause of a failed write in a few words: the OS error (strerror) when the error or one
    it was raised from carries one (tensorstore writes it as os_error_code='28' in its text),
    else the error's first line."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno:
            return os.strerror(seen.errno)
        code = re.search(r"os_error_code='(\d+)'", str(seen))
        if code:
            return os.strerror(int(code.group(1)))
        seen = seen.__cause__ or seen.__context__
    text = (str(error).splitlines() or [""])[0]
    return f"{type(error).__name__}: {text[:200]}"


def write_failed(step: int, reason: str, latest: int | None) -> str:
    """The error of a checkpoint whose write failed: it was not saved, and which one resumes."""
    return (
        f"writing checkpoint {step} failed ({reason}): it was not saved; the newest saved checkpoint is "
        f"{'none' if latest is None else latest}. Free space (or fix the cause) and run the same command "
        f"to {'start again' if latest is None else 'resume from it'}"
    )
