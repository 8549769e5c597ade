"""`python -m trainer.convert to-olmo-core`'s own refusals (its round trips with OLMo-core are in
test_from_olmo_core.py, on the shared OLMo-core-trained fixture)."""

from __future__ import annotations

import numpy as np

from contract.rundir import RunDir
from tests.trainer.checkpoint_fixtures import Loader, make_state
from trainer.checkpointing.checkpoints import Checkpoints
from trainer.config.schema import CheckpointConfig
from trainer.convert import __main__ as convert


def test_a_step_without_adam_state_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys):
    """An olmax step whose opt_state holds no Adam moments (here a bare count): OLMo-core's
    SkipStepAdamW could not continue it, so nothing is exported."""
    params, _ = make_state()
    run = tmp_path / "run"
    ckpt = Checkpoints(RunDir(run), CheckpointConfig())
    ckpt.save(3, params, {"count": np.zeros((), np.int32)}, Loader(3), {"step": 3})
    ckpt.wait()
    ckpt.close()
    out = tmp_path / "out"
    assert convert.main(["to-olmo-core", str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert "no Adam state (mu, nu, count) in its opt_state: nothing to continue" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no output, no temporary
