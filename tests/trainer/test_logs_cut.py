"""A resume cuts each JSONL log in place, at a byte offset found reading backwards, with the bytes
the old whole-file rewrite made (kept here as the reference), for any log and cut point."""

from __future__ import annotations

import json
import os
import random

import pytest

from trainer import logs


def rewrite_reference(path, before_step):
    """The cut as olmax made it before: every line parsed, the kept ones rewritten whole."""
    keep = [r for r in logs.read_jsonl(path) if r["step"] < before_step]
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in keep)
    os.replace(tmp, path)


def random_log(rng):
    """A log as olmax writes it (json.dumps rows in step order, gaps allowed), perhaps with a
    torn last line: a prefix of the next row, or the whole row without its newline."""
    step, lines = rng.randrange(3), []
    for _ in range(rng.randrange(25)):
        row = {
            "step": step,
            "loss": rng.random() * 10,
            "note": "é✓" * rng.randrange(3),
            "xs": list(range(rng.randrange(40))),
        }
        if rng.random() < 0.1:
            row["heldout_loss"] = float("nan") if rng.random() < 0.3 else rng.random()
        lines.append(json.dumps(row) + "\n")
        step += rng.choice((1, 1, 1, 2, 5))
    text = "".join(lines)
    torn = rng.random()
    if torn < 0.3:
        nxt = json.dumps({"step": step, "loss": 1.5})
        text += nxt[: rng.randrange(1, len(nxt) + 1)]
    return text, step


def test_a_log_cut_in_place_equals_the_old_rewrite_byte_for_byte(tmp_path, monkeypatch):
    rng = random.Random(41)
    old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    for case in range(300):
        text, last = random_log(rng)
        before = rng.randrange(-1, last + 3)
        monkeypatch.setattr(logs, "BLOCK", rng.choice((1, 3, 7, 64, 1 << 16)))  # lines across blocks
        for p in (old, new):
            p.write_text(text)
        rewrite_reference(old, before)
        logs.truncate_jsonl(new, before)
        assert new.read_bytes() == old.read_bytes(), (case, before, text)


def test_the_cut_reads_only_the_lines_it_removes(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "pad": "x" * 100}) + "\n" for s in range(100_000)))
    read = []
    real_open = open

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

        def read(self, n):
            read.append(n)
            return self.f.read(n)

        def __getattr__(self, name):
            return getattr(self.f, name)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("builtins.open", lambda *a, **k: Counting(real_open(*a, **k)))
        assert logs.truncate_jsonl(path, 99_990) == 10
    assert sum(read) <= logs.BLOCK  # 10 lines of ~120 bytes: one block, not 12 MB
    assert [r["step"] for r in logs.tail_rows(path)][:2] == [99_989, 99_988]


def test_the_summary_comes_from_the_tail_of_the_log(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "loss": float(s)} | ({"heldout_loss": s / 2} if s % 7 == 0 else {}) for s in range(30)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 30, "lo')
    assert logs.summary_of_tail(path) == {"last_losses": [float(s) for s in range(20, 30)], "heldout_loss": 14.0}
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(3)))
    assert logs.summary_of_tail(path) == {"last_losses": [1.0] * 3, "heldout_loss": None}


def _data_logs(run_dir, count, steps):
    """Every host's data log of ``count`` hosts, a line per step in ``steps``."""
    from contract import data_log_name

    folder = run_dir / "data_log"
    folder.mkdir(exist_ok=True)
    for h in range(count):
        with open(folder / data_log_name(h, count), "a") as f:
            f.writelines(json.dumps({"step": s, "index": [s * count + h], "example": [s]}) + "\n" for s in steps)


def _steps(path):
    return [r["step"] for r in logs.read_jsonl(path)]


def test_an_elastic_restart_cuts_the_old_host_counts_logs_once_and_never_opens_them_again(tmp_path, monkeypatch):
    from contract import RunDir, data_log_name

    run = RunDir(tmp_path)
    _data_logs(tmp_path, 4, range(20))  # a run on 4 hosts, killed after step 19, its newest checkpoint 10
    _data_logs(tmp_path, 2, [])  # restarted on 2 hosts
    assert logs.truncate_other_data_logs(run, 2, 10) == 4
    old = [run.data_log / data_log_name(h, 4) for h in range(4)]
    assert all(_steps(p) == list(range(10)) for p in old)
    assert set(json.loads(run.data_logs_settled.read_text())["logs"]) == {p.name for p in old}

    def untouchable(path, before_step):
        raise AssertionError(f"{path} opened again")

    names, real_open, real_truncate = set(map(str, old)), open, logs.truncate_jsonl
    monkeypatch.setattr(logs, "truncate_jsonl", lambda p, b: (untouchable if str(p) in names else real_truncate)(p, b))
    monkeypatch.setattr(
        "builtins.open", lambda p, *a, **k: untouchable(p, 0) if str(p) in names else real_open(p, *a, **k)
    )
    for before in (10, 12, 30):  # later restarts at or past the cut: not one old log opened
        assert logs.truncate_other_data_logs(run, 2, before) == 0
    assert logs.truncate_other_data_logs(run, 3, 30) == 2  # yet another host count: the 2 hosts' logs
    assert logs.truncate_other_data_logs(run, 3, 31) == 0  # (once)


def test_a_restart_before_the_settled_cut_or_after_the_old_count_wrote_again_cuts_again(tmp_path):
    from contract import RunDir, data_log_name

    run = RunDir(tmp_path)
    _data_logs(tmp_path, 4, range(20))
    assert logs.truncate_other_data_logs(run, 2, 10) == 4
    _data_logs(tmp_path, 2, range(10, 16))
    # the checkpoints after 10 lost: a restart from 6 on 2 hosts cuts the old logs again
    assert logs.truncate_other_data_logs(run, 2, 6) == 4
    assert _steps(run.data_log / data_log_name(3, 4)) == list(range(6))
    # back on 4 hosts: their logs leave the record (the run appends to them) ...
    assert logs.truncate_other_data_logs(run, 4, 6) == 2
    assert set(json.loads(run.data_logs_settled.read_text())["logs"]) == {data_log_name(h, 2) for h in range(2)}
    _data_logs(tmp_path, 4, range(6, 14))
    # ... so when the run moves on to 2 hosts again their lines from step 12 on are cut
    assert logs.truncate_other_data_logs(run, 2, 12) == 4
    assert all(_steps(run.data_log / data_log_name(h, 4)) == list(range(12)) for h in range(4))
    # an unreadable record is no record: every other count's log is cut again, never skipped wrongly
    run.data_logs_settled.write_text("{not json")
    assert logs.truncate_other_data_logs(run, 2, 12) == 4
    # a log written to after its cut was recorded (a start on its host count killed before the
    # record dropped it): its size gives it away, and it is cut again
    _data_logs(tmp_path, 4, range(12, 16))
    assert logs.truncate_other_data_logs(run, 2, 14) == 4
    assert all(_steps(run.data_log / data_log_name(h, 4)) == list(range(14)) for h in range(4))
