"""Orbax checkpoints of a run: one step directory with items params, opt_state, data, meta.

    run_dir/checkpoints/<step>/params     parameters (StandardSave: sharded arrays, any topology)
    run_dir/checkpoints/<step>/opt_state  optimizer state (same)
    run_dir/checkpoints/<step>/data       the loader state (dataloader.checkpoint, JSON)
    run_dir/checkpoints/<step>/meta       {"step", "rng", "data_sha256", "tokens", ...} (JSON)

    run_dir/checkpoints/<step>/olmax_checksums.json   sha256 of every other file of the step

``<step>`` is the number of updates applied. Saving is asynchronous where orbax can (the device
→ host copy happens before ``save`` returns, the write in the background); a step directory
appears under its final name only once complete, so a run killed mid-write restarts from the
previous one. Restoring takes target shardings, so a checkpoint written by H processes
restores onto any other mesh.

Integrity: orbax 0.12.8 records no checksum of the array data (tensorstore's crc32c covers only
the zarr3 shard index), so one flipped byte restores silently as other parameters. Hence the
hand-written part: once a save is *committed* (the next ``save`` or ``wait``), the sha256 of
every file of the step (every item and orbax's metadata; no gather of sharded arrays) is
recorded in ``olmax_checksums.json`` ("sealing"; unkeyed sha256 beside the files: it detects damage, not
tampering by whoever can write the run directory); with H processes each hashes every H-th file. The processes agree
before acting (trainer.checkpoint_verdicts): on the list of steps, on each step's verdict, on
each restore's outcome; processes that see a shared file system differently stop the run rather
than act on a step some of them see otherwise. A step without that file (the run died between
the commit and the checksums; a marker in ``run_dir/checkpoints_pending`` tells this from a step
written without checksums at all) is not trusted. An intact step whose arrays the config shapes
otherwise (another model, skip_step toggled) is a config mismatch, refused with the step left
in place, never damage; so is a step the caller's ``check`` of its meta refuses, which runs
once the meta and data files (tiny) match their checksums and before any array file is hashed. Resuming takes the newest step whose files all match; each newer
step is logged with the reason and moved to ``run_dir/checkpoints_rejected/`` (kept for
inspection, out of orbax's way). A step whose files match and that orbax still cannot restore
stops the run, the step left in place (a passing error must not cost steps). With no intact
step, the run starts from step 0 if the only problem was a crash before the checksums (right
after the first save), and otherwise refuses to start rather than silently start over. A step
written without checksums (an older olmax) is refused unless ``checkpoint.trust_unverified``,
which records its checksums at resume and uses it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from dataloader import checkpoint as data_checkpoint
from trainer.checkpoint_verdicts import (  # noqa: F401 — re-exported: trainer.checkpoint's API
    CHECKSUMS, FAILED, LEGACY, REFUSED, RESTORED, UNSEALED, CheckpointError,
    ConfigMismatchError, RefusedConfigError, abstract_like, agreed_outcome, agreed_reason, agreed_steps,
    array_shapes, key_from_json, key_to_json, listing_reason, shape_differences, verdict_code,
    write_error_reason, write_failed)
from trainer.checkpoint_restore import ITEMS, LIGHT, array_differences, restore_items, restore_json
from trainer.config import CheckpointConfig

_REEXPORTED = (abstract_like, array_shapes, key_from_json, key_to_json, shape_differences)  # API defined elsewhere

log = logging.getLogger(__name__)

REJECTED = "checkpoints_rejected"
PENDING = "checkpoints_pending"  # run_dir/checkpoints_pending/<step>: saved by this code, not yet sealed


# ----------------------------------------------------------------------------- checksums

def step_files(step_dir: Path) -> list[str]:
    """Every file under ``step_dir`` as a sorted relative POSIX path, the checksum file (and its
    temporary) excluded."""
    out = []
    for root, _dirs, files in os.walk(step_dir):
        for name in files:
            rel = (Path(root) / name).relative_to(step_dir).as_posix()
            if not rel.startswith(CHECKSUMS):
                out.append(rel)
    return sorted(out)


def _sha256(path: Path) -> bytes:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").digest()


def file_digests(step_dir: Path, files: list[str]) -> list[str]:
    """sha256 (hex) of each file. With H processes, process h hashes files h, h+H, ... and all
    gather the rows, so every process gets every digest. A file that cannot be read is an agreed
    error, never a digest: every process raises CheckpointError (the one that failed naming the
    file), since a made-up digest would seal an intact step as damaged, or skip an intact step
    for a passing read error."""
    h, n_proc = jax.process_index(), jax.process_count()
    rows = np.zeros((len(files), hashlib.sha256().digest_size), np.uint8)
    failed = None
    for i in range(h, len(files), n_proc):
        try:
            rows[i] = np.frombuffer(_sha256(step_dir / files[i]), np.uint8)
        except OSError as e:
            failed = f"cannot read {files[i]} ({type(e).__name__}: {e})"
            break
    if n_proc > 1:
        rows = np.bitwise_or.reduce(np.asarray(multihost_utils.process_allgather(rows)), axis=0)
    flags = _gather(np.uint8(failed is not None))
    if flags.any():
        who = [i for i, f in enumerate(flags) if f]
        raise CheckpointError(f"checkpoint {step_dir}: " + (failed or f"process(es) {who} could not read its files")
                              + "; nothing is decided on a step whose files cannot be read (not sealed, not "
                              "skipped, nothing moved): make the files readable, then resume")
    return [row.tobytes().hex() for row in rows]


def write_checksums(step_dir: Path) -> None:
    """Record the sha256 of every file of a committed step (process 0 writes, atomically). Never
    over an existing checksum file (CheckpointError on every process if any process sees one):
    re-sealing a step would declare whatever is on disk now intact, damage included."""
    path = step_dir / CHECKSUMS
    if _gather(np.uint8(path.exists())).any():
        raise CheckpointError(f"checkpoint {step_dir}: refusing to overwrite its {CHECKSUMS} (a step's "
                              "checksums are recorded once, when it is saved)")
    files = step_files(step_dir)
    digests = file_digests(step_dir, files)

    def write() -> None:
        tmp = step_dir / f"{CHECKSUMS}.tmp"
        tmp.write_text(json.dumps({"algorithm": "sha256", "files": dict(zip(files, digests))}, indent=1))
        try:
            os.link(tmp, path)  # atomic and exclusive: fails if a checksum file appeared meanwhile
        except FileExistsError:
            raise CheckpointError(f"checkpoint {step_dir}: {CHECKSUMS} appeared while it was being sealed; "
                                  "refusing to overwrite it") from None
        except OSError:  # no hard links here (some FUSE mounts): the agreed check above must do
            os.replace(tmp, path)
        else:
            tmp.unlink()

    # every process learns whether process 0 could write it
    _agreed(str(step_dir), write if jax.process_index() == 0 else (lambda: None), lambda e: False)


def _gather(row: np.ndarray) -> np.ndarray:
    """``[process_count, *row.shape]``: every process's ``row`` (no collective for one process)."""
    if jax.process_count() == 1:
        return np.asarray(row)[None]
    return np.asarray(multihost_utils.process_allgather(row))


