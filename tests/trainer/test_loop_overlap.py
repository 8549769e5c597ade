"""The loop never waits on the device between two steps: a step's metrics are read once the next
step is dispatched, except at a boundary (checkpoint, evaluation, the last step), where the loop
reads the step it just dispatched before saving or evaluating. (The step is a stand-in that
records when it is dispatched and when its metrics are read: the order is the loop's alone.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tests.trainer.conftest import BASE_OVERRIDES, ROOT, read_jsonl


class _Read:
    """A metric value that records when the loop first reads it (float: the loop's synchronisation)."""

    def __init__(self, value, step: int, events: list):
        self.value, self.step, self.events = value, step, events

    def __float__(self) -> float:
        if ("read", self.step) not in self.events:
            self.events.append(("read", self.step))
        return float(self.value)


def test_a_steps_metrics_are_read_after_the_next_step_is_dispatched_except_at_boundaries(
    data_manifest, tmp_path, monkeypatch
):
    from trainer import loop, main

    events: list[tuple[str, int]] = []
    real_build = loop.build

    def build(checked):
        b = real_build(checked)

        def train_step(params, opt_state, lr, batch):  # the loop's view of a step: dispatch, then metrics
            s = sum(e == "dispatch" for e, _ in events)  # this run starts at step 0
            events.append(("dispatch", s))
            m = {"loss": 5.0 - s / 10, "z_loss": 0.0, "target_tokens": 124.0, "grad_norm": 1.0}
            return params, opt_state, {k: _Read(v, s, events) for k, v in {**m, "skipped": 0.0}.items()}

        return dataclasses.replace(b, train_step=train_step)

    monkeypatch.setattr(loop, "build", build)
    monkeypatch.chdir(ROOT)
    run_dir = tmp_path / "run"
    overrides = [o for o in BASE_OVERRIDES if not o.startswith(("eval.every", "checkpoint.every"))]
    args = ["--config", str(ROOT / "trainer/configs/tiny.yaml"), "--run_dir", str(run_dir), f"data={data_manifest}"]
    assert main.main([*args, *overrides, "steps=6", "checkpoint.every=3", "eval.every=0"]) == 0
    d, r = (lambda s: ("dispatch", s)), (lambda s: ("read", s))
    # steps 0, 1, 3, 4 are read one step late; 2 (a checkpoint) and 5 (the last step) at once
    assert events == [d(0), d(1), r(0), d(2), r(1), r(2), d(3), d(4), r(3), d(5), r(4), r(5)]
    rows = read_jsonl(Path(run_dir) / "metrics.jsonl")
    assert [row["step"] for row in rows] == list(range(6))
    assert [row["loss"] for row in rows] == [5.0 - s / 10 for s in range(6)]  # each row its own step's
    assert all(row["step_time_s"] > 0 and row["tokens"] == (row["step"] + 1) * 4 * 32 for row in rows)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()) == ["3", "6"]
