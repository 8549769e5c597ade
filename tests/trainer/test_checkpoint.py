"""Orbax round trips (bitwise), stage-2 initialisation, and the run logs' restart rules."""
from __future__ import annotations

import json
import re

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from trainer import checkpoint, logs, optim
from trainer.checkpoint import Checkpointer, abstract_like, key_from_json, key_to_json, restore_model_state
from trainer.config import CheckpointConfig, load_config


class _Loader:
    """Stands in for the data iterator: only its state is checkpointed."""

    def __init__(self, step):
        self._state = {"fingerprint": "f" * 64, "seed": 7, "global_batch_size": 4, "step": step}

    def state(self):
        return dict(self._state)


def _state(seed=0):
    cfg = load_config(None, ["skip_step.enabled=true"])  # NamedTuple-rich optimizer state
    tx = optim.make_optimizer(cfg)
    k = jax.random.split(jax.random.key(seed), 2)
    params = {"embed": {"embedding": jax.random.normal(k[0], (7, 3))},
              "lm_head": {"kernel": jax.random.normal(k[1], (3, 7))}}
    opt_state = tx.init(params)
    grads = jax.tree.map(lambda x: 0.5 * x, params)
    _, opt_state = jax.jit(lambda g, o, p: tx.update(g, o, p, loss=3.0))(grads, opt_state, params)
    return params, opt_state


def _abstract(tree):
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return abstract_like(tree, jax.tree.map(lambda _: sharding, tree))


def _assert_bitwise_equal(a, b):
    la, lb = jax.tree_util.tree_flatten(a), jax.tree_util.tree_flatten(b)
    assert la[1] == lb[1]
    for x, y in zip(la[0], lb[0]):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def test_checkpoint_round_trip_is_bitwise_with_rng_and_data_position(tmp_path):
    params, opt_state = _state()
    rng = jax.random.split(jax.random.key(3))[1]
    meta = {"step": 5, "rng": key_to_json(rng), "data_sha256": "ab" * 32}
    ckpt = Checkpointer(tmp_path, CheckpointConfig(keep=2))
    for step in (5, 10, 15):
        ckpt.save(step, params, opt_state, _Loader(step), {**meta, "step": step})
    ckpt.wait()
    assert ckpt.manager.all_steps() == [10, 15]  # keep policy
    restored = ckpt.restore(15, _abstract(params), _abstract(opt_state))
    ckpt.close()
    _assert_bitwise_equal(restored["params"], params)
    _assert_bitwise_equal(restored["opt_state"], opt_state)
    assert restored["data"]["step"] == restored["meta"]["step"] == 15
    back = key_from_json(json.loads(json.dumps(restored["meta"]["rng"])))
    assert np.array_equal(jax.random.key_data(back), jax.random.key_data(rng))
    assert np.array_equal(jax.random.normal(back, (3,)), jax.random.normal(rng, (3,)))


def test_checkpoint_refuses_a_data_position_that_does_not_match_the_step(tmp_path):
    params, opt_state = _state()
    ckpt = Checkpointer(tmp_path, CheckpointConfig())
    with pytest.raises(RuntimeError, match="data position would not match"):
        ckpt.save(4, params, opt_state, _Loader(3), {"step": 4})
    ckpt.close()


def test_stage2_starts_from_a_stage1_step_with_its_optimizer_state(tmp_path):
    params, opt_state = _state(seed=1)
    ckpt = Checkpointer(tmp_path / "stage1", CheckpointConfig())
    ckpt.save(1000, params, opt_state, _Loader(1000), {"step": 1000})
    ckpt.wait()
    ckpt.close()
    p, o = restore_model_state(tmp_path / "stage1" / "checkpoints" / "1000", _abstract(params), _abstract(opt_state))
    _assert_bitwise_equal(p, params)
    _assert_bitwise_equal(o, opt_state)
    assert int(o.inner_state[1].count) == 1  # Adam's bias-correction count carries over
    with pytest.raises(FileNotFoundError, match="init_from"):
        restore_model_state(tmp_path / "stage1", _abstract(params), _abstract(opt_state))


def test_restart_cuts_logs_back_to_the_checkpoint_and_drops_a_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0 / (s + 1)}) + "\n" for s in range(7)) + '{"step": 7, "lo')
    writer = logs.JsonlWriter(path, before_step=4)
    writer.write({"step": 4, "loss": 0.5})
    writer.close()
    assert [r["step"] for r in logs.read_jsonl(path)] == [0, 1, 2, 3, 4]