def _agreed(where: str, attempt: Callable[[], Any], refused: Callable[[Exception], bool]) -> Any:
    """``attempt()`` on every process, then one outcome for all (agreed_outcome): its value where
    it succeeded everywhere, else every process raises (``refused(e)``: a config refusal, exit 2).
    A local error that is no CheckpointError is raised as one (RefusedConfigError if refused),
    naming ``where`` and chained to it, so the trainer reports it instead of a traceback."""
    try:
        value, code, error = attempt(), RESTORED, None
    except Exception as e:  # noqa: BLE001 — classified, then raised on every process
        value, code, error = None, REFUSED if refused(e) else FAILED, e
        if not isinstance(e, CheckpointError):  # an OSError, a ValueError: a clear error, no traceback
            kind = RefusedConfigError if code == REFUSED else CheckpointError
            error = kind(f"checkpoint {where}: {type(e).__name__}: {e}")
            error.__cause__ = e
    stop = agreed_outcome(where, [int(c) for c in _gather(np.int32(code))], error)
    if stop is not None:
        raise stop
    return value


def _local_check(step_dir: Path) -> tuple[str | None, dict[str, str] | None, bytes]:
    """(reason, recorded digests, sha256 of the checksum file) from this process's view of the
    step's listing and checksum file; no file's content is hashed yet."""
    path = step_dir / CHECKSUMS
    if not path.is_file():
        return UNSEALED, None, b""
    try:
        raw = path.read_bytes()
        recorded = json.loads(raw)["files"]
        if not isinstance(recorded, dict) or not all(isinstance(v, str) for v in recorded.values()):
            raise ValueError("'files' is not a {path: sha256} mapping")
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{CHECKSUMS} is unreadable ({type(e).__name__}: {e})", None, b""
    reason = listing_reason(ITEMS, recorded, step_files(step_dir))
    if reason is not None:
        return reason, None, b""
    return None, recorded, hashlib.sha256(raw).digest()


