"""A run's checkpoints: one object, ``Checkpoints``, built once per run by ``trainer.loop.train``.

Layout (names in trainer.checkpointing.rules)::

    run_dir/checkpoints/<step>/params      parameters (orbax StandardSave: sharded arrays, any topology)
    run_dir/checkpoints/<step>/opt_state   optimizer state (same)
    run_dir/checkpoints/<step>/data        the loader state (dataloader.checkpoint, JSON)
    run_dir/checkpoints/<step>/meta        {"step", "rng", "data_sha256", "tokens", "config", "summary", ...} (JSON)
    run_dir/checkpoints/<step>/olmax_checksums.json   sha256 of every file of its items
    run_dir/checkpoints_pending/<step>     empty marker of an older olmax: saved, not sealed yet
    run_dir/checkpoints_rejected/<step>[.n] (+ .reason.txt)   steps a resume set aside as damaged

``<step>`` is the number of updates applied. orbax's CheckpointManager writes the steps and
applies the retention rules (``checkpoint.keep`` newest, plus every ``keep_period``-th).

API::

    ckpt = Checkpoints(run, cfg.checkpoint)   # run: the contract's RunDir, resolved by the command line
    ckpt.restore_latest(abstract_params, abstract_opt_state, check)  # (step, items) of the newest
                                           # intact step, or None: start fresh
    ckpt.restore_init_from(abstract_params, abstract_opt_state)      # (params, opt_state) of
                                           # checkpoint.init_from (another run's step), or None
    ckpt.save(step, params, opt_state, loader, meta)  # waits for the previous save, starts this one
    ckpt.wait()                            # every process: the last save committed (sealed before it)
    ckpt.close()
    ckpt.restore(step, ...)  ckpt.latest_step()  ckpt.step_dir(step)  ckpt.directory

Saving is asynchronous (the device → host copy happens before ``save`` returns, the write and the
seal in the background; ``async_save=false`` waits in ``save``); a step directory appears under
its final name only once complete and sealed, so a run killed mid-write restarts from the
previous one. Restoring takes target shardings, so a
checkpoint written by H processes restores onto any other mesh.

Integrity: orbax 0.12.8 records no checksum of the array data (tensorstore's crc32c covers only
the zarr3 shard index), so one flipped byte restores silently as other parameters. Hence the
hand-written part, *sealing*: the sha256 of every file of the step's items is recorded in
``olmax_checksums.json`` (unkeyed sha256 beside the files: it detects damage, not tampering by
whoever can write the run directory). A step is sealed in orbax's commit path
(``post_finalization_callback``: on the primary process, after every process has written its part
into orbax's temporary directory and before orbax renames it to ``<step>``, the commit), and the
checksum file is fsynced first, so a step never has its name without its checksums: a SIGKILL
before the rename leaves a temporary directory that orbax removes at the next start (the resume
takes the step before, which retention has not deleted: orbax deletes old steps only after the
commit), a SIGKILL after it leaves a sealed step the resume takes. The step-level commit record
orbax writes at the rename (COMMIT_RECORD) is the only part not covered; nothing restores from it.
No host reads the step back alone: each process hashes the files it wrote (orbax names them
per process: ``ocdbt.process_<h>/``, ``array_metadatas/process_<h>``) in orbax's own barrier
between the writes and the commit (``barrier_sync_fn``), all processes at once, and records them
beside the files; the seal on the primary takes those digests, hashes only the small files orbax
wrote at finalization (or a process's files that it did not record), and writes the one checksum
file (no collective may run in orbax's thread). The SIGTERM save's added wait is then one host's
share of the step plus the metadata (bench.restart_scale; bench/RESULTS.md). orbax's emergency
checkpointing (``experimental.emergency``: local copies on each host's own storage, replicated
across slices) is not used: it is experimental ("do not use without specific approval"), it
needs a second slice to hold the replica (stage 1 runs one), a spot VM's local storage goes
with the VM, and it has no commit hook for the seal. The processes agree before acting (trainer.checkpointing.rules):
on the list of steps, on each step's verdict, on each restore's outcome; processes that see a
shared file system differently stop the run rather than act on a step some of them see otherwise.
A step without checksums that an older olmax marked pending (it sealed after the commit, and died
between the two) is not trusted; one never marked was written without checksums at all. An intact
step whose arrays the config shapes otherwise (another model, skip_step toggled) is a config
mismatch, refused with the step left in place, never damage; so is a step the caller's ``check``
of its meta refuses, which runs once the meta and data files (tiny) match their checksums and
before any array file is hashed. Resuming takes the newest step whose files all match; each newer
step is logged with the reason and moved to ``checkpoints_rejected/`` (kept for inspection, out
of orbax's way). A step whose files match and that orbax still cannot restore stops the run, the
step left in place (a passing error must not cost steps). With no intact step, the run starts
from step 0 if the only problem was an older olmax's crash before the checksums (right after the
first save), and otherwise refuses to start rather than silently start over. A step written
without checksums (an older olmax) is refused unless ``checkpoint.trust_unverified``, which
records its checksums at resume and uses it.

Errors: CheckpointError (exit 1), RefusedConfigError and its ConfigMismatchError (exit 2).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from contract.rundir import RunDir
from dataloader import checkpoint as data_checkpoint
from trainer.checkpointing import files
from trainer.checkpointing.rules import (
    CHECKSUMS,
    ITEMS,
    LIGHT,
    UNSEALED,
    CheckpointError,
    ConfigMismatchError,
    RefusedConfigError,
    agreed_steps,
    key_from_json,
    key_to_json,
    no_intact_error,
    resume_verdict,
    write_error_reason,
    write_failed,
)
from trainer.config.schema import CheckpointConfig
from trainer.mesh import PyTree

# the object, its errors and the meta's PRNG key form (defined with the rules, pure)
__all__ = [
    "Checkpoints",
    "CheckpointError",
    "RefusedConfigError",
    "ConfigMismatchError",
    "key_to_json",
    "key_from_json",
]

log = logging.getLogger(__name__)
# the suffix of the temporary directory orbax writes a step into (<step><suffix>, renamed to
# <step> at the commit)
ORBAX_TMP_SUFFIX = ocp.path.atomicity_types.TMP_DIR_SUFFIX

Check = Callable[[int, dict[str, Any], dict[str, Any]], object]  # check(step, meta, data): raises to refuse


@jax.jit
def _all_finite(tree: PyTree) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


class Checkpoints:
    """The checkpoints of one run directory: save and seal, resume with verification, retention
    (orbax's keep rules; damaged steps moved aside), stage-2 initialisation. When to save is the
    caller's decision (``save(step)``). Every process constructs one and calls every method."""

    def __init__(self, run: RunDir, cfg: CheckpointConfig):
        if not run.path.is_absolute():  # orbax's paths are absolute: the command line resolves (RunDir.resolved)
            raise ValueError(f"Checkpoints({run}): a resolved run directory (RunDir.resolved), not a relative path")
        self.run = run
        self.directory = run.checkpoints
        self.cfg = cfg  # read by attribute: keep, keep_period, async_save, init_from, trust_unverified
        self._in_flight: int | None = None  # the step orbax is writing (sealed before its commit)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=cfg.keep,
            keep_period=cfg.keep_period,
            # always orbax's async path: only there does it call a hook between the writes and
            # the commit (post_finalization_callback); async_save=false waits in save instead
            enable_async_checkpointing=True,
            async_options=ocp.AsyncOptions(
                post_finalization_callback=self._seal_before_commit,
                barrier_sync_fn=self._hash_share_then_wait,
            ),
            cleanup_tmp_directories=True,  # leftovers of a run killed mid-write (or mid-seal)
            create=True,
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def step_dir(self, step: int) -> Path:
        return self.directory / str(step)

    # ------------------------------------------------------------------------- saving

    def save(self, step: int, params: PyTree, opt_state: PyTree, loader: Any, meta: dict[str, Any]) -> None:
        """Start an (async) save of ``step``, sealed before orbax commits it; first waits for the
        previous one. Refuses non-finite parameters (a diverged state must not push good
        checkpoints out of the keep window). With ``async_save=false`` it returns once ``step``
        is committed."""
        state = loader.state()
        if state["step"] != step or meta["step"] != step:
            raise RuntimeError(
                f"checkpoint {step}: loader is at step {state['step']}, meta says "
                f"{meta['step']}; the data position would not match the parameters"
            )
        if not bool(_all_finite(params)):
            raise CheckpointError(
                f"checkpoint {step}: refusing to save non-finite parameters "
                f"(the newest saved step is {self.latest_step()})"
            )
        self._finish()
        self._in_flight = step  # read by _seal_before_commit, in orbax's thread
        try:
            started = self.manager.save(
                step,
                force=True,
                args=ocp.args.Composite(
                    params=ocp.args.StandardSave(params),
                    opt_state=ocp.args.StandardSave(opt_state),
                    data=data_checkpoint.save_args(loader),
                    meta=ocp.args.JsonSave(meta),
                ),
            )
        except BaseException:
            self._in_flight = None
            raise
        if not started:
            self._in_flight = None
        if not self.cfg.async_save:
            self._finish()

    def wait(self) -> None:
        """Wait until the in-flight save is committed (all processes call this)."""
        self._finish()

    def close(self) -> None:
        """Wait for the in-flight save on a single process (on several, only ``wait`` checks
        the outcome: a close after an error on one process must not wait in a collective for
        the others)."""
        try:
            if jax.process_count() == 1:
                self._finish()
        finally:
            self.manager.close()

    def _tmp_dir(self, step: int) -> Path:
        return self.directory / f"{step}{ORBAX_TMP_SUFFIX}"

    def _hash_share_then_wait(self, *, key: str, timeout_ms: int) -> None:
        """orbax's barrier between the processes' writes and the commit (AsyncOptions'
        ``barrier_sync_fn``, called by every process in orbax's background thread once its own
        writes are done): first this process hashes the files it wrote (files.hash_share), so the
        seal on the primary reads none of them back. A share that cannot be recorded is logged
        and left to the seal, which then hashes those files itself (or, unreadable, fails the
        save): the barrier is always reached, so no process waits for one that gave up."""
        step = self._in_flight
        if step is not None and "async_write_complete" in key:
            try:
                files.hash_share(self._tmp_dir(step), jax.process_index())
            except Exception as e:  # noqa: BLE001 — the seal hashes these files instead
                log.warning(
                    "checkpoint %d: this process's checksums were not recorded (%s); the seal hashes them", step, e
                )
        ocp.multihost.get_barrier_sync_fn()(key=key, timeout_ms=timeout_ms)

    def _seal_before_commit(self) -> None:
        """orbax's post_finalization_callback: runs in orbax's background thread on the primary
        process, once every process has written its part of the step into orbax's temporary
        directory and before orbax renames that directory to the step's name (the commit).
        Sealing here means a step is never visible under its name without its checksums: a
        SIGKILL before the rename leaves a temporary directory (removed at the next start; the
        resume takes the step before), after it a sealed step. An error here (a file that
        cannot be read) keeps orbax from committing: the save fails (``_finish``)."""
        step = self._in_flight
        if step is None or jax.process_index() != 0:
            return
        tmp = self._tmp_dir(step)
        if not tmp.is_dir():  # orbax names its temporary directory otherwise: never commit unsealed
            raise CheckpointError(
                f"checkpoint {step}: orbax's temporary directory {tmp} is not there to be "
                "sealed before its commit (does this orbax version name it otherwise?)"
            )
        files.seal(tmp)

    def _finish(self) -> None:
        """Wait for the in-flight save to be committed (it is sealed by then). A failed save (a
        full disk: orbax raises its background error here; a file the seal could not read) is a
        CheckpointError saying so, on every process."""
        step, failure = self._in_flight, None
        try:
            self.manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001 — orbax and tensorstore raise many kinds
            failure = e
        if step is None:
            if failure is not None:
                raise failure
            return
        self._in_flight = None
        if failure is None and jax.process_index() == 0 and not (self.step_dir(step) / CHECKSUMS).is_file():
            failure = RuntimeError("orbax did not commit it")
        if bool(files.gather(np.uint8(failure is not None)).any()):
            reason = write_error_reason(failure) if failure else "on another process"
            raise CheckpointError(write_failed(step, reason, self.latest_step())) from failure
        if jax.process_index() == 0:
            files.fsync_dir(self.directory)  # the commit's rename, durable
        # a checkpoint is named by the updates done; metrics.jsonl and the console number the last one (0-based)
        log.info("checkpoint %d (after step %d) saved, sealed then committed, in %s", step, step - 1, self.directory)

    # ------------------------------------------------------------------------- resuming

    def restore_latest(
        self,
        abstract_params: PyTree,
        abstract_opt_state: PyTree,
        check: Check | None = None,
    ) -> tuple[int, dict[str, Any]] | None:
        """(step, restored items) of the newest intact step, or None when there is no step.

        The processes first agree on the steps (agreed_steps) and then take each step together,
        newest first. ``check(step, meta, data)``, when given, sees a step's meta and data items
        (small JSON) once their files match their checksums (a mismatch there is damage), before
        any array file is hashed or restored, and raises to refuse the resume (a changed config:
        nothing is moved, no array hashed; an error that is no CheckpointError is raised as a
        RefusedConfigError). Arrays the config shapes otherwise than the step stores raise
        ConfigMismatchError (nothing moved either), checked before they are restored. A file
        that cannot be read stops the run (CheckpointError, nothing moved).
        Only a step whose files fail their checksums (or are missing) is skipped: logged with the
        reason and moved to ``run_dir/checkpoints_rejected`` once an older step restores. A step
        whose checksums pass and that orbax still cannot restore stops the run (CheckpointError,
        the step left in place): a passing error (RESOURCE_EXHAUSTED, I/O) must not cost the
        steps since the older one. If no step is intact: None when every step only lacks its
        checksums (moved aside too), else CheckpointError (and nothing is moved).
        """
        skipped: list[tuple[int, str]] = []
        for step in self._agreed_steps():
            # meta and data are checked against their checksums first (they are tiny): a flipped
            # byte there ("step": 1000 → 1001) is damage, not a config the check would refuse
            reason = files.verify_step(self.step_dir(step), LIGHT)
            if reason in (None, UNSEALED):
                light = self._read_light(step)  # None (on every process) if any cannot read it
                if light is not None and check is not None:  # a refusal costs no hashing of arrays
                    files.agreed(
                        f"{step} in {self.directory}",
                        functools.partial(check, step, light["meta"], light["data"]),
                        lambda e: True,
                    )
                reason = self._verify(step)
            else:
                light = None
            if reason is None:
                restored = self._restore_verified(
                    step, abstract_params, abstract_opt_state, check if light is None else None
                )
                self._reject_all(skipped)
                return step, restored
            log.warning("checkpoint %d in %s is not intact, skipping it: %s", step, self.directory, reason)
            skipped.append((step, reason))
        refusal = no_intact_error(str(self.directory), skipped)
        if refusal is not None:
            raise refusal
        if skipped:  # only steps a crash left without checksums: the run starts from scratch
            log.warning("no checkpoint with checksums in %s: starting from step 0", self.directory)
        self._reject_all(skipped)
        return None

    def restore(self, step: int, abstract_params: PyTree, abstract_opt_state: PyTree) -> dict[str, Any]:
        """{"params", "opt_state", "data", "meta"} of ``step`` after verifying its checksums."""
        reason = files.verify_step(self.step_dir(step))
        if reason is not None:
            raise CheckpointError(f"checkpoint {self.step_dir(step)}: {reason}")
        return self._restore(step, abstract_params, abstract_opt_state)

    def _agreed_steps(self) -> list[int]:
        """The steps of the directory, newest first, as every process lists them (agreed_steps):
        each process's own listing, padded to the longest, gathered."""
        mine = sorted(self.manager.all_steps())
        width = int(files.gather(np.int32(len(mine))).max())
        row = np.full(1 + width, -1, np.int32)  # [count, steps..., -1 padding]
        row[0], row[1 : 1 + len(mine)] = len(mine), mine
        return agreed_steps(str(self.directory), [r[1 : 1 + r[0]].tolist() for r in files.gather(row)])

    def _verify(self, step: int) -> str | None:
        """verify_step, telling a step a crash left unsealed (UNSEALED) from one written without
        checksums (LEGACY; sealed now and trusted if checkpoint.trust_unverified: resume_verdict).
        UNSEALED is agreed, and so is the pending marker: no process sees a checksum file, so none
        is overwritten."""
        reason = files.verify_step(self.step_dir(step))
        pending = bool(files.gather(np.uint8((self.run.checkpoints_pending / str(step)).exists())).any())
        reason, seal = resume_verdict(reason, pending, self.cfg.trust_unverified)
        if seal:
            log.warning(
                "checkpoint %d has no checksums; trusting it and recording them now (checkpoint.trust_unverified=true)",
                step,
            )
            files.write_checksums(self.step_dir(step))
        return reason

    def _read_light(self, step: int) -> dict[str, Any] | None:
        """The meta and data items of ``step``, or None on every process if any cannot read them
        (then verification says what is wrong with the step)."""
        try:
            light = {item: files.restore_json(self.step_dir(step), item) for item in LIGHT}
        except Exception:  # noqa: BLE001 — orbax raises many kinds on a damaged step
            light = None
        return light if files.gather(np.uint8(light is not None)).all() else None

    def _restore_verified(
        self, step: int, abstract_params: PyTree, abstract_opt_state: PyTree, check: Check | None
    ) -> dict[str, Any]:
        """The items of a step whose checksums passed (``check`` first, when its meta and data
        could not be read before). Failing that, every process raises: ConfigMismatchError when
        the arrays the config makes differ from the stored ones, RefusedConfigError for a refusal
        by ``check``, else CheckpointError naming the step and the error (the step stays)."""

        def attempt() -> dict[str, Any]:
            # shapes first, from orbax's metadata: a restore that fails on them leaves reads in
            # flight that report to a closed event loop (tracebacks on stderr)
            differences = files.array_differences(self.step_dir(step), abstract_params, abstract_opt_state)
            if differences:
                raise ConfigMismatchError(
                    f"checkpoint {step} in {self.directory} holds other arrays than this config makes "
                    "(its model, model_overrides, optimizer or skip_step settings differ from the "
                    "checkpointed run's; the checkpoint is intact and stays where it is):\n  "
                    + "\n  ".join(differences)
                    + "\nresume with the checkpointed run's settings "
                    f"(in {self.step_dir(step) / 'meta'}), or use another run_dir"
                )
            try:
                restored = self._restore(step, abstract_params, abstract_opt_state)
            except Exception as e:
                raise CheckpointError(
                    f"checkpoint {step} in {self.directory}: its files match their checksums, but orbax "
                    f"cannot restore it ({type(e).__name__}: {e}). The step stays where it is: if the "
                    "error passes (RESOURCE_EXHAUSTED, an I/O error), resume again; if the step is "
                    f"really damaged, move {self.step_dir(step)} aside by hand to resume from the step "
                    "before it"
                ) from e
            if check is not None:
                try:
                    check(step, restored["meta"], restored["data"])
                except Exception as e:
                    raise RefusedConfigError(str(e)) from e
            return restored

        return files.agreed(f"{step} in {self.directory}", attempt, lambda e: isinstance(e, RefusedConfigError))

    def _restore(self, step: int, abstract_params: PyTree, abstract_opt_state: PyTree) -> dict[str, Any]:
        """{"params", "opt_state", "data", "meta"} of ``step``, arrays placed as the abstract trees say."""
        return files.restore_items(self.step_dir(step), abstract_params, abstract_opt_state)

    # ------------------------------------------------------------------------- setting steps aside

    def _reject_all(self, skipped: list[tuple[int, str]]) -> None:
        for step, reason in skipped:
            self._reject(step, reason)
        if skipped:
            self.manager.reload()

    def _reject(self, step: int, reason: str) -> None:
        """Move ``step`` to ``run_dir/checkpoints_rejected`` (process 0 moves it; every process
        learns the outcome, so an OSError there stops all of them rather than leave the others
        waiting in a barrier process 0 never reaches)."""

        def move() -> Path:
            target = self.run.checkpoints_rejected / str(step)
            n = 0
            while target.exists():
                n += 1
                target = self.run.checkpoints_rejected / f"{step}.{n}"
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.step_dir(step), target)
            (target.parent / f"{target.name}.reason.txt").write_text(reason + "\n")
            (self.run.checkpoints_pending / str(step)).unlink(missing_ok=True)
            return target

        target = files.agreed(
            f"{step} in {self.directory} (moving it aside)",
            move if jax.process_index() == 0 else (lambda: None),
            lambda e: False,
        )
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"checkpoint {step} rejected")
        log.warning("checkpoint %d set aside in %s (%s)", step, target or self.run.checkpoints_rejected, reason)

    # ------------------------------------------------------------------------- stage 2

    def restore_init_from(
        self,
        abstract_params: PyTree,
        abstract_opt_state: PyTree,
        check: Callable[[dict[str, Any]], object] | None = None,
    ) -> tuple[PyTree, PyTree] | None:
        """params and opt_state of ``checkpoint.init_from``, another run's step directory (stage
        2 starting from stage 1), or None when unset. Verified against its checksums (a step
        without any only with ``checkpoint.trust_unverified``; nothing is written into the other
        run's directory). ``check(meta)``, when given, sees the step's meta (verified) before any
        array is read, and raises to refuse it (a RefusedConfigError, exit 2, on every process)."""
        if not self.cfg.init_from:
            return None
        step_dir = Path(self.cfg.init_from).resolve()
        where = f"checkpoint.init_from={step_dir}"
        missing = [item for item in ("params", "opt_state") if not (step_dir / item).is_dir()]
        if files.gather(np.uint8(bool(missing))).any():  # the same answer on every process
            raise RefusedConfigError(
                f"{where}: no {missing or ['params', 'opt_state']} item there "
                f"(on {'this' if missing else 'another'} process; expected a step "
                "directory of a trainer run, e.g. RUN/checkpoints/1000)"
            )
        reason = files.verify_step(step_dir)
        if reason == UNSEALED and self.cfg.trust_unverified:
            log.warning("%s has no checksums; using it unverified (checkpoint.trust_unverified=true)", where)
        elif reason is not None:
            hint = "; to use it anyway, add the override checkpoint.trust_unverified=true" if reason == UNSEALED else ""
            raise CheckpointError(f"{where}: {reason}{hint}")

        if check is not None:  # the settings its run had, before any array is read
            files.agreed(where, lambda: check(files.restore_json(step_dir, "meta")), lambda e: True)

        def attempt() -> tuple[PyTree, PyTree]:
            differences = files.array_differences(step_dir, abstract_params, abstract_opt_state)  # shapes first
            if differences:
                raise ConfigMismatchError(
                    f"{where} holds other arrays than this config makes (its model, model_overrides, "
                    "optimizer or skip_step settings differ from that run's):\n  " + "\n  ".join(differences)
                )
            try:
                restored = files.restore_items(step_dir, abstract_params, abstract_opt_state, ("params", "opt_state"))
                return restored["params"], restored["opt_state"]
            except Exception as e:
                raise CheckpointError(f"{where}: orbax cannot restore it ({type(e).__name__}: {e})") from e

        params, opt_state = files.agreed(where, attempt, lambda e: isinstance(e, RefusedConfigError))
        log.info("initialised params and optimizer state from %s", step_dir)
        return params, opt_state
