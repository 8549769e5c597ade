"""contract.outputs: where a command writes is checked before its work without leaving a trace
(and is never another command's output folder), and a write replaces the old file whole or not at
all, with the mode a plain open() gives."""

from __future__ import annotations

import errno
import json
import os
import re

import pytest

import contract.downstream
from contract import (
    AUDIT_REPORT,
    COMPARE_REPORT,
    LESSONS_REPORT,
    TASK_BUILD,
    TOKENIZE_OUTPUT,
    TRAINING_RUN,
    OutputRefused,
    Refused,
    Stopped,
    WriteFailed,
    check_out_dir,
    check_out_file,
    outputs,
    write_atomic,
)
from tests.modes import modes, umask


def test_an_out_that_is_a_file_or_under_one_is_refused_and_nothing_is_created(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    for out, says in [(f, "exists and is not a folder"), (f / "a" / "b", f"is under {f}, a file")]:
        with pytest.raises(OutputRefused, match=says) as e:
            check_out_dir(str(out))
        assert isinstance(e.value, Refused)
    check_out_dir(str(tmp_path / "new" / "deeper"))
    assert sorted(os.listdir(tmp_path)) == ["f"]  # checked, not made
    with pytest.raises(OutputRefused, match="is a folder, not a file"):
        check_out_file(str(tmp_path))
    check_out_file(str(tmp_path / "new" / "x.json"))
    for check in (check_out_dir, check_out_file):
        with pytest.raises(OutputRefused, match="--out is empty"):
            check("")


@pytest.mark.parametrize("out", ["gs://bucket/audit", "gs:/bucket/audit", "s3://b/x"])
def test_a_remote_out_is_refused_not_written_into_a_local_folder_named_after_its_scheme(tmp_path, monkeypatch, out):
    """These commands write with local file calls: `--out gs://bucket/audit` used to pass the check and
    write ./gs:/bucket/audit/ (a pathlib.Path of it is gs:/bucket/audit), exit 0."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputRefused, match=f"--out {out}: a remote location; this command writes a local folder"):
        check_out_dir(out)
    with pytest.raises(OutputRefused, match=f"--out {out}/x.json: a remote location; this command writes a local"):
        check_out_file(f"{out}/x.json")
    assert os.listdir(tmp_path) == []


def test_an_out_through_a_missing_folder_and_dotdot_is_written_where_it_was_checked(tmp_path):
    """`--out DIR/missing/..` is DIR for the check (os.path.abspath); the write used the path as
    given, which the kernel cannot resolve: the audit ran, then failed writing its report (exit 3)."""
    out = str(tmp_path / "missing" / "..")
    check_out_dir(out)
    write_atomic(os.path.join(out, "report.html"), "r")
    assert (tmp_path / "report.html").read_text() == "r" and not (tmp_path / "missing").exists()


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "out.json"
    write_atomic(path, "old")
    assert path.read_text() == "old"

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outputs.os, "fsync", full)
    with pytest.raises(WriteFailed, match=f"cannot write {path}: No space left on device") as e:
        write_atomic(path, "new")
    assert isinstance(e.value, Stopped) and path.read_text() == "old" and os.listdir(tmp_path) == ["out.json"]


def test_a_ctrl_c_in_any_command_is_one_line_and_exit_130(capsys):
    """Ctrl-C in pipelines.tokenize (also the one trainer.main runs for the sample), the audit or
    compare was a KeyboardInterrupt traceback of 30+ lines; Python 3.11 wraps one that lands in an
    import's class body in a RuntimeError."""
    from contract import run_main
    from contract.errors import INTERRUPTED, INTERRUPTED_EXIT

    def ctrl_c():
        raise KeyboardInterrupt

    def wrapped():
        try:
            ctrl_c()
        except KeyboardInterrupt as e:
            raise RuntimeError("Error calling __set_name__ on 'Field' instance") from e

    for body in (ctrl_c, wrapped):
        assert run_main(body) == INTERRUPTED_EXIT == 130
        assert capsys.readouterr().err == INTERRUPTED + "\n"
    assert run_main(ctrl_c, interrupted_line="the trainer's own") == 130
    assert capsys.readouterr().err == "the trainer's own\n"
    with pytest.raises(RuntimeError):  # any other error is not turned into a line
        run_main(lambda: (_ for _ in ()).throw(RuntimeError("x")))


def test_run_main_maps_each_kind_to_its_exit_code_and_one_error_line(capsys):
    from contract import STOPPED_BY_VERDICT_COMMAND, run_main

    class Both(Refused, Stopped):
        pass

    def raising(error):
        def body():
            raise error

        return body

    assert run_main(lambda: 0) == 0 and run_main(lambda: 1, 3) == 1  # a verdict's own code passes through
    cases = [(Refused("bad"), 1, 2), (Stopped("broke"), 1, 1), (Stopped("broke"), 3, 3), (Both("both"), 3, 2)]
    for error, stopped_code, code in cases:
        assert run_main(raising(error), stopped_code) == code
        assert capsys.readouterr().err == f"error: {error}\n"
    assert STOPPED_BY_VERDICT_COMMAND == 3


@pytest.mark.parametrize(
    "mask,file_mode,dir_mode",
    [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700), (0o002, 0o664, 0o775)],
    ids=["umask022", "umask077", "umask002"],
)
def test_an_atomic_write_has_the_modes_a_plain_open_and_mkdir_give_under_the_umask(tmp_path, mask, file_mode, dir_mode):
    """Before, mkstemp made every written file 0600 whatever the umask: a report nobody else could read."""
    with umask(mask):
        write_atomic(tmp_path / "new" / "deeper" / "out.json", "x")
        write_atomic(tmp_path / "new" / "deeper" / "out.json", "again")  # a replace keeps the rule
        with open(tmp_path / "plain.json", "w") as f:
            f.write("x")
    assert modes(tmp_path, ["new/deeper/out.json", "plain.json"]) == {
        "new/deeper/out.json": file_mode,
        "plain.json": file_mode,
    }
    assert modes(tmp_path, ["new", "new/deeper"]) == {"new": dir_mode, "new/deeper": dir_mode}
    assert os.listdir(tmp_path / "new" / "deeper") == ["out.json"]  # no temporary left


