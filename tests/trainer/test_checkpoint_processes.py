"""Checkpoints with several processes: they agree on the step list, each step's verdict and each
restore's outcome, or the run stops with nothing moved; no orbax barrier a failing process could skip.
One real process; a second one is faked through the verdicts' gather."""

from __future__ import annotations

import numpy as np
import pytest

from contract.rundir import RunDir
from tests.trainer.checkpoint_fixtures import (
    Loader,
    abstract,
    assert_bitwise_equal,
    flip_byte,
    params_data_files,
    saved,
)
from trainer.checkpointing import checkpoints as checkpoint
from trainer.checkpointing import files, rules
from trainer.checkpointing.checkpoints import Checkpoints
from trainer.config.schema import CheckpointConfig


def test_the_processes_agree_on_a_restore_outcome_or_all_stop():
    agreed, R, C, F = rules.agreed_outcome, rules.RESTORED, rules.REFUSED, rules.FAILED
    assert agreed("10", [R, R, R], None) is None
    mine = checkpoint.CheckpointError("mine")
    assert agreed("10", [R, F], mine) is mine  # a process that failed raises its own error
    other = agreed("10", [R, F, F], None)  # the others stop too, naming who failed, of the same kind
    assert type(other) is checkpoint.CheckpointError and "process(es) [1, 2] could not restore it" in str(other)
    refused = agreed("10", [C, R], None)
    assert isinstance(refused, checkpoint.RefusedConfigError) and "[0] could not resume with this config" in str(
        refused
    )


def test_the_processes_agree_on_a_verdict_or_the_run_stops():
    agreed, U, D = rules.agreed_reason, rules.UNSEALED, "sha256 mismatch in 1 file(s), e.g. x"
    I, N, X = rules.INTACT, rules.UNSEALED_CODE, rules.DAMAGED  # noqa: E741 - one letter a code: the cases align
    same = [b"c" * 32] * 3
    assert agreed("s/10", None, [I, I, I], same, 1) is None
    assert agreed("s/10", U, [N, N], [b"", b""], 0) == U  # unsealed only where no process sees checksums
    assert agreed("s/10", D, [X, X], [b"", b""], 1) == D
    # any disagreement is a file-system problem: every process stops, naming what each saw
    for codes, local in (([I, X, I], None), ([I, N, I], None), ([N, X], U), ([N, I], U)):
        with pytest.raises(
            checkpoint.CheckpointError, match="checkpoint s/10: the processes see this step differently"
        ) as e:
            agreed("s/10", local, codes, [b"c" * 32 if c == I else b"" for c in codes], 0)
        for i, c in enumerate(codes):
            assert f"process {i}: {rules.CODE_NAMES[c]}" in str(e.value)
    with pytest.raises(checkpoint.CheckpointError, match="see this step differently"):  # other checksum files
        agreed("s/10", None, [I, I], [b"a" * 32, b"b" * 32], 0)


def _second_process(monkeypatch, sees):
    """One real process; _gather adds a second one whose verdict row for a step is ``sees(step,
    row)`` (its other rows: the same as this process's)."""
    real_gather, real_local, current = files.gather, files._local_check, [None]

    def local_check(step_dir):
        current[0] = int(step_dir.name)
        return real_local(step_dir)

    def two_processes(row):
        mine = real_gather(row)
        if row.dtype == np.uint8 and row.ndim == 1 and row.size > 1:  # a verdict row
            return np.concatenate([mine, sees(current[0], row)[None]])
        return np.concatenate([mine, mine])

    monkeypatch.setattr(files, "gather", two_processes)
    monkeypatch.setattr(files, "_local_check", local_check)


@pytest.mark.parametrize("other", ["damaged", "unsealed"])
def test_a_step_another_process_sees_otherwise_stops_the_run_and_moves_nothing(tmp_path, monkeypatch, other):
    ckpt, params, opt_state = saved(tmp_path, [5, 10])
    ckpt.close()

    def sees(step, row):
        theirs = row.copy()
        if step == 10:
            theirs[:] = 0
            theirs[0] = rules.DAMAGED if other == "damaged" else rules.UNSEALED_CODE
        return theirs

    _second_process(monkeypatch, sees)
    assert files.verify_step(tmp_path / "checkpoints" / "5") is None
    resumed = Checkpoints(RunDir(tmp_path), CheckpointConfig(keep=None))
    with pytest.raises(
        checkpoint.CheckpointError,
        match=r"checkpoint .*10: the processes see this step differently "
        rf"\(process 0: intact .*, process 1: {'damaged' if other == 'damaged' else 'no olmax'}",
    ):
        resumed.restore_latest(abstract(params), abstract(opt_state))
    resumed.close()
    assert resumed.manager.all_steps() == [5, 10] and not (tmp_path / rules.REJECTED).exists()