def verify_step(step_dir: Path, items: tuple[str, ...] | None = None) -> str | None:
    """None if every file of the step matches its recorded sha256, else why not (one line). With
    several processes the verdict is agreed (agreed_reason): every process lists the step and reads
    its checksum file, a step they see differently stops the run (CheckpointError), and only a step
    all of them see whole has its files hashed (a collective, so all must reach it together);
    only the files of ``items`` (e.g. the small meta and data) when given."""
    reason, recorded, digest = _local_check(step_dir)
    row = np.zeros(1 + hashlib.sha256().digest_size, np.uint8)
    row[0] = verdict_code(reason)
    row[1:1 + len(digest)] = np.frombuffer(digest, np.uint8)
    rows = _gather(row)
    reason = agreed_reason(str(step_dir), reason, [int(r[0]) for r in rows], [r[1:].tobytes() for r in rows],
                           jax.process_index())
    if reason is not None:
        return reason
    names = sorted(n for n in recorded if items is None or n.split("/")[0] in items)
    bad = [n for n, d in zip(names, file_digests(step_dir, names)) if d != recorded[n]]
    if bad:
        return f"sha256 mismatch in {len(bad)} file(s), e.g. {bad[0]}"
    return None


@jax.jit
def _all_finite(tree: Any) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


