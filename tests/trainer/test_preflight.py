"""A run starts only when it can: everything checkable at start-up is refused (exit 2, one
`error:` line) before the run directory is created; the run directory has one writer (its lock,
taken over from a killed run); a shard damaged mid-run stops the run in one line (exit 1).

The refusals run in the session's one refusal process (`trainer_process`, tests/trainer/shared_process.py):
the same command, exit status and output as a `python -m trainer.main` of their own, without JAX's
start per case. The refused resume below stays a process of its own: the real-process path of a
refusal after the lock and the checkpoint restore (the other phases': tests/trainer/shared_process.py)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time

import pytest
from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter

from contract.lock import LOCK_NAME
from dataloader import LoaderConfig
from tests.contract.test_lock import hold
from tests.trainer.conftest import HANG_GUARD_S, ROOT, trainer_cmd, trainer_env
from trainer import preflight

SHARD = "prose/train-00000-of-00002.arrayrecord"


def run(data, run_dir, *overrides, timeout=HANG_GUARD_S):
    return subprocess.run(
        trainer_cmd(data, run_dir, *overrides),
        cwd=ROOT,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def refuse(trainer_process, data, run_dir, *overrides):
    """`run(...)` of a start that is refused, in the session's refusal process."""
    return trainer_process.run(trainer_cmd(data, run_dir, *overrides))


def errors(proc):
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def reverse_records(path):  # a valid shard with as many records: only its sha256 tells
    reader = ArrayRecordReader(str(path))
    records = reader.read_all()
    reader.close()
    writer = ArrayRecordWriter(str(path), "group_size:1")
    for r in records[::-1]:
        writer.write(r)
    writer.close()


def damage(kind, data):
    shard = data.parent / SHARD
    if kind == "deleted":
        shard.unlink()
    elif kind == "truncated":
        shard.write_bytes(shard.read_bytes()[:1000])
    elif kind == "replaced":
        reverse_records(shard)


@pytest.fixture
def data(data_manifest, tmp_path):
    shutil.copytree(data_manifest.parent, tmp_path / "data")
    return tmp_path / "data" / "manifest.json"


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides, damaged, says",
    [
        (
            ["mesh.data=3"],
            None,
            "mesh 3×-1×1 (data×fsdp×tensor) with global_batch_size=4 on 2 device(s) of 1 "
            "process(es): mesh {'data': 3, 'fsdp': -1, 'tensor': 1} does not divide 2 devices",
        ),
        (["global_batch_size=100000000"], None, "global_batch_size=100000000 cannot fit this host's memory"),
        ([], "deleted", "shard missing: prose/train shard 0 ("),
        ([], "truncated", "shard prose/train shard 0 ("),
        ([], "replaced", "its sha256 differs from the manifest's"),
        (["verify_data_gib=0"], "truncated", "fails the loader's checks"),
    ],
)
def test_what_cannot_run_is_refused_in_one_line_before_the_run_dir_exists(
    trainer_process, data, tmp_path, overrides, damaged, says
):
    damage(damaged, data)
    proc = refuse(trainer_process, data, tmp_path / "run", *overrides)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(errors(proc)) == 1 and says in errors(proc)[0] and "Traceback" not in proc.stderr
    if damaged:
        assert "python -m audit --data" in errors(proc)[0] or damaged == "deleted"
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("where", ["file", "under a file"])
def test_a_run_dir_that_cannot_be_a_directory_is_refused_in_one_line(trainer_process, data, tmp_path, where):
    (tmp_path / "f").write_text("mine")
    run_dir = tmp_path / "f" if where == "file" else tmp_path / "f" / "run"
    proc = refuse(trainer_process, data, run_dir)
    assert proc.returncode == 2 and len(errors(proc)) == 1 and "Traceback" not in proc.stderr
    assert "is not a directory" in errors(proc)[0] and (tmp_path / "f").read_text() == "mine"