def test_params_sha256_sees_every_bit_and_the_layout():
    params, _ = _state()
    base = logs.params_sha256(params)
    assert base == logs.params_sha256(jax.tree.map(np.array, params))
    flipped = np.array(params["lm_head"]["kernel"])
    flipped.view(np.uint32)[1, 2] ^= 1  # one mantissa bit
    assert logs.params_sha256({**params, "lm_head": {"kernel": flipped}}) != base
    assert logs.params_sha256({**params, "lm_head": {"kernel": flipped.reshape(7, 3)}}) != logs.params_sha256(
        {**params, "lm_head": {"kernel": flipped}})


# ----------------------------------------------------------------------------- integrity

def _saved(tmp_path, steps, keep=None):
    params, opt_state = _state()
    ckpt = Checkpointer(tmp_path, CheckpointConfig(keep=keep))
    for step in steps:
        ckpt.save(step, params, opt_state, _Loader(step), {"step": step})
    ckpt.wait()
    return ckpt, params, opt_state


def _flip_byte(path, offset=None):
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


def _params_data_files(step_dir):
    """The array-data files of the params item (orbax OCDBT data files), largest first."""
    files = [p for p in (step_dir / "params").rglob("*") if p.is_file() and p.parent.name == "d"]
    return sorted(files, key=lambda p: -p.stat().st_size)


def test_a_flipped_byte_or_other_damage_in_any_file_of_a_step_is_detected(tmp_path):
    ckpt, params, opt_state = _saved(tmp_path, [5])
    ckpt.close()
    step_dir = tmp_path / "checkpoints" / "5"
    assert checkpoint.verify_step(step_dir) is None
    files = checkpoint.step_files(step_dir)
    assert {f.split("/")[0] for f in files} >= set(checkpoint.ITEMS)  # every item is covered
    for rel in files:  # one flipped byte anywhere: params, opt_state, data, meta, orbax metadata
        path = step_dir / rel
        original = path.read_bytes()
        if not original:
            continue
        _flip_byte(path)
        reason = checkpoint.verify_step(step_dir)
        path.write_bytes(original)
        assert reason is not None and "sha256 mismatch" in reason and rel in reason, (rel, reason)
    victim = _params_data_files(step_dir)[0]
    original = victim.read_bytes()
    victim.write_bytes(original[:-1])  # truncated
    assert "sha256 mismatch" in checkpoint.verify_step(step_dir)
    victim.unlink()
    assert "missing" in checkpoint.verify_step(step_dir)
    victim.write_bytes(original)
    (step_dir / "params" / "stray").write_text("x")
    assert "not in" in checkpoint.verify_step(step_dir)
    (step_dir / "params" / "stray").unlink()
    (step_dir / checkpoint.CHECKSUMS).write_text('{"files": [')
    assert "unreadable" in checkpoint.verify_step(step_dir)


def test_restore_refuses_a_step_whose_parameters_changed_by_one_byte(tmp_path):
    ckpt, params, opt_state = _saved(tmp_path, [5])
    step_dir = tmp_path / "checkpoints" / "5"
    _flip_byte(_params_data_files(step_dir)[0])
    with pytest.raises(checkpoint.CheckpointError, match="sha256 mismatch"):
        ckpt.restore(5, _abstract(params), _abstract(opt_state))
    ckpt.close()
    with pytest.raises(checkpoint.CheckpointError, match="init_from.*sha256 mismatch"):
        restore_model_state(step_dir, _abstract(params), _abstract(opt_state))


def test_resume_falls_back_to_the_newest_intact_step_and_sets_damaged_ones_aside(tmp_path, caplog):
    ckpt, params, opt_state = _saved(tmp_path, [5, 10, 15])
    ckpt.close()
    _flip_byte(_params_data_files(tmp_path / "checkpoints" / "15")[0])
    # A run killed after orbax committed step 20 but before its checksums were written.
    crashed = Checkpointer(tmp_path, CheckpointConfig(keep=None))
    crashed.save(20, params, opt_state, _Loader(20), {"step": 20})
    crashed.manager.wait_until_finished()
    crashed.manager.close()  # no wait()/close(): nothing sealed step 20
    assert (tmp_path / "checkpoints" / "20" / "params").is_dir()
    assert not (tmp_path / "checkpoints" / "20" / checkpoint.CHECKSUMS).exists()

    resumed = Checkpointer(tmp_path, CheckpointConfig(keep=None))
    with caplog.at_level("WARNING"):
        step, restored = resumed.restore_latest(_abstract(params), _abstract(opt_state))
    assert step == 10 and restored["meta"]["step"] == 10
    _assert_bitwise_equal(restored["params"], params)
    _assert_bitwise_equal(restored["opt_state"], opt_state)
    log_text = caplog.text
    assert "checkpoint 20" in log_text and "no olmax_checksums.json" in log_text
    assert "checkpoint 15" in log_text and "sha256 mismatch" in log_text
    rejected = tmp_path / checkpoint.REJECTED
    assert sorted(p.name for p in rejected.iterdir()) == ["15", "15.reason.txt", "20", "20.reason.txt"]
    assert "sha256 mismatch" in (rejected / "15.reason.txt").read_text()
    assert resumed.manager.all_steps() == [5, 10]
    resumed.save(15, params, opt_state, _Loader(15), {"step": 15})  # the run carries on past 15 again
    resumed.wait()
    assert checkpoint.verify_step(tmp_path / "checkpoints" / "15") is None
    resumed.close()


