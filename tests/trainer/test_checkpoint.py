"""Checkpoints: orbax round trips (bitwise), stage-2 initialisation, the run logs' restart rules, and
integrity (checksums, damaged steps skipped or refused, restore errors, what is never written)."""

from __future__ import annotations

import errno
import json
import re
from pathlib import Path

import jax
import numpy as np
import pytest

from contract.rundir import RunDir
from tests.trainer.checkpoint_fixtures import (
    Loader,
    abstract,
    assert_bitwise_equal,
    failing_read,
    flip_byte,
    init_from,
    legacy_step,
    make_state,
    params_data_files,
    saved,
)
from trainer import logs, optim
from trainer.checkpointing import checkpoints as checkpoint
from trainer.checkpointing import files, rules
from trainer.checkpointing.checkpoints import Checkpoints, key_from_json, key_to_json
from trainer.config.schema import CheckpointConfig, load_config


def test_checkpoint_round_trip_is_bitwise_with_rng_and_data_position(tmp_path):
    params, opt_state = make_state()
    rng = jax.random.split(jax.random.key(3))[1]
    meta = {"step": 5, "rng": key_to_json(rng), "data_sha256": "ab" * 32}
    ckpt = Checkpoints(RunDir(tmp_path), CheckpointConfig(keep=2))
    for step in (5, 10, 15):
        ckpt.save(step, params, opt_state, Loader(step), {**meta, "step": step})
    ckpt.wait()
    assert ckpt.manager.all_steps() == [10, 15]  # keep policy
    restored = ckpt.restore(15, abstract(params), abstract(opt_state))
    ckpt.close()
    assert_bitwise_equal(restored["params"], params)
    assert_bitwise_equal(restored["opt_state"], opt_state)
    assert restored["data"]["step"] == restored["meta"]["step"] == 15
    back = key_from_json(json.loads(json.dumps(restored["meta"]["rng"])))
    assert np.array_equal(jax.random.key_data(back), jax.random.key_data(rng))
    assert np.array_equal(jax.random.normal(back, (3,)), jax.random.normal(rng, (3,)))


def test_checkpoint_refuses_a_data_position_that_does_not_match_the_step(tmp_path):
    params, opt_state = make_state()
    ckpt = Checkpoints(RunDir(tmp_path), CheckpointConfig())
    with pytest.raises(RuntimeError, match="data position would not match"):
        ckpt.save(4, params, opt_state, Loader(3), {"step": 4})
    ckpt.close()


def test_stage2_starts_from_a_stage1_step_with_its_optimizer_state(tmp_path):
    params, opt_state = make_state(seed=1)
    ckpt = Checkpoints(RunDir(tmp_path / "stage1"), CheckpointConfig())
    ckpt.save(1000, params, opt_state, Loader(1000), {"step": 1000})
    ckpt.wait()
    ckpt.close()
    p, o = init_from(
        tmp_path / "stage2", tmp_path / "stage1" / "checkpoints" / "1000", abstract(params), abstract(opt_state)
    )
    assert_bitwise_equal(p, params)
    assert_bitwise_equal(o, opt_state)
    assert int(o.inner_state[1].count) == 1  # Adam's bias-correction count carries over
    with pytest.raises(checkpoint.RefusedConfigError, match="init_from=.*stage1: no .*params.*opt_state"):
        init_from(tmp_path / "stage2", tmp_path / "stage1", abstract(params), abstract(opt_state))


def test_restart_cuts_logs_back_to_the_checkpoint_and_drops_a_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        "".join(json.dumps({"step": s, "loss": 1.0 / (s + 1)}) + "\n" for s in range(7)) + '{"step": 7, "lo'
    )
    writer = logs.JsonlWriter(path, before_step=4)
    writer.write({"step": 4, "loss": 0.5})
    writer.close()
    assert [r["step"] for r in logs.read_jsonl(path)] == [0, 1, 2, 3, 4]


def test_params_sha256_sees_every_bit_and_the_layout():
    params, _ = make_state()
    base = logs.params_sha256(params)
    assert base == logs.params_sha256(jax.tree.map(np.array, params))
    flipped = np.array(params["lm_head"]["kernel"])
    flipped.view(np.uint32)[1, 2] ^= 1  # one mantissa bit
    assert logs.params_sha256({**params, "lm_head": {"kernel": flipped}}) != base
    assert logs.params_sha256({**params, "lm_head": {"kernel": flipped.reshape(7, 3)}}) != logs.params_sha256(
        {**params, "lm_head": {"kernel": flipped}}
    )


