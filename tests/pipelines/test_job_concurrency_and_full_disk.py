"""One job per --output (a second one is refused before it touches the folder), and a full disk is
one line, exit 1, with the job's own temporaries gone; the rerun after freeing space writes the
same bytes as a job that never failed."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from apache_beam.io.filesystems import FileSystems

from contract.lock import LOCK_NAME
from pipelines import shards
from pipelines.tokenize import main
from tests.contract.test_lock import hold
from tests.pipelines.test_outdir import snapshot, write_docs, write_mixture


@pytest.fixture
def mixture(tmp_path):
    write_docs(tmp_path / "in" / "a.jsonl", [(f"a{i}", f"the text of document {i} " * (i % 5 + 1)) for i in range(40)])
    write_docs(tmp_path / "in" / "b.jsonl", [(f"b{i}", f"another text number {i} " * (i % 3 + 1)) for i in range(30)])
    return write_mixture(tmp_path, {"a": [str(tmp_path / "in" / "a.jsonl")], "b": [str(tmp_path / "in" / "b.jsonl")]})


def errors(text):
    return [line for line in text.splitlines() if line.startswith("error:")]


def test_a_second_job_on_an_output_in_use_is_refused_naming_the_first_and_touches_nothing(mixture, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["--mixture", str(mixture), "--output", str(out)]) == 0
    holder = hold(out)  # a job running on it (holding the lock as the job does)
    try:
        before = snapshot(out)
        assert main(["--mixture", str(mixture), "--output", str(out)]) == 2
        err = capsys.readouterr().err
        assert len(errors(err)) == 1 and f"is in use by pid {holder.pid} on host " in errors(err)[0]
        assert snapshot(out) == before
    finally:
        holder.kill()
        holder.wait()
    assert main(["--mixture", str(mixture), "--output", str(out)]) == 0  # the killed holder's lock is free


def test_an_output_holding_only_the_lock_file_counts_as_empty(mixture, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_bytes(b"")
    assert main(["--mixture", str(mixture), "--output", str(out)]) == 0


def full_disk(monkeypatch, victim: str):
    """Writes through Beam's FileSystems to a path ending in `victim` fail with ENOSPC after the
    first bytes (the temporary file exists, partly written): the error where the write happens."""
    real_create = FileSystems.create

    class Full:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            self.f.write(data[:10])
            raise OSError(errno.ENOSPC, "No space left on device")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def create(path, *args, **kwargs):
        f = real_create(path, *args, **kwargs)
        return Full(f) if victim in path else f

    monkeypatch.setattr(shards.FileSystems, "create", staticmethod(create))


def test_a_full_disk_is_one_line_exit_1_its_temporaries_removed_and_the_rerun_is_byte_identical(
    mixture, tmp_path, monkeypatch, capsys
):
    clean = tmp_path / "clean"
    assert main(["--mixture", str(mixture), "--output", str(clean)]) == 0
    out = tmp_path / "out"
    with monkeypatch.context() as m:
        full_disk(m, "b/train-00000-of-00001.arrayrecord")
        assert main(["--mixture", str(mixture), "--output", str(out)]) == 1
    err = capsys.readouterr().err
    assert errors(err) == [f"error: no space left on device writing {out}/b/train-00000-of-00001.arrayrecord"]
    assert "Traceback" not in err
    assert not [p for p in out.rglob("*") if shards.TMP_MARK in p.name]
    assert not (out / "manifest.json").exists()  # no manifest describes the failed job
    assert main(["--mixture", str(mixture), "--output", str(out)]) == 0
    assert snapshot(out) == snapshot(clean)


def test_a_full_local_temporary_disk_names_the_file_it_could_not_write(tmp_path, monkeypatch):
    class FullWriter:
        def __init__(self, path, options):
            self.path = path

        def write(self, record):
            raise RuntimeError(f"write() failed: No space left on device; writing {self.path}; at byte 0")

        def close(self):
            pass

    monkeypatch.setattr(shards, "ArrayRecordWriter", FullWriter)  # the name the shard writer calls
    with pytest.raises(
        shards.OutputWriteError,
        match=r"^no space left on device writing /\S+\.arrayrecord "
        rf"\(the local temporary file of {tmp_path}/x\.arrayrecord\)$",
    ):
        shards.write_array_record([b"1234"], str(tmp_path / "x.arrayrecord"))
    assert not Path(tmp_path / "x.arrayrecord").exists()


def test_a_write_failure_is_found_in_the_text_a_runner_passes_on():
    text = (
        "RuntimeError: pipelines.shards.OutputWriteError: no space left on device writing /o/a/x.arrayrecord "
        "[while running 'TokenizeFiles/ParDo(TokenizeFile)']"
    )
    assert shards.write_failure(RuntimeError(text)) == "no space left on device writing /o/a/x.arrayrecord"
    assert shards.write_failure(RuntimeError("something else [while running 'X']")) is None