def test_a_temporary_name_is_taken_exclusively(tmp_path, monkeypatch):
    taken = tmp_path / ".out.json.aaaaaaaaaaaa.tmp"
    taken.write_text("someone else's")
    tokens = iter(["aaaaaaaaaaaa", "bbbbbbbbbbbb"])
    monkeypatch.setattr(outputs.secrets, "token_hex", lambda n: next(tokens))
    fd, path = outputs.open_temp(str(tmp_path), "out.json")
    os.close(fd)
    assert path == str(tmp_path / ".out.json.bbbbbbbbbbbb.tmp") and taken.read_text() == "someone else's"


def write_markers(folder, *names, manifest: dict | None = None):
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text(json.dumps(manifest) if name == "manifest.json" and manifest is not None else "{}")
    return folder


def test_each_commands_output_is_told_by_its_markers(tmp_path):
    cases = {
        "tokenize": (
            write_markers(tmp_path / "t", "manifest.json", "olmax-output.json"),
            TOKENIZE_OUTPUT,
            "manifest.json",
        ),
        "failed tokenize": (write_markers(tmp_path / "f", "olmax-output.json"), TOKENIZE_OUTPUT, "olmax-output.json"),
        "tasks": (
            write_markers(tmp_path / "d", "manifest.json", manifest={"format": contract.downstream.FORMAT}),
            TASK_BUILD,
            "manifest.json",
        ),
        "run": (write_markers(tmp_path / "r", "metrics.jsonl", "config.json"), TRAINING_RUN, "metrics.jsonl"),
        "audit": (write_markers(tmp_path / "a", "report.html"), AUDIT_REPORT, "report.html"),
        "compare": (write_markers(tmp_path / "c", "compare.json", "compare.html"), COMPARE_REPORT, "compare.json"),
        "lessons": (write_markers(tmp_path / "l", "lessons.json"), LESSONS_REPORT, "lessons.json"),
    }
    for folder, kind, marker in cases.values():
        assert outputs.output_kinds(folder) == [(kind, marker)]
    assert outputs.output_kinds(write_markers(tmp_path / "other", "config.json", "notes.txt")) == []
    assert outputs.output_kinds(tmp_path / "absent") == []
    assert contract.downstream.FORMAT == outputs.DOWNSTREAM_TASKS_FORMAT == "olmax-downstream-tasks"


@pytest.mark.parametrize(
    "holds,own,says",
    [
        (
            ("run.json", "metrics.jsonl"),
            AUDIT_REPORT,
            "holds a training run (run.json, written by python -m trainer.main)",
        ),
        (
            ("manifest.json",),
            COMPARE_REPORT,
            "holds a tokenize output (manifest.json, written by python -m pipelines.tokenize)",
        ),
        (("audit.json", "report.html"), TRAINING_RUN, "holds an audit report (audit.json, written by python -m audit)"),
        (("compare.json",), LESSONS_REPORT, "holds a compare report (compare.json, written by python -m compare)"),
    ],
)
def test_an_output_folder_holding_another_commands_output_is_refused_and_left_as_it_was(tmp_path, holds, own, says):
    folder = write_markers(tmp_path / "out", *holds)
    before = sorted(os.listdir(folder))
    with pytest.raises(OutputRefused, match=re.escape(f"--out {folder} {says}: {own.command} does not write")):
        check_out_dir(str(folder), own=own)
    with pytest.raises(OutputRefused, match=re.escape(says)):
        outputs.check_output_kind(folder, own)
    assert sorted(os.listdir(folder)) == before
    kind = next(k for k in (TOKENIZE_OUTPUT, TRAINING_RUN, AUDIT_REPORT, COMPARE_REPORT) if holds[0] in k.markers)
    check_out_dir(str(folder), own=kind)  # its own command may write there again
    check_out_dir(str(folder))  # a folder for a file (check_out_file's): no kind asked


def test_an_out_file_that_is_another_commands_output_file_is_refused(tmp_path):
    run = write_markers(tmp_path / "run", "run.json", "summary.json")
    with pytest.raises(OutputRefused, match=re.escape(f"--out {run / 'summary.json'} is a file of a training run")):
        check_out_file(str(run / "summary.json"))
    check_out_file(str(run / "downstream.json"))  # a new file beside them
    check_out_file(str(write_markers(tmp_path / "plain", "notes.json") / "notes.json"))  # no command's file