@pytest.mark.parametrize("damage", ["emptied", "unrestorable"])
def test_a_step_its_checksums_cannot_vouch_for_is_skipped_for_the_older_one(tmp_path, caplog, damage):
    # emptied: everything gone but a checksum file that lists no files (it vouches for nothing);
    # unrestorable: damaged before its checksums were recorded, so they match and orbax still fails
    import shutil

    ckpt, params, opt_state = _saved(tmp_path, [5, 10])
    ckpt.close()
    step_dir = tmp_path / "checkpoints" / "10"
    if damage == "emptied":
        for p in list(step_dir.iterdir()):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        (step_dir / checkpoint.CHECKSUMS).write_text(json.dumps({"algorithm": "sha256", "files": {}}))
        assert "records no file of item(s) params, opt_state, data, meta" in checkpoint.verify_step(step_dir)
        says = "records no file"
    else:
        meta_files = [p for p in (step_dir / "meta").iterdir() if p.is_file() and p.name != "commit_success.txt"]
        for p in meta_files:
            p.write_bytes(b"\x00not json")
        checkpoint.write_checksums(step_dir)
        assert checkpoint.verify_step(step_dir) is None
        says = "orbax cannot restore it"
    resumed = Checkpointer(tmp_path, CheckpointConfig(keep=None))
    with caplog.at_level("WARNING"):
        step, restored = resumed.restore_latest(_abstract(params), _abstract(opt_state))
    resumed.close()
    assert step == 5 and restored["meta"]["step"] == 5
    assert "checkpoint 10" in caplog.text and says in caplog.text
    assert says in (tmp_path / checkpoint.REJECTED / "10.reason.txt").read_text()


def test_with_several_processes_an_unrestorable_step_stops_the_run_instead_of_one_process_falling_back(tmp_path):
    # a restore error can hit one process only; a lone fallback would put the processes on
    # different steps, so with several processes the run stops (restore_latest raises this)
    step_dir = tmp_path / "checkpoints" / "10"
    assert checkpoint.unagreed_fallback(step_dir, "verified, but orbax cannot restore it (X: y)", 0, 1) is None
    err = checkpoint.unagreed_fallback(step_dir, "verified, but orbax cannot restore it (X: y)", 3, 4)
    assert isinstance(err, checkpoint.CheckpointError)
    assert str(err) == (f"checkpoint 10 in {tmp_path / 'checkpoints'}: verified, but orbax cannot restore it (X: y) "
                        f"on process 3 of 4; with several processes a fallback to an older step is not agreed "
                        f"among them, so the run stops: move {step_dir} aside to resume from the step before it")


def test_a_config_refused_on_the_meta_is_refused_before_any_array_is_restored_and_nothing_moves(tmp_path):
    ckpt, params, opt_state = _saved(tmp_path, [5, 10])
    ckpt.close()
    seen = []

    def refuse(step, meta, data):
        seen.append((step, meta["step"], data["step"]))
        raise RuntimeError("settings differ")

    again = Checkpointer(tmp_path, CheckpointConfig(keep=None))
    # abstract trees that could not even be restored: the refusal comes first, from the meta
    with pytest.raises(RuntimeError, match="settings differ"):
        again.restore_latest(None, None, refuse)
    again.close()
    assert seen == [(10, 10, 10)]
    assert again.manager.all_steps() == [5, 10] and not (tmp_path / checkpoint.REJECTED).exists()