class Checkpointer:
    """CheckpointManager wiring: when to save is the caller's decision (``save(step)``)."""

    def __init__(self, run_dir: str | Path, cfg: CheckpointConfig):
        self.run_dir = Path(run_dir).resolve()
        self.directory = self.run_dir / "checkpoints"
        self._unsealed: int | None = None  # committed (or in flight) but no checksums yet
        self.trust_unverified = cfg.trust_unverified
        options = ocp.CheckpointManagerOptions(
            max_to_keep=cfg.keep,
            keep_period=cfg.keep_period,
            enable_async_checkpointing=cfg.async_save,
            cleanup_tmp_directories=True,  # leftovers of a run killed mid-write
            create=True,
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def step_dir(self, step: int) -> Path:
        return self.directory / str(step)

    def save(self, step: int, params: Any, opt_state: Any, loader: Any, meta: dict[str, Any]) -> None:
        """Start an (async) save of ``step`` after sealing the previous one; refuses non-finite
        parameters (a diverged state must not push good checkpoints out of the keep window)."""
        state = loader.state()
        if state["step"] != step or meta["step"] != step:
            raise RuntimeError(f"checkpoint {step}: loader is at step {state['step']}, meta says "
                               f"{meta['step']}; the data position would not match the parameters")
        if not bool(_all_finite(params)):
            raise CheckpointError(f"checkpoint {step}: refusing to save non-finite parameters "
                                  f"(the newest saved step is {self.latest_step()})")
        self._seal()
        if jax.process_index() == 0:  # tells a crash between commit and checksums from a legacy step
            (self.run_dir / PENDING).mkdir(parents=True, exist_ok=True)
            (self.run_dir / PENDING / str(step)).touch()
        if self.manager.save(step, force=True, args=ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            opt_state=ocp.args.StandardSave(opt_state),
            data=data_checkpoint.save_args(loader),
            meta=ocp.args.JsonSave(meta),
        )):
            self._unsealed = step

    def _seal(self) -> None:
        """Wait for the in-flight save to commit, then record its checksums. A failed save (a full
        disk: orbax raises its background error here) is a CheckpointError saying so, on every process."""
        step, failure = self._unsealed, None
        try:
            self.manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001 — orbax and tensorstore raise many kinds
            failure = e
        if step is None:
            if failure is not None:
                raise failure
            return
        self._unsealed = None
        if failure is None and jax.process_index() == 0 and not self.step_dir(step).is_dir():
            failure = RuntimeError("orbax did not commit it")
        if bool(_gather(np.uint8(failure is not None)).any()):
            self._unmark(step)  # nothing of it under its name; orbax removes its partial files at the next start
            reason = write_error_reason(failure) if failure else "on another process"
            raise CheckpointError(write_failed(step, reason, self.latest_step())) from failure
        if jax.process_count() > 1:  # every process past its wait: the step directory is final
            multihost_utils.sync_global_devices(f"checkpoint {step} committed")
        try:
            write_checksums(self.step_dir(step))
        except CheckpointError as e:  # the safe option: stop, not train on past a step never sealed
            raise CheckpointError(
                f"checkpoint {step} was saved but its checksums could not be recorded, so the run stops "
                f"here. It stays marked pending in {self.run_dir / PENDING}: a resume skips it as unsealed "
                f"and takes the step before it ({e})") from e
        self._unmark(step)

    def _unmark(self, step: int) -> None:
        if jax.process_index() == 0:
            (self.run_dir / PENDING / str(step)).unlink(missing_ok=True)

    def _verify(self, step: int) -> str | None:
        """verify_step, telling a step a crash left unsealed (UNSEALED) from one written without
        checksums (LEGACY); the latter is sealed now and trusted if checkpoint.trust_unverified.
        UNSEALED is agreed: no process sees a checksum file, so none is overwritten."""
        reason = verify_step(self.step_dir(step))  # agreed among the processes
        pending = bool(_gather(np.uint8((self.run_dir / PENDING / str(step)).exists())).any())  # agreed too
        if reason != UNSEALED or pending:
            return reason
        if not self.trust_unverified:
            return LEGACY
        log.warning("checkpoint %d has no checksums; trusting it and recording them now "
                    "(checkpoint.trust_unverified=true)", step)
        write_checksums(self.step_dir(step))
        return None

    def restore_latest(self, abstract_params: Any, abstract_opt_state: Any,
                       check: Callable[[int, dict[str, Any], dict[str, Any]], Any] | None = None,
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
        skipped = []
        for step in self._agreed_steps():
            # meta and data are checked against their checksums first (they are tiny): a flipped
            # byte there ("step": 1000 → 1001) is damage, not a config the check would refuse
            reason = verify_step(self.step_dir(step), LIGHT)
            if reason in (None, UNSEALED):
                light = self._read_light(step)  # None (on every process) if any cannot read it
                if light is not None and check is not None:  # a refusal costs no hashing of arrays
                    _agreed(f"{step} in {self.directory}", lambda: check(step, light["meta"], light["data"]),
                            lambda e: True)
                reason = self._verify(step)
            else:
                light = None
            if reason is None:
                restored = self._restore_verified(step, abstract_params, abstract_opt_state,
                                                  check if light is None else None)
                self._reject_all(skipped)
                return step, restored
            log.warning("checkpoint %d in %s is not intact, skipping it: %s", step, self.directory, reason)
            skipped.append((step, reason))
        if any(why != UNSEALED for _, why in skipped):
            legacy = any(why == LEGACY for _, why in skipped)
            raise CheckpointError(
                f"no intact checkpoint in {self.directory}:\n  " +
                "\n  ".join(f"step {s}: {why}" for s, why in skipped) +
                "\nrefusing to start this run from scratch over them; move the directory away to do that" +
                ("; to resume a step written without checksums, add the override "
                 "checkpoint.trust_unverified=true" if legacy else ""))
        if skipped:  # only steps a crash left without checksums: the run starts from scratch
            log.warning("no checkpoint with checksums in %s: starting from step 0", self.directory)
        self._reject_all(skipped)
        return None

    def _agreed_steps(self) -> list[int]:
        """The steps of the directory, newest first, as every process lists them (agreed_steps):
        each process's own listing, padded to the longest, gathered."""
        mine = sorted(self.manager.all_steps())
        width = int(_gather(np.int32(len(mine))).max())
        row = np.full(1 + width, -1, np.int32)  # [count, steps..., -1 padding]
        row[0], row[1:1 + len(mine)] = len(mine), mine
        return agreed_steps(str(self.directory), [r[1:1 + r[0]].tolist() for r in _gather(row)])

    def _read_light(self, step: int) -> dict[str, Any] | None:
        """The meta and data items of ``step``, or None on every process if any cannot read them
        (then verification says what is wrong with the step)."""
        try:
            light = {item: restore_json(self.step_dir(step), item) for item in LIGHT}
        except Exception:  # noqa: BLE001 — orbax raises many kinds on a damaged step
            light = None
        return light if _gather(np.uint8(light is not None)).all() else None

    def _restore_verified(self, step: int, abstract_params: Any, abstract_opt_state: Any,
                          check: Callable[..., Any] | None) -> dict[str, Any]:
        """The items of a step whose checksums passed (``check`` first, when its meta and data
        could not be read before). Failing that, every process raises: ConfigMismatchError when
        the arrays the config makes differ from the stored ones, RefusedConfigError for a refusal
        by ``check``, else CheckpointError naming the step and the error (the step stays)."""
        def attempt() -> dict[str, Any]:
            # shapes first, from orbax's metadata: a restore that fails on them leaves reads in
            # flight that report to a closed event loop (tracebacks on stderr)
            differences = array_differences(self.step_dir(step), abstract_params, abstract_opt_state)
            if differences:
                raise ConfigMismatchError(
                    f"checkpoint {step} in {self.directory} holds other arrays than this config makes "
                    "(its model, model_overrides, optimizer or skip_step settings differ from the "
                    "checkpointed run's; the checkpoint is intact and stays where it is):\n  " +
                    "\n  ".join(differences) + "\nresume with the checkpointed run's settings "
                    f"(in {self.step_dir(step) / 'meta'}), or use another run_dir")
            try:
                restored = self._restore(step, abstract_params, abstract_opt_state)
            except Exception as e:  # noqa: BLE001 — orbax raises many kinds
                raise CheckpointError(
                    f"checkpoint {step} in {self.directory}: its files match their checksums, but orbax "
                    f"cannot restore it ({type(e).__name__}: {e}). The step stays where it is: if the "
                    "error passes (RESOURCE_EXHAUSTED, an I/O error), resume again; if the step is "
                    f"really damaged, move {self.step_dir(step)} aside by hand to resume from the step "
                    "before it") from e
            if check is not None:
                try:
                    check(step, restored["meta"], restored["data"])
                except Exception as e:  # noqa: BLE001 — a refusal: exit 2 on every process
                    raise RefusedConfigError(str(e)) from e
            return restored

        return _agreed(f"{step} in {self.directory}", attempt,
                       lambda e: isinstance(e, RefusedConfigError))

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
            target = self.run_dir / REJECTED / str(step)
            n = 0
            while target.exists():
                n += 1
                target = self.run_dir / REJECTED / f"{step}.{n}"
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.step_dir(step), target)
            (target.parent / f"{target.name}.reason.txt").write_text(reason + "\n")
            (self.run_dir / PENDING / str(step)).unlink(missing_ok=True)
            return target

        target = _agreed(f"{step} in {self.directory} (moving it aside)",
                         move if jax.process_index() == 0 else (lambda: None), lambda e: False)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"checkpoint {step} rejected")
        log.warning("checkpoint %d set aside in %s (%s)", step, target or self.run_dir / REJECTED, reason)

    def restore(self, step: int, abstract_params: Any, abstract_opt_state: Any) -> dict[str, Any]:
        """{"params", "opt_state", "data", "meta"} of ``step`` after verifying its checksums."""
        reason = verify_step(self.step_dir(step))
        if reason is not None:
            raise CheckpointError(f"checkpoint {self.step_dir(step)}: {reason}")
        return self._restore(step, abstract_params, abstract_opt_state)

    def _restore(self, step: int, abstract_params: Any, abstract_opt_state: Any) -> dict[str, Any]:
        """{"params", "opt_state", "data", "meta"} of ``step``, arrays placed as the abstract trees say."""
        return restore_items(self.step_dir(step), abstract_params, abstract_opt_state)

    def wait(self) -> None:
        """Wait for the in-flight save and record its checksums (all processes call this)."""
        self._seal()

    def close(self) -> None:
        """Seal the in-flight save on a single process (on several, only ``wait`` seals: a close
        after an error on one process must not wait in a collective for the others)."""
        try:
            if jax.process_count() == 1:
                self._seal()
        finally:
            self.manager.close()


