"""What OLMo-core 3.0.0 itself does with a checkpoint's param groups when a new stage loads it
(``load_optim_state=True``: torch's ``Optimizer.load_state_dict``, which DCP's
``set_optimizer_state_dict`` calls), on OLMo-core's own SkipStepAdamW config of a tiny model:
the new config's ``initial_lr`` is put back after the load (its ``fixed_fields``), so the schedule
scales from the new stage's lr, as olmax's does; betas, eps and weight decay stay the
checkpoint's, which is why ``from-olmo-core`` refuses a recipe that differs in them
(trainer/convert/optim_groups.py; the refusals are tested in test_from_olmo_core.py). The whole
Trainer route (save, then ``Trainer.load_checkpoint``) is ``bench/olmo_stage_lr.py``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
olmo_optim = pytest.importorskip("olmo_core.optim")


def build(lr: float, b2: float, eps: float, wd: float):
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"embeddings": torch.nn.Embedding(8, 4), "w_out": torch.nn.Linear(4, 8, bias=False)})
    cfg = olmo_optim.SkipStepAdamWConfig(
        lr=lr,
        betas=(0.9, b2),
        eps=eps,
        weight_decay=wd,
        group_overrides=[olmo_optim.OptimGroupOverride(params=["embeddings.weight"], opts={"weight_decay": 0.0})],
    )
    return model, cfg.build(model)


def test_olmo_core_keeps_the_new_configs_initial_lr_and_the_checkpoints_betas_eps_and_decay():
    model, old = build(lr=3e-3, b2=0.95, eps=1e-8, wd=0.1)
    saved = old.state_dict()
    for g in saved["param_groups"]:
        g["lr"] = 1.2e-3  # where stage 1's schedule ended
    _, new = build(lr=1e-3, b2=0.99, eps=1e-6, wd=0.05)
    new.load_state_dict(saved)
    for g in new.param_groups:
        assert g["initial_lr"] == 1e-3  # the new config's: fixed_fields reset it after the load
        assert g["lr"] == 1.2e-3  # the checkpoint's, until the scheduler's first set_lr
        assert g["betas"] == (0.9, 0.95) and g["eps"] == 1e-8  # the checkpoint's, not the config's
    assert sorted(g["weight_decay"] for g in new.param_groups) == [0.0, 0.1]  # the checkpoint's
    trainer = type("T", (), {"global_step": 1, "max_steps": 4})()
    lr = olmo_optim.LinearWithWarmup(warmup=0, alpha_f=0.0).set_lr(new.param_groups[0], trainer)
    assert lr == pytest.approx(1e-3 * 3 / 4)  # scaled from the new stage's peak