def test_a_damaged_step_is_never_resealed_when_one_process_misses_its_checksum_file(tmp_path, monkeypatch):
    # the reviewer's reproduction: step 10 edited on disk, a second process that (cache lag) sees no
    # checksum file, and trust_unverified: step 10 must not be re-sealed and resumed as intact
    ckpt, params, opt_state = saved(tmp_path, [5, 10])
    ckpt.close()
    step_dir = tmp_path / "checkpoints" / "10"
    flip_byte(params_data_files(step_dir)[0])
    sealed = (step_dir / rules.CHECKSUMS).read_bytes()
    assert "sha256 mismatch" in files.verify_step(step_dir)

    def sees(step, row):
        return np.zeros_like(row) + np.uint8(rules.UNSEALED_CODE) * (np.arange(row.size) == 0)

    with monkeypatch.context() as m:
        _second_process(m, sees)
        trusting = Checkpoints(RunDir(tmp_path), CheckpointConfig(keep=None, trust_unverified=True))
        with pytest.raises(checkpoint.CheckpointError, match="10: the processes see this step differently"):
            trusting.restore_latest(abstract(params), abstract(opt_state))
        trusting.close()
    assert (step_dir / rules.CHECKSUMS).read_bytes() == sealed
    assert "sha256 mismatch" in files.verify_step(step_dir)
    assert not (tmp_path / rules.REJECTED).exists()


def test_the_processes_agree_on_the_list_of_steps_or_the_run_stops():
    assert rules.agreed_steps("ck", [[5, 10], [10, 5]]) == [10, 5]
    assert rules.agreed_steps("ck", [[]]) == []
    with pytest.raises(
        checkpoint.CheckpointError,
        match=r"list different checkpoints in ck \(process 0: \[10, 5\]; "
        r"process 1: \[5\]\)",
    ):
        rules.agreed_steps("ck", [[5, 10], [5]])


def test_a_process_listing_other_steps_stops_the_run_before_any_step_is_verified(tmp_path, monkeypatch):
    ckpt, params, opt_state = saved(tmp_path, [5, 10])
    ckpt.close()
    real_gather, calls = files.gather, []

    def lagging_second_process(row):  # it does not list step 10 yet
        calls.append(row)
        mine = real_gather(row)
        if len(calls) == 2:  # the listing: [count, steps..., padding]
            theirs = np.full_like(row, -1)
            theirs[0], theirs[1] = 1, 5
            return np.concatenate([mine, theirs[None]])
        return np.concatenate([mine, mine])

    monkeypatch.setattr(files, "gather", lagging_second_process)
    monkeypatch.setattr(files, "_sha256", lambda path: pytest.fail(f"hashed {path}"))
    again = Checkpoints(RunDir(tmp_path), CheckpointConfig(keep=None))
    with pytest.raises(checkpoint.CheckpointError, match=r"process 0: \[10, 5\]; process 1: \[5\]"):
        again.restore_latest(abstract(params), abstract(opt_state), lambda *a: pytest.fail("checked a step"))
    again.close()
    assert len(calls) == 2 and calls[1].tolist() == [2, 5, 10]
    assert again.manager.all_steps() == [5, 10] and not (tmp_path / rules.REJECTED).exists()


def test_a_restore_attempt_reaches_no_orbax_barrier_only_the_agreed_outcome(tmp_path, monkeypatch):
    # orbax's restore ends in a barrier; a process whose restore raised skips it and waits in the
    # outcome's gather while the others wait in the barrier: a hang. The items' handlers have none.
    from orbax.checkpoint._src.multihost import multihost as orbax_multihost

    ckpt, params, opt_state = saved(tmp_path, [5])
    ckpt.close()
    barriers = []
    real_sync = orbax_multihost.sync_global_processes
    monkeypatch.setattr(
        orbax_multihost, "sync_global_processes", lambda name, **kw: (barriers.append(name), real_sync(name, **kw))[1]
    )
    again = Checkpoints(RunDir(tmp_path), CheckpointConfig(keep=None))
    stage2 = Checkpoints(RunDir(tmp_path / "stage2"), CheckpointConfig(init_from=str(tmp_path / "checkpoints" / "5")))
    barriers.clear()
    step, restored = again.restore_latest(abstract(params), abstract(opt_state), lambda *a: None)
    p2, o2 = stage2.restore_init_from(abstract(params), abstract(opt_state))
    assert barriers == []
    again.close()
    stage2.close()
    assert step == 5 and restored["meta"] == {"step": 5} and restored["data"] == Loader(5).state()
    for tree in (restored["params"], p2):
        assert_bitwise_equal(tree, params)
    for tree in (restored["opt_state"], o2):
        assert_bitwise_equal(tree, opt_state)
