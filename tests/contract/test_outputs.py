"""contract.outputs: where a command writes is checked before its work without leaving a trace,
and a write replaces the old file whole or not at all."""

from __future__ import annotations

import errno
import os

import pytest

from contract import OutputRefused, Refused, Stopped, WriteFailed, check_out_dir, check_out_file, outputs, write_atomic


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
