"""`python -m trainer.convert from-olmo-core`: a checkpoint made by AI2's own code (OLMo-core
3.0.0's Trainer, TransformerTrainModule, SkipStepAdamW and checkpointer: bench.olmo_reference)
imported with its Adam state, then continued by olmax (`trainer.main`, checkpoint.init_from) and by
OLMo-core itself (`load_optim_state=True, load_trainer_state=False`, AI2's next-stage load) on the
same batches: the two agree step for step within the bounds of tests/trainer/test_olmo_reference.py.
The control imports the same checkpoint without its moments (`--fresh_moments`, what MaxText's
OLMo 3 recipe does) and is measurably off: the moments matter.

Both stages keep stage 1's peak lr. A new stage's lr would be the same on both sides (OLMo-core
3.0.0 resets `initial_lr` to the new config's after the load: test_optim_groups.py,
bench/olmo_stage_lr.py); the optimizer settings a checkpoint's param groups store are compared with
the recipe's on import (the tests at the end of the refusals).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from bench import olmo_reference as ref_lib
from bench import olmo_step_for_step as sfs
from bench.olmo_step_for_step import TINY, L
from tests.shared import build_once
from tests.trainer.test_olmo_reference import LOSS_ABS, assert_params_close, assert_step_for_step
from trainer.config.schema import load_config
from trainer.convert import __main__ as convert
from trainer.convert import olmo_core_names as names
from trainer.convert.dcp_read import open_step

STAGE1, STAGE2 = 10, 10
# ~10-40 s each against the reference projects or under a memory cap: run by CI in its own step
# (make test-extra) so that make test keeps its 12 minutes
pytestmark = pytest.mark.ci_extra

NEXT = ["schedule.kind=linear", "schedule.warmup_steps=0", "schedule.final_lr_ratio=0.0", "seed=1337"]


def stage2(data: str, *extra: str) -> list[str]:
    return sfs.recipe(data, STAGE2, *NEXT, *extra)


def stage3(data: str, *extra: str) -> list[str]:
    """The stage after olmax's stage 2 (other batches: another data seed)."""
    return sfs.recipe(data, STAGE2, *NEXT, "seed=7", *extra)