@pytest.mark.parametrize("change", ["param_shape", "optimizer_structure"])
def test_arrays_shaped_otherwise_by_the_config_are_a_config_mismatch_not_damage(tmp_path, change):
    # other model shapes, or skip_step toggled (another optimizer-state tree), make orbax fail to
    # restore an intact step: that is the config's doing, so no step is declared damaged or moved
    ckpt, params, opt_state = _saved(tmp_path, [5, 10])
    ckpt.close()
    if change == "param_shape":
        params = {**params, "embed": {"embedding": jax.numpy.zeros((7, 4))}}
        says = r"params: embed\.embedding: checkpoint has shape \(7, 3\), config makes \(7, 4\)"
    else:
        opt_state = optim.make_optimizer(load_config(None, ["skip_step.enabled=false"])).init(params)
        says = r"opt_state: \d+ array\(s\) only in the checkpoint, e\.g\. grad_norms"
    again = Checkpointer(tmp_path, CheckpointConfig(keep=None))
    with pytest.raises(checkpoint.ConfigMismatchError, match="checkpoint 10 .* holds other arrays") as e:
        again.restore_latest(_abstract(params), _abstract(opt_state), lambda *a: None)
    again.close()
    assert re.search(says, str(e.value)) and "intact" in str(e.value), str(e.value)
    assert again.manager.all_steps() == [5, 10] and not (tmp_path / checkpoint.REJECTED).exists()
    # stage 2 from another run's step with such a config: the same refusal, naming the arrays
    with pytest.raises(checkpoint.ConfigMismatchError, match=says):
        restore_model_state(tmp_path / "checkpoints" / "10", _abstract(params), _abstract(opt_state))


def test_shape_differences_names_reshaped_missing_and_extra_arrays():
    assert checkpoint.shape_differences({"a": (2,), "b": (3,)}, {"a": (2,), "b": (3,)}) == []
    assert checkpoint.shape_differences({"a": (2,), "b": (3,)}, {"a": (3,), "c": ()}) == [
        "a: checkpoint has shape (2,), config makes (3,)",
        "1 array(s) only in the checkpoint, e.g. b", "1 array(s) only in the config's state, e.g. c"]
    params, opt_state = _state()
    assert checkpoint.array_shapes(params) == {"embed.embedding": (7, 3), "lm_head.kernel": (3, 7)}
    assert "grad_norms" in checkpoint.array_shapes(opt_state)


def test_the_processes_agree_on_a_verdict_a_step_is_intact_only_if_intact_on_all():
    agreed, U, D = checkpoint.agreed_reason, checkpoint.UNSEALED, "sha256 mismatch in 1 file(s), e.g. x"
    same = [b"c" * 32] * 3
    assert agreed(None, [0, 0, 0], same, 1) is None
    # one process sees the step damaged or unsealed: no process takes it, in the same category
    assert agreed(None, [0, 2, 0], same, 0) == (
        "not intact as process(es) [1] see it (their view of the step differs from process 0's), "
        "so no process takes it")
    assert agreed(D, [0, 2, 0], same, 1) == D
    assert agreed(None, [0, 1, 0], same, 2) == U and agreed(U, [0, 1, 0], same, 1) == U
    assert agreed(U, [1, 2], [b"", b""], 0).startswith("not intact as process(es) [1]")
    # all intact but they read different checksum files: not intact anywhere
    assert "read different olmax_checksums.json" in agreed(None, [0, 0], [b"a" * 32, b"b" * 32], 0)
    # the category decides "start from scratch" vs "refuse": it is the same on every process
    for codes in ([0, 1], [1, 2], [0, 2], [2, 2], [1, 1]):
        verdicts = [agreed([None, U, D][c], codes, [b""] * len(codes), i) for i, c in enumerate(codes)]
        assert len({checkpoint.verdict_code(v) for v in verdicts}) == 1, (codes, verdicts)


@pytest.mark.parametrize("other", ["damaged", "unsealed"])
def test_a_step_another_process_sees_otherwise_is_skipped_here_too(tmp_path, monkeypatch, caplog, other):
    # one real process; _gather reports a second one that sees the newest step otherwise
    ckpt, params, opt_state = _saved(tmp_path, [5, 10])
    ckpt.close()
    real_gather = checkpoint._gather

    def two_processes(row):
        mine = real_gather(row)
        if row.ndim == 1 and row.size > 1 and checkpoint_step[0] == 10:  # the verdict row of step 10
            theirs = np.zeros_like(row)
            theirs[0] = checkpoint.DAMAGED if other == "damaged" else checkpoint.UNSEALED_CODE
            return np.concatenate([mine, theirs[None]])
        return np.concatenate([mine, mine])

    checkpoint_step = [None]
    real_local = checkpoint._local_check

    def local_check(step_dir):
        checkpoint_step[0] = int(step_dir.name)
        return real_local(step_dir)

    monkeypatch.setattr(checkpoint, "_gather", two_processes)
    monkeypatch.setattr(checkpoint, "_local_check", local_check)
    assert checkpoint.verify_step(tmp_path / "checkpoints" / "5") is None
    assert checkpoint.verify_step(tmp_path / "checkpoints" / "10") is not None
    resumed = Checkpointer(tmp_path, CheckpointConfig(keep=None))
    with caplog.at_level("WARNING"):
        step, _ = resumed.restore_latest(_abstract(params), _abstract(opt_state))
    resumed.close()
    assert step == 5
    says = "not intact as process(es) [1] see it" if other == "damaged" else "no olmax_checksums.json"
    assert says in (tmp_path / checkpoint.REJECTED / "10.reason.txt").read_text()