def test_a_flipped_byte_or_other_damage_in_any_file_of_a_step_is_detected(tmp_path):
    ckpt, params, opt_state = saved(tmp_path, [5])
    ckpt.close()
    step_dir = tmp_path / "checkpoints" / "5"
    assert files.verify_step(step_dir) is None
    names = files.step_files(step_dir)
    assert {f.split("/")[0] for f in names} >= set(rules.ITEMS)  # every item is covered
    for rel in names:  # one flipped byte anywhere: params, opt_state, data, meta, orbax metadata
        path = step_dir / rel
        original = path.read_bytes()
        if not original:
            continue
        flip_byte(path)
        reason = files.verify_step(step_dir)
        path.write_bytes(original)
        assert reason is not None and "sha256 mismatch" in reason and rel in reason, (rel, reason)
    victim = params_data_files(step_dir)[0]
    original = victim.read_bytes()
    victim.write_bytes(original[:-1])  # truncated
    assert "sha256 mismatch" in files.verify_step(step_dir)
    victim.unlink()
    assert "missing" in files.verify_step(step_dir)
    victim.write_bytes(original)
    (step_dir / "params" / "stray").write_text("x")
    assert "not in" in files.verify_step(step_dir)
    (step_dir / "params" / "stray").unlink()
    (step_dir / rules.CHECKSUMS).write_text('{"files": [')
    assert "unreadable" in files.verify_step(step_dir)


def test_restore_refuses_a_step_whose_parameters_changed_by_one_byte(tmp_path):
    ckpt, params, opt_state = saved(tmp_path, [5])
    step_dir = tmp_path / "checkpoints" / "5"
    flip_byte(params_data_files(step_dir)[0])
    with pytest.raises(checkpoint.CheckpointError, match="sha256 mismatch"):
        ckpt.restore(5, abstract(params), abstract(opt_state))
    ckpt.close()
    with pytest.raises(checkpoint.CheckpointError, match="init_from.*sha256 mismatch"):
        init_from(tmp_path / "stage2", step_dir, abstract(params), abstract(opt_state))


def test_resume_falls_back_to_the_newest_intact_step_and_sets_damaged_ones_aside(tmp_path, caplog):
    ckpt, params, opt_state = saved(tmp_path, [5, 10, 15])
    ckpt.close()
    flip_byte(params_data_files(tmp_path / "checkpoints" / "15")[0])
    # An older olmax killed after orbax committed step 20 but before its checksums were written.
    legacy_step(tmp_path, 20, params, opt_state, pending=True)
    assert (tmp_path / "checkpoints" / "20" / "params").is_dir()
    assert not (tmp_path / "checkpoints" / "20" / rules.CHECKSUMS).exists()

    resumed = Checkpoints(RunDir(tmp_path), CheckpointConfig(keep=None))
    with caplog.at_level("WARNING"):
        step, restored = resumed.restore_latest(abstract(params), abstract(opt_state))
    assert step == 10 and restored["meta"]["step"] == 10
    assert_bitwise_equal(restored["params"], params)
    assert_bitwise_equal(restored["opt_state"], opt_state)
    log_text = caplog.text
    assert "checkpoint 20" in log_text and "no olmax_checksums.json" in log_text
    assert "checkpoint 15" in log_text and "sha256 mismatch" in log_text
    rejected = tmp_path / rules.REJECTED
    assert sorted(p.name for p in rejected.iterdir()) == ["15", "15.reason.txt", "20", "20.reason.txt"]
    assert "sha256 mismatch" in (rejected / "15.reason.txt").read_text()
    assert resumed.manager.all_steps() == [5, 10]
    resumed.save(15, params, opt_state, Loader(15), {"step": 15})  # the run carries on past 15 again
    resumed.wait()
    assert files.verify_step(tmp_path / "checkpoints" / "15") is None
    resumed.close()


