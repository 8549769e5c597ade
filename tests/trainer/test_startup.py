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
            loop.train(cfg, RunDir(tmp_path / "run"), checked)
    finally:
        lock.release()
    assert len(loads) == 1  # prepare's, and none in train


@pytest.mark.parametrize("interval, runs_after", [(3, [3, 6, 7]), (0, []), (10, [7])])
def test_a_periodic_evaluator_runs_every_interval_steps_and_after_the_last(interval, runs_after):
    from trainer import evaluators

    class Every:
        def __init__(self, interval):
            self.interval = interval

    assert [s for s in range(1, 8) if evaluators.due(Every(interval), s, 7)] == runs_after