def restore_model_state(step_dir: str | Path, abstract_params: Any, abstract_opt_state: Any,
                        trust_unverified: bool = False) -> tuple[Any, Any]:
    """params and opt_state of another run's step directory (stage 2 starting from stage 1),
    verified against its checksums (a step without any only with ``trust_unverified``; nothing
    is written into the other run's directory)."""
    step_dir = Path(step_dir).resolve()
    where = f"checkpoint.init_from={step_dir}"
    missing = [item for item in ("params", "opt_state") if not (step_dir / item).is_dir()]
    if _gather(np.uint8(bool(missing))).any():  # the same answer on every process
        raise RefusedConfigError(f"{where}: no {missing or ['params', 'opt_state']} item there "
                                 f"(on {'this' if missing else 'another'} process; expected a step "
                                 "directory of a trainer run, e.g. RUN/checkpoints/1000)")
    reason = verify_step(step_dir)
    if reason == UNSEALED and trust_unverified:
        log.warning("%s has no checksums; using it unverified (checkpoint.trust_unverified=true)", where)
    elif reason is not None:
        hint = "; to use it anyway, add the override checkpoint.trust_unverified=true" if reason == UNSEALED else ""
        raise CheckpointError(f"{where}: {reason}{hint}")

    def attempt() -> tuple[Any, Any]:
        differences = array_differences(step_dir, abstract_params, abstract_opt_state)  # shapes first
        if differences:
            raise ConfigMismatchError(
                f"{where} holds other arrays than this config makes (its model, model_overrides, "
                "optimizer or skip_step settings differ from that run's):\n  " + "\n  ".join(differences))
        try:
            restored = restore_items(step_dir, abstract_params, abstract_opt_state, ("params", "opt_state"))
            return restored["params"], restored["opt_state"]
        except Exception as e:  # noqa: BLE001 — orbax raises many kinds
            raise CheckpointError(f"{where}: orbax cannot restore it ({type(e).__name__}: {e})") from e

    params, opt_state = _agreed(where, attempt, lambda e: isinstance(e, RefusedConfigError))
    log.info("initialised params and optimizer state from %s", step_dir)
    return params, opt_state
