"""The run check's memory is flat in the run's length: per-epoch read counts are an array over
the plan's examples, replays keep a digest only for the steps logged twice, the logs stream."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from audit import runlog
from audit.runner import read_run
from bench.audit_scale import write_case
from contract import INDEX_SHUFFLE
from contract.rundir import RunDir
from dataloader.plan import SourceSpec, make_plan, plan_from_manifests


def traced_run_check(mpath: str, run: str) -> tuple[runlog.RunFindings, int]:
    import json

    with open(mpath) as f:
        plan = plan_from_manifests([json.load(f)], "train")
    inputs = read_run(RunDir(run))
    rec, summary = inputs.record, inputs.summary
    cfg = runlog.RunConfig(
        rec.global_batch_size,
        rec.seed,
        rec.loader_fingerprint,
        summary.data_sha256,
        summary.step,
        rec.hosts,
        INDEX_SHUFFLE,
        inputs.missing,
    )
    tracemalloc.start()
    found = runlog.check_run(RunDir(run), plan, cfg)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return found, peak


def test_run_check_memory_does_not_grow_with_the_steps_read(tmp_path, monkeypatch):
    """One plan of 163,840 positions; runs of 40 and 160 steps × 512 on 8 hosts: the longer run
    reads 4× the positions and logs 4× the (host, step) lines, in the same memory (the logs are
    merged 16 steps at a time and read 8 KiB at a time here, so that both runs hold more than a
    window and each host's log more than a block)."""
    from audit import datalogs

    monkeypatch.setattr(datalogs, "WINDOW", 16)
    monkeypatch.setattr(datalogs, "_BLOCK", 8 << 10)
    peaks = {}
    for steps in (40, 160):
        mpath, run = write_case(str(tmp_path / str(steps)), steps, hosts=8, positions=160 * 512 * 2)
        found, peaks[steps] = traced_run_check(mpath, run)
        assert found.result.passed, found.result.failures
        assert found.result.figures["steps_logged"] == steps
    assert peaks[160] <= 1.1 * peaks[40] + 256 * 1024, {k: f"{v / 2**20:.2f} MiB" for k, v in peaks.items()}


def _step(step: int, index: np.ndarray, example: np.ndarray, host: int = 0) -> runlog.Step:
    return runlog.Step.from_lines(step, [(1, host, index.astype(np.int64), example.astype(np.int64))])


def test_read_counts_stay_exact_past_the_counter_dtype():
    """An example planned 254× per epoch (uint8 counts) read 264×: each read past the plan is
    named with its true count, beyond the counter's 255."""
    plan = make_plan(
        [SourceSpec("a", 0, 1, 1, 254.0, float("inf")), SourceSpec("b", 1, 10, 10, 10.0, float("inf"))], ["fp"], "train"
    )
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


def test_the_fast_line_reader_reads_what_the_contract_reads(tmp_path):
    """Lines as the trainer writes them take the fast path; from the first other line (compact
    separators, spaces, a blank line) the contract's reader takes over: the same rows either way."""
    import json

    from audit.datalogs import iter_rows
    from contract import data_log_row, iter_data_log

    rows = [data_log_row(s, [2 * s, 2 * s + 1], [7 << 40 | s, s]) for s in range(6)]
    lines = [json.dumps(r) for r in rows]
    lines[2] = json.dumps(rows[2], separators=(",", ":"))
    lines[4] = "  " + lines[4].replace(", ", " ,  ")
    path = tmp_path / "host-00000-of-00001.jsonl"
    path.write_text("\n".join(lines[:3]) + "\n\n" + "\n".join(lines[3:]))  # a blank line; no final newline
    want = [(n, r["step"], r["index"], r["example"]) for n, r in iter_data_log(str(path))]
    got = [(n, r["step"], i.tolist(), e.tolist()) for n, r, i, e in iter_rows(str(path))]
    assert got == want and [g[1] for g in got] == list(range(6))


def test_steps_logged_twice_are_found_whatever_the_line_format(tmp_path):
    """The first pass that picks the steps needing a replay digest reads every line's step: a
    replayed line in another JSON layout counts too (a missed one would skip its comparison)."""
    import json

    from audit.datalogs import repeated_steps
    from contract import data_log_row

    rows = [data_log_row(s, [s], [s]) for s in (0, 1, 2, 1, 2, 3)]
    text = [json.dumps(r) for r in rows]
    text[3] = json.dumps(rows[3], separators=(",", ":"))
    path = tmp_path / "host-00000-of-00001.jsonl"
    path.write_text("\n".join(text) + "\n")
    assert repeated_steps(str(path)) == {1: 2, 2: 2}


@pytest.mark.parametrize("block", [1, 7, 64, 1 << 16])
def test_the_first_pass_reads_the_steps_the_line_by_line_reading_reads(tmp_path, monkeypatch, block):
    """The first pass reads blocks of lines in the trainer's form with one regex search; any block
    with another line (a blank line, compact JSON, a step of 2^63, a carriage return, no final
    newline, a broken line and what follows it) is read line by line: the same steps either way,
    wherever the block boundaries fall."""
    import json

    from audit import datalogs
    from contract import data_log_row

    rows = [json.dumps(data_log_row(s, [s], [s])) for s in (0, 1, 2, 1, 2, 3, 4, 5, 6)]
    variants = {
        "plain": rows,
        "blank": rows[:4] + [""] + rows[4:],
        "compact": rows[:3] + [json.dumps(data_log_row(1, [1], [1]), separators=(",", ":"))] + rows[4:],
        "too big": rows[:5] + [rows[5].replace('"step": 3', f'"step": {1 << 63}')] + rows[6:],
        "carriage return": rows[:2] + [rows[2] + "\r"] + rows[3:],
        "broken": rows[:6] + ['{"step": 9, "index": [1, 2'] + rows[6:],
    }
    monkeypatch.setattr(datalogs, "_BLOCK", block)
    for name, lines in variants.items():
        for end in ("\n", ""):
            path = tmp_path / "host-00000-of-00001.jsonl"
            path.write_text("\n".join(lines) + end)
            with open(path, "rb") as f:
                want = datalogs.array("q")
                datalogs._line_steps(f, want)
            got = datalogs.logged_steps(str(path)).tolist()
            assert got == want.tolist(), (name, end)
            if name in ("plain", "blank", "broken"):
                assert got == [0, 1, 2, 1, 2, 3] + ([] if name == "broken" else [4, 5, 6]), (name, end)
