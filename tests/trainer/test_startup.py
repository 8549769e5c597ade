"""A run's start-up checks run once, into one frozen result that the loop uses as it is."""

from __future__ import annotations

import dataclasses

import pytest

from contract.rundir import RunDir
from trainer.config.schema import load_config


def test_the_start_up_checks_load_the_manifests_once_and_train_checks_nothing_again(
    data_manifest, tmp_path, monkeypatch
):
    from dataloader import loader as loader_lib
    from trainer import data_contract, loop, preflight, startup

    cfg = load_config(None, [f"data={data_manifest}", "verify_data_gib=0", "steps=2"])
    loads, plans = [], []
    real, real_plan = data_contract.load_manifests, loader_lib.load_plan
    monkeypatch.setattr(data_contract, "load_manifests", lambda paths: loads.append(paths) or real(paths))
    monkeypatch.setattr(loader_lib, "load_plan", lambda *a: plans.append(a) or real_plan(*a))
    lock, checked = preflight.prepare(cfg, RunDir(tmp_path / "run"))
    # the plan is built once (the plan check), kept, and the memory check sizes the readers from it
    assert len(plans) == 1 and checked.plan.fingerprint == real_plan(checked.loader_cfg)[1].fingerprint
    plans.clear()
    with loader_lib.make_loader(checked.loader_cfg, 0, 1, loaded=(checked.manifests, checked.plan)) as it:
        assert it.fingerprint == checked.plan.fingerprint and plans == []  # the loader builds none again

    class Built(Exception):
        pass

    def build(source):
        assert source is checked  # the loop builds from the start-up's result
        raise Built

    try:
        assert isinstance(checked, startup.Checked) and checked.cfg is cfg and len(loads) == 1
        with pytest.raises(dataclasses.FrozenInstanceError):
            checked.seq_len = 1  # type: ignore[misc]
        assert checked.attention_impl == "xla" and checked.eval_labels  # resolved for the CPU; held-out sets
        monkeypatch.setattr(loop, "build", build)
        with pytest.raises(Built):
            loop.train(checked, RunDir(tmp_path / "run"))
    finally:
        lock.release()
    assert len(loads) == 1  # prepare's, and none in train


def test_the_loop_has_one_door_a_config_alone_is_a_type_error_and_writes_nothing(tmp_path):
    from trainer import loop

    cfg = load_config(None, ["steps=2"])
    run = RunDir(tmp_path / "run")
    with pytest.raises(TypeError, match=r"train takes the start-up's Checked \(trainer.preflight.prepare"):
        loop.train(cfg, run)  # type: ignore[arg-type]
    assert not run.path.exists()


def test_the_train_bench_starts_the_loop_through_prepare(monkeypatch):
    """bench.train's run takes every start-up check (memory, shards, lock) before the loop."""
    from bench import train as bench_train

    class Prepared(Exception):
        pass

    seen = []

    def prepare(cfg, run):
        seen.append((cfg, run))
        raise Prepared

    monkeypatch.setattr(bench_train, "prepare", prepare)
    monkeypatch.setattr(bench_train, "train", lambda *a: pytest.fail("the loop ran without prepare"))
    cfg = load_config(None, ["steps=2"])
    with pytest.raises(Prepared):
        bench_train.measured_rows(cfg, 0)
    assert seen[0][0] is cfg and isinstance(seen[0][1], RunDir)


def test_a_missing_tracker_is_the_start_ups_own_refusal_not_a_checkpoint_error(data_manifest, monkeypatch):
    from contract import Refused
    from trainer import startup, trackers
    from trainer.checkpointing.rules import CheckpointError

    real = trackers.importlib.util.find_spec
    monkeypatch.setattr(trackers.importlib.util, "find_spec", lambda n, *a: None if n == "tensorboard" else real(n, *a))
    with pytest.raises(startup.StartRefused, match="log.tensorboard is true but tensorboard is not installed") as e:
        startup.check(load_config(None, [f"data={data_manifest}", "log.tensorboard=true"]))
    assert isinstance(e.value, Refused) and not isinstance(e.value, CheckpointError)


def test_the_hosts_topology_is_checked_once_by_the_layout_check_as_a_mesh_refusal():
    """A process count that does not divide the batch: the layout check's MeshError (a refusal the
    start-up names the mesh in), so the preflight checks it no second time."""
    import jax

    from trainer import mesh as mesh_lib
    from trainer import startup

    cfg = load_config(None, ["global_batch_size=8", "microbatches=1"])
    mesh = mesh_lib.make_mesh(cfg.mesh, jax.devices()[:1])
    startup.check_layout(cfg, mesh, 32, [0], 1)
    with pytest.raises(mesh_lib.MeshError, match="process_count 3 does not divide global_batch_size 8"):
        startup.check_layout(cfg, mesh, 32, [2], 3)


@pytest.mark.parametrize("interval, runs_after", [(3, [3, 6, 7]), (0, []), (10, [7])])
def test_a_periodic_evaluator_runs_every_interval_steps_and_after_the_last(interval, runs_after):
    from trainer import evaluators

    class Every:
        def __init__(self, interval):
            self.interval = interval

    assert [s for s in range(1, 8) if evaluators.due(Every(interval), s, 7)] == runs_after


def _clean_from_audit(folder, tasks_dir, fingerprints, found):
    """An audit.json as `python -m audit --data ... --eval-tasks tasks_dir` writes it, in the parts
    downstream.clean_from reads: what it audited (`inputs`) and check 8's instances."""
    import json

    from contract import downstream as ds

    folder.mkdir()
    inputs = {"fingerprint": fingerprints[0]} if len(fingerprints) == 1 else {"fingerprints": fingerprints}
    index = {"tasks_content_hash": ds.load(tasks_dir, labels=[]).manifest["content_hash"]}
    check = {"passed": False, "summary": "…", "figures": {"index": index, "instances": found}}
    (folder / "audit.json").write_text(json.dumps({"inputs": inputs, "checks": {"task_contamination": check}}))
    return folder


def test_clean_from_takes_an_audit_of_the_runs_data_and_refuses_another_datasets_before_the_run_dir_is_written(
    trainer_process, data_manifest, tmp_path
):
    import json

    from tests.trainer.conftest import trainer_cmd
    from tests.trainer.downstream.test_downstream_in_loop import LABELS, _overrides, _tasks
    from trainer import startup

    tasks_dir = _tasks(tmp_path / "tasks")
    mine = json.loads(data_manifest.read_text())["fingerprint"]
    found = {LABELS[0]: [1, 4]}
    ours = _clean_from_audit(tmp_path / "ours", tasks_dir, [mine], found)
    overrides = [f"data={data_manifest}", "steps=2", "seq_len=32", *_overrides(tasks_dir)]
    checked = startup.check(load_config(None, [*overrides, f"downstream.clean_from={ours}"]))
    assert checked.contaminated == {LABELS[0]: {1, 4}, LABELS[1]: set()}
    # the same instances, from an audit of another dataset: refused at start-up, one line, exit 2
    other = _clean_from_audit(tmp_path / "other", tasks_dir, ["f" * 64], found)
    run_dir = tmp_path / "run"
    cmd = trainer_cmd(data_manifest, run_dir, "steps=2", *_overrides(tasks_dir), f"downstream.clean_from={other}")
    proc = trainer_process.run(cmd)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "the audit read other data than the run" in errors[0] and f"{'f' * 16}…" in errors[0]
    assert f"the run's data {mine[:16]}…" in errors[0]
    assert not run_dir.exists()
