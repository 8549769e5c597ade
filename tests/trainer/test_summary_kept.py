"""summary.json's losses are kept as the run goes and saved with each checkpoint: a run stopped at
any step and resumed (a fresh process, from the checkpoint's meta) ends with the summary of an
unbroken run, without reading metrics.jsonl back."""

from __future__ import annotations

import json
import math
import random

import pytest

from trainer import logs


def random_rows(rng: random.Random, n: int) -> list[dict]:
    rows = []
    for s in range(n):
        row = {"step": s, "loss": rng.random() * 10, "lr": 1e-3}
        if rng.random() < 0.15:
            row["heldout_loss"] = float("nan") if rng.random() < 0.1 else rng.random() * 10
        rows.append(row)
    return rows


def same(a: dict, b: dict) -> bool:
    """Equal summaries (a NaN held-out loss equals a NaN)."""
    nan = [isinstance(x["heldout_loss"], float) and math.isnan(x["heldout_loss"]) for x in (a, b)]
    if any(nan):
        return all(nan) and a["last_losses"] == b["last_losses"]
    return a == b


def test_a_summary_resumed_from_any_step_equals_the_unbroken_runs(tmp_path):
    rng = random.Random(41)
    log = tmp_path / "metrics.jsonl"
    for case in range(200):
        rows = random_rows(rng, rng.randrange(0, 40))
        unbroken = logs.RunningSummary()
        for row in rows:
            unbroken.add(row)
        # stopped at random steps, each resume a fresh object from the checkpoint's meta (JSON)
        stops = sorted(rng.sample(range(len(rows) + 1), min(len(rows) + 1, rng.randrange(1, 4))))
        kept, start = logs.RunningSummary(), 0
        for stop in [*stops, len(rows)]:
            for row in rows[start:stop]:
                kept.add(row)
            # what a checkpoint saved before the summary was kept falls back to: the cut log's tail
            log.write_text("".join(json.dumps(r) + "\n" for r in rows[:stop]))
            assert same(logs.RunningSummary.of_tail(log).to_json(), kept.to_json()), (case, stop)
            kept, start = logs.RunningSummary.from_json(json.loads(json.dumps(kept.to_json()))), stop
        assert same(kept.to_json(), unbroken.to_json()), case
        # the same as the summary read from the whole log's tail (what the run's end read before)
        assert same(kept.to_json(), logs.summary_of_tail(log)), case


@pytest.mark.slow
def test_a_resumed_runs_summary_does_not_come_from_its_metrics_log(reference_run, resumed_past_a_damaged_step):
    """The reference run (8 steps, checkpoints 4 and 8, evaluated after 4 and 8) resumed from
    checkpoint 4 with metrics.jsonl's lines before it lost (conftest's fixture; its checkpoint 8 is
    damaged, so 4 is the newest intact step): the summary still quotes the losses of all 8 steps, as
    the unbroken run's does (read from the log, it would quote steps 4-7 only)."""
    run_dir, stderr = resumed_past_a_damaged_step
    assert "restored checkpoint 4" in stderr
    ref = json.loads((reference_run / "summary.json").read_text())
    got = json.loads((run_dir / "summary.json").read_text())
    assert len(ref["last_losses"]) == 8 and ref["heldout_loss"] is not None
    assert got["last_losses"] == ref["last_losses"] and got["heldout_loss"] == ref["heldout_loss"]
    assert got["params_sha256"] == ref["params_sha256"]
    assert [r["step"] for r in logs.read_jsonl(run_dir / logs.METRICS)] == [4, 5, 6, 7]
