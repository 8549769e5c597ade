"""A checkpoint that cannot be written (a full disk) is reported as not saved, in one line, with
its partial files gone; the run resumes from the step before it, bit-identically."""

from __future__ import annotations

import errno
import json
import resource
import subprocess

import pytest
from orbax.checkpoint._src.handlers import json_checkpoint_handler

from contract.rundir import RunDir
from tests.trainer.checkpoint_fixtures import Loader, abstract, assert_bitwise_equal, saved
from tests.trainer.conftest import HANG_GUARD_S, ROOT, read_jsonl, trainer_cmd, trainer_env
from trainer.checkpointing import checkpoints as checkpoint
from trainer.checkpointing import rules
from trainer.checkpointing.checkpoints import Checkpoints
from trainer.config.schema import CheckpointConfig


def full_disk_at(monkeypatch, victim_step: int):
    """orbax's JSON item writer raising ENOSPC for one step's items (where the write happens, in
    orbax's background save), writing the others as usual."""
    real = json_checkpoint_handler.JsonCheckpointHandler._save_fn

    async def save_fn(self, x, directory):
        if f"/{victim_step}.orbax-checkpoint-tmp" in str(directory):
            raise OSError(errno.ENOSPC, "No space left on device", str(directory))
        return await real(self, x, directory)

    monkeypatch.setattr(json_checkpoint_handler.JsonCheckpointHandler, "_save_fn", save_fn)


def test_a_checkpoint_whose_write_fails_is_never_called_saved_and_the_previous_step_resumes(tmp_path, monkeypatch):
    ckpt, params, opt_state = saved(tmp_path, [5])
    full_disk_at(monkeypatch, 10)
    ckpt.save(10, params, opt_state, Loader(10), {"step": 10})
    with pytest.raises(checkpoint.CheckpointError) as e:
        ckpt.wait()
    text = str(e.value)
    assert (
        text.startswith(
            "writing checkpoint 10 failed (No space left on device): it was not saved; the newest saved checkpoint is 5"
        )
        and "\n" not in text
    )
    assert "was saved" not in text
    ckpt.close()
    monkeypatch.undo()
    again = Checkpoints(RunDir(tmp_path), CheckpointConfig(keep=None))
    assert again.manager.all_steps() == [5]  # the partial files are no step
    step, restored = again.restore_latest(abstract(params), abstract(opt_state))
    again.close()
    assert step == 5 and not (tmp_path / rules.REJECTED).exists()
    assert_bitwise_equal(restored["params"], params)


def test_write_error_reason_names_the_os_error_whatever_carries_it():
    assert rules.write_error_reason(OSError(errno.ENOSPC, "No space left on device")) == "No space left on device"
    tensorstore = ValueError(
        'RESOURCE_EXHAUSTED: Error writing "x" ... Failed to write 8 bytes to file 8: '
        "No space left on device [os_error_code='28'] [tensorstore_spec='{...}']"
    )
    assert rules.write_error_reason(tensorstore) == "No space left on device"
    try:
        try:
            raise OSError(errno.EFBIG, "File too large")
        except OSError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert rules.write_error_reason(outer) == "File too large"
    assert rules.write_error_reason(RuntimeError("one\ntwo")) == "RuntimeError: one"


@pytest.mark.slow
def test_a_trainer_that_cannot_write_its_checkpoint_exits_1_in_one_line_and_resumes_bit_identically(
    data_manifest, reference_run, tmp_path
):
    """A real write failure in the C++ writer, without root: RLIMIT_FSIZE lets small files through
    (logs, JSON items) and fails orbax's array files (EFBIG, as ENOSPC fails them on a full disk)."""
    run_dir = tmp_path / "run"

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, resource.RLIM_INFINITY))

    proc = subprocess.run(
        trainer_cmd(data_manifest, run_dir, "steps=8"),
        cwd=ROOT,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        preexec_fn=limit_file_size,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [errors[-1]] and errors[0].startswith(
        "error: writing checkpoint 4 failed (File too large): it was not saved; the newest saved checkpoint is none"
    )
    assert "Traceback" not in proc.stderr and "was saved but" not in proc.stderr
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()]  # no step called saved
    proc = subprocess.run(
        trainer_cmd(data_manifest, run_dir, "steps=8"),
        cwd=ROOT,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    reference = json.loads((reference_run / "summary.json").read_text())
    assert summary["params_sha256"] == reference["params_sha256"]
    assert [r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [
        r["loss"] for r in read_jsonl(reference_run / "metrics.jsonl")
    ]
