"""The run check's memory is flat in the run's length: per-epoch read counts are an array over
the plan's examples, replays keep a digest only for the steps logged twice, the logs stream."""
from __future__ import annotations

import tracemalloc

import numpy as np

from audit import runlog
from audit.audit import read_run
from bench.audit_scale import write_case
from contract import INDEX_SHUFFLE
from dataloader.plan import SourceSpec, make_plan, plan_from_manifests


def traced_run_check(mpath: str, run: str) -> tuple[runlog.RunFindings, int]:
    import json

    with open(mpath) as f:
        plan = plan_from_manifests([json.load(f)], "train")
    inputs = read_run(run)
    rec, summary = inputs.record, inputs.summary
    cfg = runlog.RunConfig(rec.global_batch_size, rec.seed, rec.loader_fingerprint, summary.data_sha256,
                           summary.step, rec.hosts, INDEX_SHUFFLE, inputs.missing)
    tracemalloc.start()
    found = runlog.check_run(run, plan, cfg)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return found, peak


def test_run_check_memory_does_not_grow_with_the_steps_read(tmp_path):
    """One plan of 163,840 positions; runs of 40 and 160 steps × 512 on 8 hosts: the longer run
    reads 4× the positions and logs 4× the (host, step) lines, in the same memory."""
    peaks = {}
    for steps in (40, 160):
        mpath, run = write_case(str(tmp_path / str(steps)), steps, hosts=8, positions=160 * 512 * 2)
        found, peaks[steps] = traced_run_check(mpath, run)
        assert found.result.passed, found.result.failures
        assert found.result.figures["steps_logged"] == steps
    assert peaks[160] <= 1.1 * peaks[40] + 256 * 1024, {k: f"{v / 2**20:.2f} MiB" for k, v in peaks.items()}


def _step(step: int, index: np.ndarray, example: np.ndarray, host: int = 0) -> runlog.Step:
    return runlog.Step(step, [(1, host, index.astype(np.int64), example.astype(np.int64))])


def test_read_counts_stay_exact_past_the_counter_dtype():
    """An example planned 254× per epoch (uint8 counts) read 264×: each read past the plan is
    named with its true count, beyond the counter's 255."""
    plan = make_plan([SourceSpec("a", 0, 1, 1, 254.0, float("inf")), SourceSpec("b", 1, 10, 10, 10.0, float("inf"))],
                     ["fp"], "train")
    assert plan.size == 264 and plan.counts[0] == 254
    epochs = runlog.Epochs(plan, runlog.Evidence())
    assert epochs.counts.dtype == np.uint8
    for s in range(0, 264, 8):
        epochs.step(_step(s // 8, np.arange(s, s + 8), np.zeros(8)))  # every position reads record 0 of a
    assert epochs.over == 10
    first = {key: (0, 0) for key in epochs.f.wanted()}
    assert len(first) == 1  # one example, one epoch
    text = epochs.f.finish(first).items
    assert [int(m.split("read ")[1].split("×")[0]) for m in text] == list(range(255, 265)), text
    assert "the plan reads it 254× per epoch" in text[-1]