def snapshot(folder):
    return sorted(
        (str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()
    )


@pytest.mark.slow
def test_a_run_dir_in_use_is_refused_naming_its_holder_and_left_untouched(
    trainer_process, data, reference_run, tmp_path
):
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir)
    holder = hold(run_dir)
    try:
        before = snapshot(run_dir)
        proc = refuse(trainer_process, data, run_dir, "steps=12")
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert len(errors(proc)) == 1 and f"is in use by pid {holder.pid} on host " in errors(proc)[0]
        assert snapshot(run_dir) == before
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_a_running_trainer_holds_its_run_dir_and_a_killed_ones_lock_is_taken_over(trainer_process, data, tmp_path):
    run_dir = tmp_path / "run"
    first = subprocess.Popen(
        trainer_cmd(data, run_dir, "steps=400", "checkpoint.every=0"),
        cwd=ROOT,
        env=trainer_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 180
        while not (run_dir / "metrics.jsonl").exists() and time.time() < deadline and first.poll() is None:
            time.sleep(0.5)  # training: past start-up
        holder = json.loads((run_dir / LOCK_NAME).read_text())
        assert holder["pid"] == first.pid and holder["purpose"] == "python -m trainer.main"
        second = refuse(trainer_process, data, run_dir, "steps=4")
        assert second.returncode == 2 and f"is in use by pid {first.pid}" in errors(second)[0]
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    third = run(data, run_dir, "steps=4")
    assert third.returncode == 0, third.stderr[-3000:]
    assert f"taking over the lock of pid {first.pid}" in third.stderr
    assert (run_dir / LOCK_NAME).read_text() == ""  # released at the end


@pytest.mark.slow
def test_a_shard_that_breaks_mid_run_stops_the_run_in_one_line_naming_shard_record_and_the_audit(data, tmp_path):
    shard = data.parent / SHARD
    raw = bytearray(shard.read_bytes())
    for off in range(1500, 20000, 300):  # records 0 and last still read: the open checks pass
        raw[off] ^= 0x55
    shard.write_bytes(bytes(raw))
    proc = run(data, tmp_path / "run", "verify_data_gib=0", "steps=8")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and len(errors(proc)) == 1
    assert errors(proc)[0].startswith("error: cannot read record ") and f"of shard {shard} " in errors(proc)[0]
    assert f"python -m audit --data {data}" in errors(proc)[0]
    # the start-up log said which shards were hashed: none, at verify_data_gib=0
    assert "shard contents: 0 of 4 shards hashed" in proc.stderr  # train and held-out (eval.every=4)
    assert "prose/train: shards none of 2 hashed; NOT hashed: shards 0-1" in proc.stderr
    assert "prose/heldout: shards none of 2 hashed; NOT hashed: shards 0-1" in proc.stderr


def test_the_batch_memory_estimate_refuses_only_what_cannot_fit():
    cfg = LoaderConfig(data=["m.json"], global_batch_size=512)
    small = preflight.batch_host_bytes(512, 64, 8192, cfg, evaluates=True, on_cpu=False)  # stage 1 on 64 hosts
    assert sum(small.values()) < 2**30
    assert preflight.memory_problem(small, 8 * 2**30, 512, 64, 8192) is None
    huge = preflight.batch_host_bytes(10**8, 1, 32, cfg, evaluates=False, on_cpu=True)
    # one batch alone is 10^8 rows x 32 tokens x 16 bytes: more than 47 GiB
    assert sum(huge.values()) > 5 * 10**8 * 32 * 16
    assert "cannot fit this host's memory" in preflight.memory_problem(huge, 24 * 2**30, 10**8, 1, 32)
    assert preflight.memory_problem(huge, None, 10**8, 1, 32) is None  # unknown memory: not refused


def test_a_run_dir_or_init_from_with_brackets_is_refused_because_orbax_would_never_restore_it(tmp_path):
    # orbax globs with the checkpoint's own path in the pattern: "br[1]" is a class matching "br1"
    for path in (tmp_path / "br[1]", tmp_path / "a]b" / "run"):
        problem = preflight.run_dir_problem(path)
        assert problem and str(path) in problem and "brackets" in problem
    assert "checkpoint.init_from" in preflight.glob_problem(
        tmp_path / "s[1]" / "checkpoints" / "8", "checkpoint.init_from"
    )
    for fine in ("with space", "ünïcode", "star*", "question?"):
        assert preflight.run_dir_problem(tmp_path / fine) is None


def test_a_run_dir_that_holds_another_commands_output_is_refused_after_the_sample_data_too(tmp_path):
    """The start-up's own check (trainer.main's runs before anything; this one after the sample data
    was made, which may have made it in the run directory itself)."""
    (tmp_path / "audit").mkdir()
    (tmp_path / "audit" / "audit.json").write_text("{}")
    assert "holds an audit report (audit.json" in preflight.run_dir_problem(tmp_path / "audit")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text("{}")
    assert preflight.run_dir_problem(tmp_path / "run") is None  # a run to resume


def tree(folder):
    """Every path under `folder`, each file with its bytes and mtime: what "left as found" compares."""
    return [
        (str(p.relative_to(folder)), p.is_dir(), None if p.is_dir() else (p.read_bytes(), p.stat().st_mtime_ns))
        for p in sorted(folder.rglob("*"))
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, overrides, says",
    [
        ("run", ["lr=-1"], "lr"),  # a bad config value
        ("new/run", ["steps=1", "checkpoint.init_from={missing}"], "no ['params', 'opt_state'] item there"),
        # refused once the mesh is built: microbatches=3, test_microbatches.py's
        # test_a_batch_that_does_not_split_into_the_microbatches_exits_2 (its exact line, and no trace)
        ("br[1]", ["steps=1"], "brackets"),  # a run_dir orbax cannot restore
    ],
)
def test_a_refused_start_leaves_no_trace_not_even_the_run_dir(trainer_process, data, tmp_path, name, overrides, says):
    parent = tmp_path / "parent"
    parent.mkdir()
    before = tree(parent)
    missing = str(tmp_path / "nothing")
    proc = refuse(trainer_process, data, parent / name, *[o.replace("{missing}", missing) for o in overrides])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(errors(proc)) == 1 and says in errors(proc)[0] and "Traceback" not in proc.stderr
    assert tree(parent) == before


@pytest.mark.slow
def test_a_refused_resume_leaves_the_run_dir_exactly_as_it_found_it(data_manifest, reference_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir)
    before = tree(run_dir)
    assert (run_dir / LOCK_NAME).exists()  # left by the finished run, released (empty)
    proc = run(data_manifest, run_dir, "steps=12", "optimizer.b2=0.9")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(errors(proc)) == 1 and "cannot resume from checkpoint 8" in errors(proc)[0]
    assert "optimizer.b2: checkpoint has 0.95, config gives 0.9" in proc.stderr
    assert tree(run_dir) == before  # the lock file too: its content and its mtime
