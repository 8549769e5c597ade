"""The job touches only its own output: literal paths, a folder it may write into, and clean-up
of only the names it writes (issue 14, section 1)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from contract.lock import LOCK_NAME
from pipelines.outdir import MARKER_NAME, OutputError, check_output, own_name, prune
from pipelines.shards import write_jsonl

HEX = "0123456789abcdef" * 2  # a uuid4().hex-shaped temporary suffix


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root (relative path → bytes)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def put(root: Path, rel: str, data: bytes = b"user data") -> None:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_bytes(data)


def write_mixture(tmp: Path, sources: dict[str, list[str]], name: str = "mix.yaml") -> Path:
    path = tmp / name
    path.write_text(
        yaml.safe_dump(
            {
                "name": "t",
                "tokenizer": "dolma2",
                "seq_len": 16,
                "seed": 0,
                "heldout_fraction": 0.0,
                "dedup": True,
                "sources": [{"name": s, "paths": paths, "weight": 1} for s, paths in sources.items()],
            }
        )
    )
    return path


def write_docs(path: Path, docs: list[tuple[str, str]], bad: bytes = b"") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(json.dumps({"id": i, "text": t}).encode() + b"\n" for i, t in docs) + bad)


def run_job(mixture: Path, output, *flags: str):
    from pipelines.tokenize import run

    return run(["--mixture", str(mixture), "--output", str(output), *flags])


def test_leftover_temporaries_of_the_jobs_own_names_go_and_nothing_else(tmp_path):
    for rel in [
        f"a/train-00000-of-00001.arrayrecord.tmp-{HEX}",
        f"manifest.json.tmp-{HEX}",
        f"{MARKER_NAME}.tmp-{HEX}",
        f"rejects/a.jsonl.tmp-{HEX}",
        f"duplicates/a.jsonl.tmp-{HEX}",
    ]:
        put(tmp_path, rel, b"partial")
    foreign = [
        "results.tmp-final",
        "a/notes.tmp-dead",
        f"a/train-00000-of-00001.arrayrecord.tmp-{HEX}x",
        f"rejects/other.jsonl.tmp-{HEX}",
        "a/model.arrayrecord",
        "rejects/notes.txt",
    ]
    for rel in foreign:
        put(tmp_path, rel)
    write_jsonl([{"b": 1, "a": "é"}], str(tmp_path / "a" / "keep.jsonl"))
    gone = prune(str(tmp_path), ["a", "missing"], keep=[])
    assert len(gone) == 5
    assert sorted(snapshot(tmp_path)) == sorted(foreign + ["a/keep.jsonl"])
    assert (tmp_path / "a" / "keep.jsonl").read_text(encoding="utf-8") == '{"a": "é", "b": 1}\n'


def test_shards_not_listed_in_the_new_manifest_are_removed(tmp_path):
    for name in (
        "train-00000-of-00002.arrayrecord",
        "train-00001-of-00002.arrayrecord",
        "train-00000-of-00001.arrayrecord",
    ):
        put(tmp_path, f"web/{name}", b"")
    put(tmp_path, "web/notes.txt")
    gone = prune(str(tmp_path), ["web", "books"], ["web/train-00000-of-00001.arrayrecord"])
    assert len(gone) == 2
    assert sorted(p.name for p in (tmp_path / "web").iterdir()) == ["notes.txt", "train-00000-of-00001.arrayrecord"]


@pytest.mark.parametrize("out,neighbour", [("o*", "other"), ("out[1]", "out1"), ("o?t", "opt"), ("[!x]", "y")])
def test_clean_up_in_an_output_named_with_glob_characters_stays_in_it(tmp_path, out, neighbour):
    # each neighbour is what the output's name matches as a glob: it holds files the job's
    # clean-up would delete in its own folder (stale shards, leftover temporaries, side files)
    own = [
        "web/train-00001-of-00002.arrayrecord",
        f"web/heldout-00000-of-00001.arrayrecord.tmp-{HEX}",
        f"manifest.json.tmp-{HEX}",
        "rejects/gone.jsonl",
        "gone/train-00000-of-00001.arrayrecord",
    ]
    for rel in own:
        put(tmp_path / out, rel)
        put(tmp_path / neighbour, rel)
    put(tmp_path / neighbour, "x/important.arrayrecord")
    put(tmp_path / neighbour, "results.tmp-final")
    before = snapshot(tmp_path / neighbour)
    gone = prune(str(tmp_path / out), ["web"], keep=[], dropped=["gone"])
    assert sorted(Path(p).relative_to(tmp_path / out).as_posix() for p in gone) == sorted(own)
    assert snapshot(tmp_path / out) == {}
    assert snapshot(tmp_path / neighbour) == before


def test_a_job_into_a_folder_named_o_star_leaves_other_folders_alone(tmp_path):
    data = tmp_path / "data"
    for rel in [
        "other/x/important.arrayrecord",
        "other/results.tmp-final",
        "other/manifest.json",
        "other/src/train-00001-of-00002.arrayrecord",
        f"other/src/train-00000-of-00002.arrayrecord.tmp-{HEX}",
    ]:
        put(data, rel)
    before = snapshot(data / "other")
    write_docs(tmp_path / "in" / "a.jsonl", [("1", "first document")])
    write_docs(tmp_path / "in" / "b.jsonl", [("2", "second document")])
    out = data / "o*"
    run_job(write_mixture(tmp_path, {"src": [str(tmp_path / "in" / "*.jsonl")]}), out)
    assert (out / "src" / "train-00001-of-00002.arrayrecord").exists()
    # a rerun with one file fewer: the two-file shards of the first run are stale and go
    (tmp_path / "in" / "b.jsonl").unlink()
    run_job(write_mixture(tmp_path, {"src": [str(tmp_path / "in" / "*.jsonl")]}), out)
    assert sorted(p.name for p in (out / "src").iterdir()) == [
        "heldout-00000-of-00001.arrayrecord",
        "train-00000-of-00001.arrayrecord",
    ]
    assert snapshot(data / "other") == before


def test_a_non_empty_folder_without_olmax_output_is_refused_untouched_unless_asked(tmp_path):
    write_docs(tmp_path / "in" / "a.jsonl", [("1", "a document")], bad=b"{broken\n")
    mixture = write_mixture(tmp_path, {"web": [str(tmp_path / "in" / "a.jsonl")]})
    out = tmp_path / "mine"
    for rel, data in [
        ("manifest.json", b'{"my": "own manifest"}'),
        (f"x.tmp-{HEX}", b"x"),
        ("sub/a.arrayrecord", b"a"),
        ("notes.txt", b"n"),
        ("web/results.jsonl", b"r"),
    ]:
        put(out, rel, data)
    before = snapshot(out)
    with pytest.raises(OutputError, match="non-empty folder with no olmax output.*--overwrite_output"):
        run_job(mixture, out)
    assert snapshot(out) == before
    from pipelines.tokenize import main

    assert main(["--mixture", str(mixture), "--output", str(out)]) == 2  # a clear error, no traceback
    run_job(mixture, out, "--overwrite_output")
    after = snapshot(out)
    assert json.loads(after.pop("manifest.json"))["sources"]["web"]["counts"]["documents"] == 2  # the job's own name
    for rel in [
        "web/train-00000-of-00001.arrayrecord",
        "web/heldout-00000-of-00001.arrayrecord",
        "rejects/web.jsonl",
        "duplicates/web.jsonl",
        MARKER_NAME,
        LOCK_NAME,
    ]:
        after.pop(rel)
    assert after == {k: v for k, v in before.items() if k != "manifest.json"}
    run_job(mixture, out)  # now an olmax output: a rerun needs no flag


@pytest.mark.parametrize("holds", ["a training run", "an audit report"])
def test_a_folder_holding_another_commands_output_is_refused_untouched_even_when_asked(tmp_path, capsys, holds):
    """Before, a run directory was "a non-empty folder with no olmax output", which
    --overwrite_output wrote shards, rejects and a manifest into."""
    write_docs(tmp_path / "in" / "a.jsonl", [("1", "a document")])
    mixture = write_mixture(tmp_path, {"web": [str(tmp_path / "in" / "a.jsonl")]})
    out = tmp_path / "out"
    files = {"a training run": ["run.json", "metrics.jsonl", "summary.json"], "an audit report": ["audit.json"]}[holds]
    for rel in files:
        put(out, rel, b"{}")
    before = snapshot(out)
    from pipelines.tokenize import main

    for flags in ([], ["--overwrite_output"]):
        with pytest.raises(OutputError, match=f"--output {out} holds {holds} \\({files[0]}, written by python -m "):
            run_job(mixture, out, *flags)
        assert main(["--mixture", str(mixture), "--output", str(out), *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: --output {out} holds {holds}") and "\n" not in err
        assert err.endswith("(--overwrite_output does not lift this)")
        assert snapshot(out) == before


@pytest.mark.parametrize("case", ["empty", "blank", "root", "file", "under a file", "bucket root"])
def test_an_output_that_cannot_be_a_folder_is_refused_before_anything_runs(tmp_path, case):
    (tmp_path / "f").write_text("a file")
    output = {
        "empty": "",
        "blank": "  ",
        "root": "/",
        "file": str(tmp_path / "f"),
        "under a file": str(tmp_path / "f" / "sub"),
        "bucket root": "gs://",
    }[case]
    before = snapshot(tmp_path)
    with pytest.raises(OutputError, match="--output"):
        run_job(Path("no-such-mixture.yaml"), output)  # refused before the mixture is even read
    assert snapshot(tmp_path) == before
    with pytest.raises(OutputError):
        check_output(output, overwrite=True)  # the flag does not make these folders


def test_an_empty_a_new_or_an_olmax_folder_is_accepted(tmp_path):
    assert check_output(str(tmp_path / "new" / "deeper")) == (str(tmp_path / "new" / "deeper"), [])
    (tmp_path / "empty").mkdir()
    assert check_output(str(tmp_path / "empty") + "/")[0] == str(tmp_path / "empty")
    put(
        tmp_path / "old",
        "manifest.json",
        json.dumps(
            {"format_version": 1, "record_format": "uint32-le[seq_len]", "sources": {"a": {}, "bad\nname": {}}}
        ).encode(),
    )
    assert check_output(str(tmp_path / "old")) == (str(tmp_path / "old"), ["a"])  # invalid names are ignored
    assert own_name("web", "train-00000-of-00001.arrayrecord") and not own_name("web", "train-0-of-1.arrayrecord")


def test_a_rerun_that_drops_a_source_removes_its_files_even_after_a_failed_run(tmp_path, monkeypatch):
    write_docs(tmp_path / "a" / "a.jsonl", [("a1", "shared text"), ("a2", "only in a")])
    write_docs(tmp_path / "b" / "b.jsonl", [("b1", "shared text"), ("b2", "only in b")], bad=b"{broken\n")
    both = write_mixture(tmp_path, {"a": [str(tmp_path / "a" / "*")], "b": [str(tmp_path / "b" / "*")]}, "both.yaml")
    only_a = write_mixture(tmp_path, {"a": [str(tmp_path / "a" / "*")]}, "a.yaml")
    out = tmp_path / "out"
    run_job(both, out)
    assert (out / "rejects" / "b.jsonl").read_text() and (out / "duplicates" / "b.jsonl").read_text()
    put(out, "b/notes.txt")  # not the job's: stays
    # a rerun without b fails before it finishes: its manifest is gone, the marker remembers b
    from pipelines import shards

    real_commit = shards.ShardWriter.commit
    monkeypatch.setattr(shards.ShardWriter, "commit", lambda *a: (_ for _ in ()).throw(OSError(28, "disk full")))
    with pytest.raises(Exception, match="disk full"):
        run_job(only_a, out)
    assert not (out / "manifest.json").exists()
    monkeypatch.setattr(shards.ShardWriter, "commit", real_commit)
    run_job(only_a, out)
    assert sorted(snapshot(out)) == sorted(
        [
            "a/train-00000-of-00001.arrayrecord",
            "a/heldout-00000-of-00001.arrayrecord",
            "b/notes.txt",
            "rejects/a.jsonl",
            "duplicates/a.jsonl",
            "manifest.json",
            MARKER_NAME,
            LOCK_NAME,
        ]
    )
    assert json.loads((out / MARKER_NAME).read_text())["sources"] == ["a"]
    assert list(json.loads((out / "manifest.json").read_text())["sources"]) == ["a"]
    (out / "b" / "notes.txt").unlink()
    run_job(both, out)  # b again, then without it once more: its emptied folder goes too
    run_job(only_a, out)
    assert not (out / "b").exists() and not (out / "rejects" / "b.jsonl").exists()


def test_an_input_file_inside_the_output_folder_is_refused(tmp_path):
    # a rerun would read the job's own rejects/duplicates back as input, or the job overwrite its input
    out = tmp_path / "out"
    write_docs(out / "in" / "a.jsonl", [("1", "a document")])
    os.symlink(out / "in", tmp_path / "elsewhere")  # the same folder through a symlink
    for pattern in [str(out / "in" / "*"), str(tmp_path / "elsewhere" / "*")]:
        before = snapshot(tmp_path / "out")
        with pytest.raises(OutputError, match="contains input files"):
            run_job(write_mixture(tmp_path, {"a": [pattern]}), out, "--overwrite_output")
        assert snapshot(tmp_path / "out") == before


def test_a_source_renamed_only_in_case_is_not_pruned_on_a_case_insensitive_filesystem(tmp_path, monkeypatch):
    # there "Web/" and "web/" are one folder (and rejects/Web.jsonl is rejects/web.jsonl):
    # pruning the "dropped" source Web would delete this run's files of web
    from pipelines import outdir

    for name in ("Web", "books", "code"):
        put(tmp_path, f"rejects/{name}.jsonl")
    put(tmp_path, "rejects/web.jsonl")
    assert outdir.dropped_sources(["Web", "books", "code"], ["web", "code"], str(tmp_path)) == ["Web", "books"]
    insensitive = lambda a, b: a.casefold() == b.casefold()
    monkeypatch.setattr(outdir, "same_entry", insensitive)
    assert outdir.dropped_sources(["Web", "books", "code"], ["web", "code"], str(tmp_path)) == ["books"]


def test_a_source_renamed_only_in_case_leaves_no_files_of_the_old_name(tmp_path):
    # on a case-sensitive filesystem Web/ and web/ are two folders: Web's are another source's
    # files, and the marker forgets Web after the rerun, so this rerun must delete them
    write_docs(tmp_path / "in" / "a.jsonl", [("1", "a document"), ("2", "a document")], bad=b"{broken\n")
    out = tmp_path / "out"
    run_job(write_mixture(tmp_path, {"Web": [str(tmp_path / "in" / "*")]}), out)
    assert (out / "Web").is_dir() and (out / "rejects" / "Web.jsonl").read_text()
    run_job(write_mixture(tmp_path, {"web": [str(tmp_path / "in" / "*")]}), out)
    assert sorted(snapshot(out)) == sorted(
        [
            "web/train-00000-of-00001.arrayrecord",
            "web/heldout-00000-of-00001.arrayrecord",
            "rejects/web.jsonl",
            "duplicates/web.jsonl",
            "manifest.json",
            MARKER_NAME,
            LOCK_NAME,
        ]
    )
    assert not (out / "Web").exists() and json.loads((out / MARKER_NAME).read_text())["sources"] == ["web"]


def test_an_output_the_job_cannot_write_is_a_clear_error_before_the_job(tmp_path, monkeypatch):
    from pipelines import tokenize

    def read_only(*_a):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tokenize, "write_bytes", read_only)  # the marker is the job's first write
    write_docs(tmp_path / "in" / "a.jsonl", [("1", "a document")])
    with pytest.raises(OutputError, match="cannot write into --output.*Read-only"):
        run_job(write_mixture(tmp_path, {"a": [str(tmp_path / "in" / "*")]}), tmp_path / "out")


@pytest.mark.parametrize("bad", ["tokenizer", "runner"])
def test_a_setting_refused_late_still_leaves_the_previous_output_untouched(tmp_path, bad, capsys):
    # everything that can fail on configuration (the mixture's tokenizer, the Beam runner, the
    # graph) is checked before the job claims --output and deletes the previous manifest
    from pipelines.tokenize import main

    write_docs(tmp_path / "in" / "a.jsonl", [("1", "a document")])
    good = write_mixture(tmp_path, {"a": [str(tmp_path / "in" / "*")]})
    out = tmp_path / "out"
    run_job(good, out)
    before = snapshot(out)
    mixture, flags = good, []
    if bad == "tokenizer":
        raw = yaml.safe_load(good.read_text())
        mixture = tmp_path / "bad.yaml"
        mixture.write_text(yaml.safe_dump({**raw, "tokenizer": "nope"}))
    else:
        flags = ["--runner=NoSuchRunner"]
    assert main(["--mixture", str(mixture), "--output", str(out), *flags]) == 2
    assert {"tokenizer": "tokenizer='nope'; expected one of", "runner": "NoSuchRunner"}[bad] in capsys.readouterr().err
    assert snapshot(out) == before


@pytest.mark.parametrize(
    "rel, kind",
    [
        ("rejects", "file"),
        ("duplicates", "file"),
        ("a", "file"),
        ("a", "symlink"),
        ("rejects/a.jsonl", "folder"),
        ("manifest.json.d", None),
    ],
)
def test_a_path_the_job_writes_with_the_wrong_type_is_refused_before_anything_is_touched(tmp_path, rel, kind, capsys):
    # rejects/, duplicates/ and <source>/ must be folders, their files and the manifest not:
    # otherwise the job fails mid-run, after the previous manifest was deleted
    from pipelines.tokenize import main

    write_docs(tmp_path / "in" / "a.jsonl", [("1", "a document")])
    mixture = write_mixture(tmp_path, {"a": [str(tmp_path / "in" / "*")]})
    out = tmp_path / "out"
    run_job(mixture, out)
    if kind is None:  # the manifest itself a folder: refused as well
        rel, kind = "manifest.json", "folder"
        (out / rel).unlink()
    elif (out / rel).is_dir():
        for p in sorted((out / rel).rglob("*"), reverse=True):
            p.unlink()
        (out / rel).rmdir()
    else:
        (out / rel).unlink()
    if kind == "file":
        put(out, rel, b"the user's")
    elif kind == "symlink":
        (tmp_path / "elsewhere").mkdir()
        os.symlink(tmp_path / "elsewhere", out / rel)
    else:
        (out / rel).mkdir()
    before = snapshot(out)
    assert main(["--mixture", str(mixture), "--output", str(out)]) == 2
    assert str(out / rel) in capsys.readouterr().err
    assert snapshot(out) == before and (out / rel).exists()


def test_a_dropped_sources_folder_that_is_a_symlink_is_refused_and_nothing_outside_the_output_is_deleted(
    tmp_path, capsys
):
    # the marker of an earlier run lists source b; this mixture drops it, so b/ would be pruned:
    # were b/ a symlink, its target's shard-named files (outside --output) would be deleted
    from pipelines.tokenize import main

    write_docs(tmp_path / "in" / "a.jsonl", [("1", "a document")])
    write_docs(tmp_path / "in" / "b.jsonl", [("2", "another document")])
    out = tmp_path / "out"
    run_job(
        write_mixture(tmp_path, {"a": [str(tmp_path / "in" / "a.jsonl")], "b": [str(tmp_path / "in" / "b.jsonl")]}), out
    )
    for p in (out / "b").iterdir():
        p.unlink()
    (out / "b").rmdir()
    elsewhere = tmp_path / "elsewhere"
    put(elsewhere, "train-00000-of-00001.arrayrecord", b"someone else's shard")
    put(elsewhere, f"heldout-00000-of-00001.arrayrecord.tmp-{HEX}", b"someone else's temporary")
    os.symlink(elsewhere, out / "b")
    outside, before = snapshot(elsewhere), snapshot(out)
    only_a = write_mixture(tmp_path, {"a": [str(tmp_path / "in" / "a.jsonl")]}, "only_a.yaml")
    assert main(["--mixture", str(only_a), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(out / "b") in err and "symlink" in err
    assert snapshot(elsewhere) == outside and snapshot(out) == before


@pytest.mark.parametrize("rel", ["b", "rejects", "duplicates"])
def test_prune_never_deletes_through_a_symlinked_folder(tmp_path, rel):
    # the last line of defence, should a symlink appear after the checks: nothing outside is touched
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    for name in [
        "train-00000-of-00001.arrayrecord",
        f"train-00000-of-00001.arrayrecord.tmp-{HEX}",
        "b.jsonl",
        f"b.jsonl.tmp-{HEX}",
    ]:
        put(elsewhere, name, b"not the job's")
    os.symlink(elsewhere, out / rel)
    outside = snapshot(elsewhere)
    prune(str(out), ["a"], [], dropped=["b"])
    assert snapshot(elsewhere) == outside and (out / rel).is_symlink()