@pytest.mark.parametrize("damage", ["emptied", "unrestorable"])
def test_a_step_its_checksums_cannot_vouch_for_is_skipped_but_a_verified_one_that_fails_stops_the_run(
    tmp_path, caplog, damage
):
    # emptied: everything gone but a checksum file that lists no files (it vouches for nothing),
    # so the older step is taken; unrestorable: damaged before its checksums were recorded, so
    # they match and orbax still fails: that could as well be a passing error, so the run stops
    # and the step stays where it is (moving it aside is the user's decision)
    import shutil

    ckpt, params, opt_state = saved(tmp_path, [5, 10])
    ckpt.close()
    step_dir = tmp_path / "checkpoints" / "10"
    resumed = Checkpoints(RunDir(tmp_path), CheckpointConfig(keep=None))
    if damage == "emptied":
        for p in list(step_dir.iterdir()):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        (step_dir / rules.CHECKSUMS).write_text(json.dumps({"algorithm": "sha256", "files": {}}))
        assert "records no file of item(s) params, opt_state, data, meta" in files.verify_step(step_dir)
        with caplog.at_level("WARNING"):
            step, restored = resumed.restore_latest(abstract(params), abstract(opt_state))
        resumed.close()
        assert step == 5 and restored["meta"]["step"] == 5
        assert "checkpoint 10" in caplog.text and "records no file" in caplog.text
        assert "records no file" in (tmp_path / rules.REJECTED / "10.reason.txt").read_text()
        return
    meta_files = [p for p in (step_dir / "meta").iterdir() if p.is_file() and p.name != "commit_success.txt"]
    for p in meta_files:
        p.write_bytes(b"\x00not json")
    (step_dir / rules.CHECKSUMS).unlink()
    files.write_checksums(step_dir)
    assert files.verify_step(step_dir) is None
    with pytest.raises(
        checkpoint.CheckpointError,
        match=r"(?s)checkpoint 10 .*match their checksums, but orbax "
        r"cannot restore it .*move .*10 aside by hand",
    ) as e:
        resumed.restore_latest(abstract(params), abstract(opt_state))
    resumed.close()
    assert not isinstance(e.value, checkpoint.RefusedConfigError)
    assert resumed.manager.all_steps() == [5, 10] and not (tmp_path / rules.REJECTED).exists()


def test_a_passing_restore_error_on_a_verified_step_stops_the_run_and_loses_no_step(tmp_path, monkeypatch):
    # RESOURCE_EXHAUSTED (or an I/O hiccup) while restoring the newest step: no fallback to the
    # older one, nothing moved; the same run resumes the newest step once the error has passed
    ckpt, params, opt_state = saved(tmp_path, [5, 10])
    ckpt.close()
    again = Checkpoints(RunDir(tmp_path), CheckpointConfig(keep=None))
    real_restore = Checkpoints._restore

    def exhausted(self, step, *args):
        raise RuntimeError("RESOURCE_EXHAUSTED: out of memory while trying to allocate 84.00GiB")

    monkeypatch.setattr(Checkpoints, "_restore", exhausted)
    with pytest.raises(checkpoint.CheckpointError, match="checkpoint 10 .*RESOURCE_EXHAUSTED.*stays where it is"):
        again.restore_latest(abstract(params), abstract(opt_state))
    assert again.manager.all_steps() == [5, 10] and not (tmp_path / rules.REJECTED).exists()
    monkeypatch.setattr(Checkpoints, "_restore", real_restore)
    step, _ = again.restore_latest(abstract(params), abstract(opt_state))
    again.close()
    assert step == 10


def test_a_config_refused_on_the_meta_is_refused_before_any_array_file_is_hashed_and_nothing_moves(
    tmp_path, monkeypatch
):
    ckpt, params, opt_state = saved(tmp_path, [5, 10])
    ckpt.close()
    seen, hashed = [], []
    real_sha256 = files._sha256

    def only_meta_and_data(path):  # a 7B step is ~84 GB: a refused config must not read it all first
        rel = path.relative_to(tmp_path / "checkpoints" / "10").parts[0]
        if rel not in ("meta", "data"):
            pytest.fail(f"hashed {path} before refusing")
        hashed.append(rel)
        return real_sha256(path)

    monkeypatch.setattr(files, "_sha256", only_meta_and_data)

    def refuse(step, meta, data):
        seen.append((step, meta["step"], data["step"]))
        raise RuntimeError("settings differ")

    again = Checkpoints(RunDir(tmp_path), CheckpointConfig(keep=None))
    # abstract trees that could not even be restored: the refusal comes first, from the meta
    with pytest.raises(RuntimeError, match="settings differ"):
        again.restore_latest(None, None, refuse)
    again.close()
    assert seen == [(10, 10, 10)] and set(hashed) == {"meta", "data"}
    assert again.manager.all_steps() == [5, 10] and not (tmp_path / rules.REJECTED).exists()


