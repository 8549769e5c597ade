"""`python -m trainer.main` on the chip, with the one-chip proxy recipe (olmo3-7b-proxy-v5e.yaml)
scaled down to test size (its width, seq_len and steps overridden; its vocabulary, optimizer, fp32
state, skip step and step structure kept) on real shards of the sample made by pipelines.tokenize:

* SIGKILL mid-run, then the same command again: bit-identical parameters, losses and data stream
  to an unbroken run;
* SIGKILL at each point after a save (the next step, an evaluation, the next save written or
  sealed but not committed; tests.trainer.kill_at), again and again in one run directory: each
  start resumes from the newest committed step, the end is bit-identical to an unbroken run;
* a checkpoint written on the chip restores on the CPU backend bit for bit (with today's
  verification), and one written on the CPU restores on the chip;
* audit accepts the chip run's logs.

Every trainer run is a subprocess, as a user runs it: the pytest process never opens the chip
(tests/conftest.py asks for the backend in a child and runs these tests before any in-process TPU
test). Without a TPU they skip, unless OLMAX_TPU_TESTS_ON_CPU=1: then they run the same way on the
CPU backend at CPU sizes (a dry run; the cross-backend test is then CPU to CPU).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import on_tpu

pytestmark = [pytest.mark.tpu, pytest.mark.tpu_subprocesses]

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "trainer/configs/olmo3-7b-proxy-v5e.yaml"
MIXTURE = ROOT / "data_manifests/mixtures/sample-proxy.yaml"
STEPS, KILL_AFTER = 6, 4  # the reference run; the killed run dies once checkpoint 4 exists
TIMEOUT_S = 900

# The proxy's 7B-wide layer scaled down so that a run takes seconds, on the chip and on the CPU
# that restores its checkpoints (the 32k proxy vocabulary, dtypes and step structure stay).
SIZES = {
    "tpu": {
        "seq_len": 2048,
        "model": {
            "n_layers": 2,
            "d_model": 256,
            "n_heads": 2,
            "n_kv_heads": 2,
            "head_dim": 128,
            "mlp_hidden": 704,
            "attention_chunk": 1024,
        },
    },
    "cpu": {
        "seq_len": 256,
        "model": {
            "n_layers": 2,
            "d_model": 64,
            "n_heads": 2,
            "n_kv_heads": 2,
            "head_dim": 32,
            "mlp_hidden": 192,
            "attention_chunk": 128,
        },
    },
}


def backend() -> str:
    return "tpu" if on_tpu() else "cpu"


# One XLA compilation cache for this module's trainer starts (JAX's persistent cache; the CPU
# sessions get theirs from tests/conftest.py): the kill-point chain starts the same program seven
# times, and on the chip each compile of the proxy step (its 1024 x 2048 splash blocks) takes about
# a minute, which had pushed the chain past its device call. These tests do not time the step.
CHIP_CACHE = os.environ.get("JAX_COMPILATION_CACHE_DIR") or tempfile.mkdtemp(prefix="olmax-chip-xla-cache-")


def env_for(platform: str | None = None) -> dict[str, str]:
    """The trainer's environment; `platform`: force JAX onto it (None: JAX's default, the chip)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.setdefault("JAX_COMPILATION_CACHE_DIR", CHIP_CACHE)
    if platform is not None:
        env["JAX_PLATFORMS"] = platform
    return env


@pytest.fixture(scope="module")
def sizes() -> dict:
    return SIZES[backend()]