def test_no_intact_step_refuses_to_start_and_moves_nothing(tmp_path):
    ckpt, params, opt_state = _saved(tmp_path, [5])
    ckpt.close()
    _params_data_files(tmp_path / "checkpoints" / "5")[0].unlink()
    again = Checkpointer(tmp_path, CheckpointConfig())
    with pytest.raises(checkpoint.CheckpointError, match=r"no intact checkpoint.*\n  step 5: .*missing"):
        again.restore_latest(_abstract(params), _abstract(opt_state))
    again.close()
    assert (tmp_path / "checkpoints" / "5").is_dir() and not (tmp_path / checkpoint.REJECTED).exists()
    assert Checkpointer(tmp_path / "fresh", CheckpointConfig()).restore_latest(None, None) is None


def test_a_crash_before_the_first_checksums_restarts_from_scratch(tmp_path):
    params, opt_state = _state()
    crashed = Checkpointer(tmp_path, CheckpointConfig())
    crashed.save(4, params, opt_state, _Loader(4), {"step": 4})
    crashed.manager.wait_until_finished()
    crashed.manager.close()  # killed between orbax's commit and the checksums
    again = Checkpointer(tmp_path, CheckpointConfig())
    assert (tmp_path / checkpoint.PENDING / "4").exists()  # marked before the save began
    assert again.restore_latest(_abstract(params), _abstract(opt_state)) is None
    assert again.manager.all_steps() == []
    assert (tmp_path / checkpoint.REJECTED / "4" / "params").is_dir()
    assert not (tmp_path / checkpoint.PENDING / "4").exists()
    again.close()


def _legacy_step(run_dir, step, params, opt_state):
    """A step as an olmax without checksums wrote it: plain orbax, no marker, no checksum file."""
    mngr = ocp.CheckpointManager(run_dir / "checkpoints", item_names=checkpoint.ITEMS)
    mngr.save(step, args=ocp.args.Composite(
        params=ocp.args.StandardSave(params), opt_state=ocp.args.StandardSave(opt_state),
        data=ocp.args.JsonSave(_Loader(step).state()), meta=ocp.args.JsonSave({"step": step})))
    mngr.wait_until_finished()
    mngr.close()


def test_a_step_written_without_checksums_is_refused_unless_trusted_explicitly(tmp_path):
    params, opt_state = _state()
    _legacy_step(tmp_path, 6, params, opt_state)
    step_dir = tmp_path / "checkpoints" / "6"
    refusing = Checkpointer(tmp_path, CheckpointConfig())
    with pytest.raises(checkpoint.CheckpointError, match=r"(?s)step 6: .*written without checksums.*"
                                                         r"add the override checkpoint.trust_unverified=true"):
        refusing.restore_latest(_abstract(params), _abstract(opt_state))
    refusing.close()
    assert step_dir.is_dir() and not (step_dir / checkpoint.CHECKSUMS).exists()  # untouched
    with pytest.raises(checkpoint.CheckpointError, match="trust_unverified=true"):
        restore_model_state(step_dir, _abstract(params), _abstract(opt_state))
    p, _ = restore_model_state(step_dir, _abstract(params), _abstract(opt_state), trust_unverified=True)
    _assert_bitwise_equal(p, params)
    trusting = Checkpointer(tmp_path, CheckpointConfig(trust_unverified=True))
    step, restored = trusting.restore_latest(_abstract(params), _abstract(opt_state))
    trusting.close()
    assert step == 6
    _assert_bitwise_equal(restored["params"], params)
    assert checkpoint.verify_step(step_dir) is None  # sealed at this resume; verified from now on


def test_non_finite_parameters_are_never_saved(tmp_path):
    params, opt_state = _state()
    bad = {**params, "lm_head": {"kernel": params["lm_head"]["kernel"].at[0, 0].set(np.nan)}}
    ckpt = Checkpointer(tmp_path, CheckpointConfig())
    with pytest.raises(checkpoint.CheckpointError, match="non-finite parameters"):
        ckpt.save(4, bad, opt_state, _Loader(4), {"step": 4})
    ckpt.close()
    assert ckpt.manager.all_steps() == []