@pytest.mark.parametrize("change", ["param_shape", "optimizer_structure"])
def test_arrays_shaped_otherwise_by_the_config_are_a_config_mismatch_not_damage(tmp_path, change):
    # other model shapes, or skip_step toggled (another optimizer-state tree), make orbax fail to
    # restore an intact step: that is the config's doing, so no step is declared damaged or moved
    ckpt, params, opt_state = saved(tmp_path, [5, 10])
    ckpt.close()
    if change == "param_shape":
        params = {**params, "embed": {"embedding": jax.numpy.zeros((7, 4))}}
        says = r"params: embed\.embedding: checkpoint has shape \(7, 3\), config makes \(7, 4\)"
    else:
        opt_state = optim.make_optimizer(load_config(None, ["skip_step.enabled=false"])).init(params)
        says = r"opt_state: \d+ array\(s\) only in the checkpoint, e\.g\. grad_norms"
    again = Checkpoints(RunDir(tmp_path), CheckpointConfig(keep=None))
    with pytest.raises(checkpoint.ConfigMismatchError, match="checkpoint 10 .* holds other arrays") as e:
        again.restore_latest(abstract(params), abstract(opt_state), lambda *a: None)
    again.close()
    assert re.search(says, str(e.value)) and "intact" in str(e.value), str(e.value)
    assert again.manager.all_steps() == [5, 10] and not (tmp_path / rules.REJECTED).exists()
    # stage 2 from another run's step with such a config: the same refusal, naming the arrays
    with pytest.raises(checkpoint.ConfigMismatchError, match=says):
        init_from(tmp_path / "stage2", tmp_path / "checkpoints" / "10", abstract(params), abstract(opt_state))


def test_shape_differences_names_reshaped_missing_and_extra_arrays():
    assert rules.shape_differences({"a": (2,), "b": (3,)}, {"a": (2,), "b": (3,)}) == []
    assert rules.shape_differences({"a": (2,), "b": (3,)}, {"a": (3,), "c": ()}) == [
        "a: checkpoint has shape (2,), config makes (3,)",
        "1 array(s) only in the checkpoint, e.g. b",
        "1 array(s) only in the config's state, e.g. c",
    ]
    params, opt_state = make_state()
    assert rules.array_shapes(params) == {"embed.embedding": (7, 3), "lm_head.kernel": (3, 7)}
    assert "grad_norms" in rules.array_shapes(opt_state)


def test_a_checksum_file_is_never_overwritten(tmp_path, monkeypatch):
    ckpt, _, _ = saved(tmp_path, [5])
    ckpt.close()
    step_dir = tmp_path / "checkpoints" / "5"
    flip_byte(params_data_files(step_dir)[0])
    sealed = (step_dir / rules.CHECKSUMS).read_bytes()
    with pytest.raises(checkpoint.CheckpointError, match="refusing to overwrite its olmax_checksums.json"):
        files.write_checksums(step_dir)
    assert (step_dir / rules.CHECKSUMS).read_bytes() == sealed
    assert "sha256 mismatch" in files.verify_step(step_dir)
    # nor when one appears while the files are hashed (another writer, a lagging cache catching up)
    (step_dir / rules.CHECKSUMS).unlink()
    real_digests = files.file_digests

    def digests_then_appears(d, files):
        out = real_digests(d, files)
        (step_dir / rules.CHECKSUMS).write_bytes(sealed)
        return out

    monkeypatch.setattr(files, "file_digests", digests_then_appears)
    with pytest.raises(checkpoint.CheckpointError, match="appeared while it was being sealed"):
        files.write_checksums(step_dir)
    assert (step_dir / rules.CHECKSUMS).read_bytes() == sealed


def test_no_intact_step_refuses_to_start_and_moves_nothing(tmp_path):
    ckpt, params, opt_state = saved(tmp_path, [5])
    ckpt.close()
    params_data_files(tmp_path / "checkpoints" / "5")[0].unlink()
    again = Checkpoints(RunDir(tmp_path), CheckpointConfig())
    with pytest.raises(checkpoint.CheckpointError, match=r"no intact checkpoint.*\n  step 5: .*missing"):
        again.restore_latest(abstract(params), abstract(opt_state))
    again.close()
    assert (tmp_path / "checkpoints" / "5").is_dir() and not (tmp_path / rules.REJECTED).exists()
    assert Checkpoints(RunDir(tmp_path / "fresh"), CheckpointConfig()).restore_latest(None, None) is None