def build(root: Path) -> dict:
    """OLMo-core trains stage 1 and saves; olmax imports it (with and without Adam's state) and
    continues (two runs, in a process beside this one) while OLMo-core continues it here."""
    data = sfs.write_data(str(root / "data"), L)
    ref_lib.run(
        load_config(TINY, sfs.recipe(data, STAGE1)),
        str(root / "s1.jsonl"),
        str(root / "w1"),
        save_to=str(root / "olmo"),
    )
    step_dir = str(root / "olmo" / f"step{STAGE1}")
    imported, fresh = str(root / "imported"), str(root / "fresh")
    for out, extra in ((imported, []), (fresh, ["--fresh_moments"])):
        args = ["from-olmo-core", step_dir, "--out", out, "--config", TINY, *extra, *stage2(data)]
        if convert.main(args):
            raise RuntimeError(f"import failed: {args}")
    olmax_s2 = str(root / "run_imported" / "checkpoints" / str(STAGE2))
    runs = {
        "imported": (str(root / "run_imported"), stage2(data, f"checkpoint.init_from={imported}")),
        "continued": (str(root / "run_continued"), stage3(data, f"checkpoint.init_from={olmax_s2}")),
        "fresh": (str(root / "run_fresh"), stage2(data, f"checkpoint.init_from={fresh}")),
    }
    proc = sfs.start_olmax(root / "olmax", list(runs.values()))
    try:
        out, state = str(root / "ref.jsonl"), str(root / "ref.npz")
        ref_lib.run(load_config(TINY, stage2(data)), out, str(root / "w2"), state, start=step_dir)
        sfs.wait_olmax(root / "olmax", proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # olmax's stage-2 step -> OLMo-core's format -> OLMo-core continues it (stage 3)
    exported = str(root / "exported")
    if convert.main(["to-olmo-core", olmax_s2, "--out", exported]):
        raise RuntimeError("export failed")
    out3, state3 = str(root / "ref3.jsonl"), str(root / "ref3.npz")
    ref_lib.run(load_config(TINY, stage3(data)), out3, str(root / "w3"), state3, start=exported)
    return {
        "data": data,
        "step_dir": step_dir,
        "imported": imported,
        "fresh": fresh,
        "runs": runs,
        "ref": (out, state),
        "olmax_s2": olmax_s2,
        "exported": exported,
        "ref3": (out3, state3),
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    return build_once(tmp_path_factory, "from_olmo_core", build)


def test_olmax_continues_an_olmo_core_checkpoint_as_olmo_core_does(built):
    run_dir, overrides = built["runs"]["imported"]
    d = sfs.differences(run_dir, built["ref"][0])
    assert len(d["loss"]) == STAGE2
    assert d["lr_ref"][0] == pytest.approx(3e-3 * (1 - 1 / STAGE2)) and d["lr_ref"][-1] == 0.0
    assert_step_for_step(d)
    assert_params_close(*sfs.final_params(run_dir, overrides, STAGE2, built["ref"][1]))


def test_without_the_adam_state_the_continuation_is_measurably_off(built):
    """The same weights with fresh moments: Adam's first steps are then ~lr·sign(g), far from the
    continued moments' steps (measured: the loss differs by up to 0.21 nats, 4e4x the bound)."""
    run_dir, _ = built["runs"]["fresh"]
    d = sfs.differences(run_dir, built["ref"][0])
    assert np.abs(d["loss"]).max() > 100 * LOSS_ABS, np.abs(d["loss"]).max()


def test_the_imported_step_holds_olmo_cores_tensors_and_its_adam_count(built):
    cfg = load_config(TINY, stage2(built["data"]))
    mc = cfg.model_cfg()
    params, opt = ref_lib.restore_step(cfg, built["imported"])
    step = open_step(built["step_dir"])
    ours = names.to_olmo_state(mc, params)
    for key, value in ours.items():
        np.testing.assert_array_equal(value, step.read("model." + key), err_msg=key)
    adam = opt.inner_state[1]
    assert int(adam.count) == STAGE1
    for moments, state in ((adam.mu, "exp_avg"), (adam.nu, "exp_avg_sq")):
        for key, value in names.to_olmo_state(mc, moments).items():
            np.testing.assert_array_equal(value, step.read(f"optim.state.{key}.{state}"), err_msg=key)
    assert int(opt.seen) == 0 and not np.asarray(opt.losses).any()  # the skip step's history: empty
    _, fresh = ref_lib.restore_step(cfg, built["fresh"])
    assert int(fresh.inner_state[1].count) == 0
    assert not any(np.asarray(x).any() for x in jax.tree.leaves(fresh.inner_state[1].mu))


# ------------------------------------------------------------------------------------ refusals


def refused(capsys, args: list[str], said: str) -> None:
    assert convert.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and said in err[0], err


def args_for(built: dict, step_dir: str, out: str, *extra: str) -> list[str]:
    return ["from-olmo-core", step_dir, "--out", out, "--config", TINY, *extra, *stage2(built["data"])]


def test_refusals_are_one_line_and_write_nothing(built, tmp_path, capsys):
    out = str(tmp_path / "out")
    refused(capsys, args_for(built, str(tmp_path), out), "is not an OLMo-core step directory")
    wide = args_for(built, built["step_dir"], out, "model_overrides.mlp_hidden=128")
    refused(
        capsys,
        wide,
        "model.blocks.0.feed_forward.w1.weight: the checkpoint holds [192, 64], the recipe's model needs [128, 64]",
    )
    (tmp_path / "exists").mkdir()
    refused(
        capsys, args_for(built, built["step_dir"], str(tmp_path / "exists")), "exists; a conversion never overwrites"
    )
    torn = tmp_path / "torn"
    shutil.copytree(built["step_dir"], torn)
    victim = max((torn / "model_and_optim").glob("*.distcp"), key=os.path.getsize)
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    refused(capsys, args_for(built, str(torn), out), f"{victim.name} is torn")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exists", "torn"]  # no output, no temporary


def test_a_checkpoint_without_optimizer_state_is_refused_naming_the_opt_in(built, tmp_path, capsys):
    import torch
    import torch.distributed.checkpoint as dcp

    step = open_step(built["step_dir"])
    model_only = {"model": {k.removeprefix("model."): torch.from_numpy(step.read(k)) for k in step.model_keys()}}
    dcp.save(model_only, checkpoint_id=str(tmp_path / "m" / "model_and_optim"), no_dist=True)
    out = str(tmp_path / "out")
    refused(capsys, args_for(built, str(tmp_path / "m"), out), "no optimizer state")
    assert "--fresh_moments" in convert_err(capsys, args_for(built, str(tmp_path / "m"), out))
    assert convert.main(args_for(built, str(tmp_path / "m"), out, "--fresh_moments")) == 0
    assert (Path(out) / "olmax_checksums.json").is_file()


def convert_err(capsys, args: list[str]) -> str:
    convert.main(args)
    return capsys.readouterr().err


def with_param_groups(step_dir: str, to: Path, **changed) -> str:
    """A copy of the OLMo-core step whose every param group stores ``changed`` (field: value)."""
    import torch
    import torch.distributed.checkpoint as dcp

    step = open_step(step_dir)
    flat = {}
    for key in step.metadata.state_dict_metadata:
        field = key.rsplit(".", 1)[-1]
        if key.startswith("optim.param_groups.") and field in changed:
            flat[key] = changed[field]
        else:
            value = step.value(key)
            flat[key] = torch.from_numpy(step.read(key)) if value is None else value
    dcp.save(flat, checkpoint_id=str(to / "model_and_optim"), no_dist=True)
    return str(to)


def test_the_checkpoints_own_optimizer_settings_are_ai2s_recipes(built):
    """What the comparison reads: OLMo-core's own save stores the recipe's betas/eps, no weight
    decay on the embeddings, and the schedule's peak as initial_lr (so an import of it passes)."""
    step = open_step(built["step_dir"])
    group = {f: step.value(f"optim.param_groups.embeddings.weight.{f}") for f in ("betas", "eps", "weight_decay")}
    assert group == {"betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0}
    assert step.value("optim.param_groups.lm_head.w_out.weight.weight_decay") == 0.1
    assert step.value("optim.param_groups.lm_head.w_out.weight.initial_lr") == 3e-3


def test_another_beta_or_eps_in_the_checkpoint_is_refused_naming_both_values_and_the_opt_in(built, tmp_path, capsys):
    other = with_param_groups(built["step_dir"], tmp_path / "b2", betas=(0.9, 0.99), eps=1e-6)
    out = str(tmp_path / "out")
    err = convert_err(capsys, args_for(built, other, out)).strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    for said in (
        "optimizer.b2 (embeddings.weight): the checkpoint's param group has 0.99, the recipe gives 0.95",
        "optimizer.eps (embeddings.weight): the checkpoint's param group has 1e-06, the recipe gives 1e-08",
        "checkpoint.init_from_allow_changes=[optimizer.b2,optimizer.eps]",
    ):
        assert said in err[0], err
    assert "optimizer.b1" not in err[0]
    assert not Path(out).exists()
    # named on purpose (one setting named alone still refuses the other)
    refused(capsys, args_for(built, other, out, "checkpoint.init_from_allow_changes=[optimizer.b2]"), "optimizer.eps")
    assert convert.main(args_for(built, other, out, "checkpoint.init_from_allow_changes=[optimizer]")) == 0
    said = capsys.readouterr().out
    assert "changed on purpose (checkpoint.init_from_allow_changes): optimizer.b2" in said


def test_another_weight_decay_is_refused_and_the_embeddings_exclusion_is_named(built, tmp_path, capsys):
    other = with_param_groups(built["step_dir"], tmp_path / "wd", weight_decay=0.1)  # the embeddings too
    refused(
        capsys,
        args_for(built, other, str(tmp_path / "out")),
        "optimizer.decay_exclude (embeddings.weight): the checkpoint's param group has 0.1, the recipe gives 0.0",
    )
    other = with_param_groups(built["step_dir"], tmp_path / "wd2", weight_decay=0.0)
    refused(
        capsys,
        args_for(built, other, str(tmp_path / "out")),
        "optimizer.weight_decay (blocks.0.attention.w_q.weight): the checkpoint's param group has 0.0, "
        "the recipe gives 0.1",
    )


def test_another_learning_rate_is_reported_in_the_closing_line_not_refused(built, tmp_path, capsys):
    other = with_param_groups(built["step_dir"], tmp_path / "lr", lr=2.5e-4, initial_lr=5e-4)
    assert convert.main(args_for(built, other, str(tmp_path / "out"))) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("learning rate: the checkpoint's param groups hold lr 0.00025, initial_lr 0.0005;"), last
    assert "the recipe's lr 0.003" in last


# ------------------------------------------------------------------------------------- export


def test_olmo_core_continues_an_exported_olmax_step_as_olmax_does(built):
    """olmax's own stage-2 step → `to-olmo-core` → OLMo-core's Trainer.load_checkpoint(
    load_optim_state=True, load_trainer_state=False) trains stage 3; olmax trains the same stage
    from the same step (init_from): step for step within the same bounds."""
    run_dir, overrides = built["runs"]["continued"]
    d = sfs.differences(run_dir, built["ref3"][0])
    assert len(d["loss"]) == STAGE2
    assert_step_for_step(d)
    assert_params_close(*sfs.final_params(run_dir, overrides, STAGE2, built["ref3"][1]))


def test_export_then_import_gives_back_the_same_tensors_and_count(built, tmp_path):
    back = str(tmp_path / "back")
    assert (
        convert.main(["from-olmo-core", built["exported"], "--out", back, "--config", TINY, *stage2(built["data"])])
        == 0
    )
    cfg = load_config(TINY, stage2(built["data"]))
    (p0, o0), (p1, o1) = ref_lib.restore_step(cfg, built["olmax_s2"]), ref_lib.restore_step(cfg, back)
    for a, b in zip(jax.tree.leaves((p0, o0.inner_state[1])), jax.tree.leaves((p1, o1.inner_state[1]))):
        np.testing.assert_array_equal(a, b)
    assert int(o1.inner_state[1].count) == STAGE1 + STAGE2


def test_olmo_core_to_olmax_to_olmo_core_gives_back_every_tensor(built, tmp_path, monkeypatch):
    """AI2's own checkpoint, imported then exported: every model and optimizer-state tensor
    bit-equal to OLMo-core's (the imported step is read through olmax_read, no OCDBT; the LM head
    transposed 8 columns at a time, 64 blocks, as the 7B's is in 64 MiB blocks)."""
    from trainer.convert import to_olmo_core

    monkeypatch.setattr(to_olmo_core, "BLOCK_BYTES", 4 * 64 * 8)
    back = str(tmp_path / "back")
    assert convert.main(["to-olmo-core", built["imported"], "--out", back]) == 0
    a, b = open_step(built["step_dir"]), open_step(back)
    keys = [k for k in a.metadata.state_dict_metadata if k.startswith(("model.", "optim.state."))]
    assert len(keys) == 4 * sum(k.startswith("model.") for k in keys)  # params, two moments, step
    for key in keys:
        np.testing.assert_array_equal(a.read(key), b.read(key), err_msg=key)