@pytest.fixture(scope="module")
def proxy_data(sizes) -> Path:
    """The embedded sample tokenized by pipelines.tokenize with the proxy vocabulary, at the test's
    seq_len (sample-proxy.yaml with its seq_len replaced), in out/sample-proxy-<seq_len>: built
    here when missing, or beforehand on another machine (a TPU host without Apache Beam) by the
    same job, `python -m pipelines.tokenize --mixture M --output out/sample-proxy-<seq_len>`."""
    out = ROOT / "out" / f"sample-proxy-{sizes['seq_len']}"
    if not (out / "manifest.json").is_file():
        mixture = yaml.safe_load(MIXTURE.read_text())
        mixture["seq_len"] = sizes["seq_len"]
        out.mkdir(parents=True, exist_ok=True)
        (out.parent / f"{out.name}.yaml").write_text(yaml.safe_dump(mixture))
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pipelines.tokenize",
                "--mixture",
                str(out.parent / f"{out.name}.yaml"),
                "--output",
                str(out),
            ],
            cwd=ROOT,
            env=env_for("cpu"),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "manifest.json"


def trainer_cmd(data: Path, run_dir: Path, sizes: dict, *overrides: str) -> list[str]:
    model = [f"model_overrides.{k}={v}" for k, v in sizes["model"].items()]
    return [
        sys.executable,
        "-m",
        "trainer.main",
        "--config",
        str(RECIPE),
        "--run_dir",
        str(run_dir),
        f"data=[{data}]",
        f"seq_len={sizes['seq_len']}",
        *model,
        f"steps={STEPS}",
        "checkpoint.every=2",
        "checkpoint.keep=10",
        "eval.every=3",
        "eval_batches=1",
        "schedule.warmup_steps=2",
        "schedule.decay_steps=16",
        "lr=1e-3",
        *overrides,
    ]


def run_trainer(cmd: list[str], platform: str | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=ROOT, env=env_for(platform), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"trainer failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-5000:]}"
    return proc


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def losses(run_dir: Path) -> list[float]:
    rows = jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(len(rows)))
    return [r["loss"] for r in rows]


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, proxy_data, sizes) -> Path:
    """An unbroken run of STEPS steps on JAX's default backend (the chip)."""
    run_dir = tmp_path_factory.mktemp("chip_reference")
    proc = run_trainer(trainer_cmd(proxy_data, run_dir, sizes))
    if backend() == "tpu":  # the run was on the chip, and says which published peak its MFU uses
        assert "MFU against" in proc.stderr and "cloud.google.com/tpu/docs" in proc.stderr, proc.stderr[-2000:]
        assert all(r["mfu"] is not None for r in jsonl(run_dir / "metrics.jsonl"))
    return run_dir