def test_a_crash_of_an_older_olmax_before_the_first_checksums_restarts_from_scratch(tmp_path):
    params, opt_state = make_state()
    legacy_step(tmp_path, 4, params, opt_state, pending=True)  # killed between orbax's commit and the checksums
    again = Checkpoints(RunDir(tmp_path), CheckpointConfig())
    assert again.restore_latest(abstract(params), abstract(opt_state)) is None
    assert again.manager.all_steps() == []
    assert (tmp_path / rules.REJECTED / "4" / "params").is_dir()
    assert not (tmp_path / rules.PENDING / "4").exists()
    again.close()


def test_a_step_written_without_checksums_is_refused_unless_trusted_explicitly(tmp_path):
    params, opt_state = make_state()
    legacy_step(tmp_path, 6, params, opt_state)
    step_dir = tmp_path / "checkpoints" / "6"
    refusing = Checkpoints(RunDir(tmp_path), CheckpointConfig())
    with pytest.raises(
        checkpoint.CheckpointError,
        match=r"(?s)step 6: .*written without checksums.*"
        r"add the override checkpoint.trust_unverified=true",
    ):
        refusing.restore_latest(abstract(params), abstract(opt_state))
    refusing.close()
    assert step_dir.is_dir() and not (step_dir / rules.CHECKSUMS).exists()  # untouched
    with pytest.raises(checkpoint.CheckpointError, match="trust_unverified=true"):
        init_from(tmp_path / "stage2", step_dir, abstract(params), abstract(opt_state))
    p, _ = init_from(tmp_path / "stage2", step_dir, abstract(params), abstract(opt_state), trust_unverified=True)
    assert_bitwise_equal(p, params)
    trusting = Checkpoints(RunDir(tmp_path), CheckpointConfig(trust_unverified=True))
    step, restored = trusting.restore_latest(abstract(params), abstract(opt_state))
    trusting.close()
    assert step == 6
    assert_bitwise_equal(restored["params"], params)
    assert files.verify_step(step_dir) is None  # sealed at this resume; verified from now on


def test_non_finite_parameters_are_never_saved(tmp_path):
    params, opt_state = make_state()
    bad = {**params, "lm_head": {"kernel": params["lm_head"]["kernel"].at[0, 0].set(np.nan)}}
    ckpt = Checkpoints(RunDir(tmp_path), CheckpointConfig())
    with pytest.raises(checkpoint.CheckpointError, match="non-finite parameters"):
        ckpt.save(4, bad, opt_state, Loader(4), {"step": 4})
    ckpt.close()
    assert ckpt.manager.all_steps() == []


def test_a_read_error_while_sealing_never_commits_the_step_and_stops_the_run(tmp_path, monkeypatch):
    # a made-up digest would declare the intact step damaged forever (checksums are never
    # rewritten), and a step committed without checksums would not be trusted: neither happens
    ckpt, params, opt_state = saved(tmp_path, [5])
    real_sha256 = files._sha256

    def sha256(path):  # the seal reads the step in orbax's temporary directory, before the commit
        if f"10{checkpoint.ORBAX_TMP_SUFFIX}/params/" in str(path):
            raise OSError(errno.EIO, "Input/output error", str(path))
        return real_sha256(path)

    with monkeypatch.context() as m:
        m.setattr(files, "_sha256", sha256)
        ckpt.save(10, params, opt_state, Loader(10), {"step": 10})
        with pytest.raises(
            checkpoint.CheckpointError,
            match=r"^writing checkpoint 10 failed \(Input/output error\): it was not saved; "
            r"the newest saved checkpoint is 5",
        ):
            ckpt.wait()
    ckpt.close()
    assert not (tmp_path / "checkpoints" / "10").exists()  # never committed, with or without a digest
    again = Checkpoints(RunDir(tmp_path), CheckpointConfig(keep=None))
    assert again.manager.all_steps() == [5]  # orbax removed the temporary directory
    step, _ = again.restore_latest(abstract(params), abstract(opt_state))
    again.close()
    assert step == 5 and not (tmp_path / rules.REJECTED).exists()


def test_a_read_error_while_verifying_stops_the_run_and_skips_nothing(tmp_path, monkeypatch):
    ckpt, params, opt_state = saved(tmp_path, [5, 10])
    ckpt.close()
    again = Checkpoints(RunDir(tmp_path), CheckpointConfig(keep=None))
    with monkeypatch.context() as m:
        failing_read(m, params_data_files(tmp_path / "checkpoints" / "10")[0])
        with pytest.raises(checkpoint.CheckpointError, match="checkpoint .*10: cannot read params/.*Input/output"):
            again.restore_latest(abstract(params), abstract(opt_state))
    assert again.manager.all_steps() == [5, 10] and not (tmp_path / rules.REJECTED).exists()
    step, _ = again.restore_latest(abstract(params), abstract(opt_state))  # the error passed
    again.close()
    assert step == 10