def test_sigkill_mid_run_then_resume_is_bit_identical_to_an_unbroken_run(reference_run, proxy_data, sizes, tmp_path):
    cmd = trainer_cmd(proxy_data, tmp_path, sizes)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env_for(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + TIMEOUT_S
    while not (tmp_path / "checkpoints" / str(KILL_AFTER)).is_dir():
        assert proc.poll() is None, (
            f"the trainer exited ({proc.returncode}) before checkpoint {KILL_AFTER}:\n{proc.stderr.read()[-4000:]}"
        )
        assert time.monotonic() < deadline, "timed out waiting for the checkpoint"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL and not (tmp_path / "summary.json").exists()
    resumed = run_trainer(cmd)  # the same command again
    assert "restored checkpoint" in resumed.stderr
    ref, got = summary(reference_run), summary(tmp_path)
    assert got["params_sha256"] == ref["params_sha256"]  # bit-identical parameters
    assert got["data_sha256"] == ref["data_sha256"]  # the same data stream
    assert losses(tmp_path) == losses(reference_run)  # every step's loss, bit for bit
    log = "data_log/host-00000-of-00001.jsonl"
    assert jsonl(tmp_path / log) == jsonl(reference_run / log)


def _restore_only(run_dir: Path, data: Path, sizes: dict, platform: str | None) -> dict:
    """Resume `run_dir` with steps = its newest checkpoint: restore (verified), train nothing, and
    report the restored parameters' sha256 (summary.json)."""
    (run_dir / "summary.json").unlink()
    proc = run_trainer(trainer_cmd(data, run_dir, sizes, f"steps={summary_step(run_dir)}"), platform)
    assert f"restored checkpoint {summary_step(run_dir)}" in proc.stderr, proc.stderr[-3000:]
    return summary(run_dir)


def summary_step(run_dir: Path) -> int:
    return max(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())


def test_a_chip_checkpoint_restores_on_the_cpu_and_a_cpu_checkpoint_on_the_chip(
    reference_run, proxy_data, sizes, tmp_path
):
    # chip → CPU: the reference run's checkpoint 6, restored by a CPU-only trainer
    on_cpu = tmp_path / "chip_to_cpu"
    shutil.copytree(reference_run, on_cpu)
    restored = _restore_only(on_cpu, proxy_data, sizes, "cpu")
    assert restored["step"] == STEPS
    assert restored["params_sha256"] == summary(reference_run)["params_sha256"]
    assert restored["data_sha256"] == summary(reference_run)["data_sha256"]
    # CPU → chip: a CPU run's checkpoint 2, restored by the trainer on JAX's default backend (the chip)
    cpu_run = tmp_path / "cpu_to_chip"
    run_trainer(trainer_cmd(proxy_data, cpu_run, sizes, "steps=2"), "cpu")
    written = summary(cpu_run)
    restored = _restore_only(cpu_run, proxy_data, sizes, None)
    assert restored["step"] == 2 and restored["params_sha256"] == written["params_sha256"]
    # the chip continues the CPU run on the same data stream (the data log picks up at step 2)
    run_trainer(trainer_cmd(proxy_data, cpu_run, sizes, "steps=3"))
    steps = [r["step"] for r in jsonl(cpu_run / "data_log/host-00000-of-00001.jsonl")]
    assert steps == [0, 1, 2]
    assert (
        jsonl(cpu_run / "data_log/host-00000-of-00001.jsonl")
        == jsonl(reference_run / "data_log/host-00000-of-00001.jsonl")[:3]
    )


def test_the_audit_accepts_the_chip_runs_logs(reference_run, proxy_data, tmp_path):
    out = tmp_path / "audit"
    proc = subprocess.run(
        [sys.executable, "-m", "audit", "--data", str(proxy_data), "--run", str(reference_run), "--out", str(out)],
        cwd=ROOT,
        env=env_for("cpu"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    audit = json.loads((out / "audit.json").read_text())
    assert audit["passed"] is True
    assert audit["checks"]["run"]["passed"] is True  # the chip run's data logs are the planned stream


# (where tests.trainer.kill_at kills the run, the step the next start must resume from), one run
# directory killed again and again; only the newest checkpoint kept (nothing older to fall back on).
KILL_CHAIN = [("step:2", 2), ("eval:4", 4), ("written:6", 4), ("sealed:6", 4)]


def test_sigkill_at_each_point_after_a_save_resumes_from_that_step_bit_identically(
    reference_run, proxy_data, sizes, tmp_path
):
    cmd = trainer_cmd(proxy_data, tmp_path, sizes, "checkpoint.keep=1")
    expected = None
    for where, resumes_from in KILL_CHAIN:
        proc = subprocess.run(
            [sys.executable, "-m", "tests.trainer.kill_at", where, *cmd[3:]],
            cwd=ROOT,
            env=env_for(),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        assert proc.returncode == -signal.SIGKILL, f"{where}: not killed ({proc.returncode}):\n{proc.stderr[-4000:]}"
        restored = [line for line in proc.stderr.splitlines() if "restored checkpoint " in line]
        assert (int(restored[-1].split("restored checkpoint ")[1].split()[0]) if restored else None) == expected, (
            where,
            proc.stderr[-4000:],
        )
        expected = resumes_from
    final = run_trainer(cmd)
    assert f"restored checkpoint {expected} " in final.stderr
    assert not (tmp_path / "checkpoints_rejected").exists()
    ref, got = summary(reference_run), summary(tmp_path)
    assert got["params_sha256"] == ref["params_sha256"] and got["data_sha256"] == ref["data_sha256"]
    assert losses(tmp_path) == losses(reference_run)
    log = "data_log/host-00000-of-00001.jsonl"
    assert jsonl(tmp_path / log) == jsonl(reference_run / log)