def test_a_flipped_byte_in_the_meta_that_still_parses_is_damage_not_a_config_change(tmp_path):
    ckpt, params, opt_state = saved(tmp_path, [5, 10])
    ckpt.close()
    meta_file = tmp_path / "checkpoints" / "10" / "meta" / "metadata"
    assert meta_file.read_text() == '{"step": 10}'
    meta_file.write_text('{"step": 11}')  # one bit: "0" (0x30) → "1" (0x31)

    def check(step, meta, data):  # as the trainer's: the meta's step must be the step's
        if meta["step"] != step:
            raise checkpoint.RefusedConfigError(f"meta says step {meta['step']}")

    again = Checkpoints(RunDir(tmp_path), CheckpointConfig(keep=None))
    step, restored = again.restore_latest(abstract(params), abstract(opt_state), check)
    again.close()
    assert step == 5 and restored["meta"]["step"] == 5
    assert (
        "sha256 mismatch in 1 file(s), e.g. meta/metadata" in (tmp_path / rules.REJECTED / "10.reason.txt").read_text()
    )


def test_a_local_error_is_raised_as_a_checkpoint_error_naming_the_step_not_a_traceback(tmp_path, monkeypatch):
    ckpt, params, opt_state = saved(tmp_path, [5, 10])
    ckpt.close()
    again = Checkpoints(RunDir(tmp_path), CheckpointConfig(keep=None))
    # a check that breaks on a meta it does not expect: a refusal (exit 2), chained, nothing moved
    with pytest.raises(checkpoint.RefusedConfigError, match="checkpoint 10 in .*ValueError: invalid literal") as e:
        again.restore_latest(abstract(params), abstract(opt_state), lambda step, meta, data: int("x"))
    assert isinstance(e.value.__cause__, ValueError)
    assert again.manager.all_steps() == [5, 10]
    # a full disk while writing a checksum file: a failure (exit 1) naming the step
    step_dir = tmp_path / "checkpoints" / "5"
    (step_dir / rules.CHECKSUMS).unlink()

    def no_space(path, mode="r", *args, **kwargs):
        if "w" in mode:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return open(path, mode, *args, **kwargs)

    monkeypatch.setattr(files, "open", no_space, raising=False)  # the module's open, not the builtin
    with pytest.raises(checkpoint.CheckpointError, match=r"checkpoint .*/5: OSError: .*No space left") as e:
        files.write_checksums(step_dir)
    assert type(e.value) is checkpoint.CheckpointError and isinstance(e.value.__cause__, OSError)
    again.close()


def test_a_step_that_cannot_be_moved_aside_stops_the_run_with_the_os_error(tmp_path, monkeypatch):
    ckpt, params, opt_state = saved(tmp_path, [5, 10])
    ckpt.close()
    flip_byte(params_data_files(tmp_path / "checkpoints" / "10")[0])
    real_replace = checkpoint.os.replace

    def replace(src, dst):
        if Path(src).parent == tmp_path / "checkpoints":
            raise PermissionError(errno.EACCES, "Permission denied", str(src))
        return real_replace(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", replace)
    again = Checkpoints(RunDir(tmp_path), CheckpointConfig(keep=None))
    with pytest.raises(
        checkpoint.CheckpointError, match="checkpoint 10 in .*moving it aside.*PermissionError: .*Permission denied"
    ):
        again.restore_latest(abstract(params), abstract(opt_state))
    again.close()
    assert (tmp_path / "checkpoints" / "10" / "params").is_dir()


@pytest.mark.parametrize("name", ["with space", "ünïcode-步", "star*", "question?"])
def test_a_run_dir_with_spaces_unicode_or_glob_wildcards_saves_and_resumes(tmp_path, name):
    run_dir = tmp_path / name / "run"
    ckpt, params, opt_state = saved(run_dir, [2, 4])
    ckpt.close()
    again = Checkpoints(RunDir(run_dir), CheckpointConfig())
    step, restored = again.restore_latest(abstract(params), abstract(opt_state))
    again.close()
    assert step == 4 and not (run_dir / rules.REJECTED).exists()
    assert_bitwise_equal(restored["params"], params)
    assert_bitwise_equal(restored["opt_state"], opt_state)
