"""The I/O steps every lesson of `make lessons` shares: when an output found in OUT is reused
(`decide`, `settled`), the pipeline, trainer and audit commands run as subprocesses (`run`), and the
embedded sample's prose documents the lessons' data are cut from (`sample_prose`)."""

from __future__ import annotations

import gzip
import html
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from contract.rundir import RunDir
from trainer.main import config_path

RECIPE = "tiny"  # the trainer recipe every lesson's run starts from
TINY = Path(config_path(RECIPE))  # found as `python -m trainer.main --config tiny` finds it


def lesson_run(out: str | Path, name: str) -> RunDir:
    """OUT/runs/NAME, the run directory of a lesson's run, resolved as every command resolves one
    (``RunDir.resolved``): the trainer, ``compare`` and the audit are handed this one path."""
    return RunDir.resolved(Path(out) / "runs" / name)


def decide(stored: dict | None, wanted: dict, exists: bool, finished: bool) -> tuple[str, str]:
    """Pure: what to do with an output (the data or a run) found in OUT.

    stored: the settings recorded next to it (None: no record); wanted: this invocation's;
    exists: its folder is there; finished: its completion file is there.
    Returns (action, why), action one of "build" (nothing there), "reuse" (recorded settings equal
    and finished), "rebuild" (recorded by this script, but other settings or unfinished: safe to
    replace) or "refuse" (a folder with no record: not provably ours, so never deleted)."""
    if stored is None:
        return ("refuse", "it has no recorded settings") if exists else ("build", "nothing there")
    if stored != wanted:
        changed = sorted(k for k in stored.keys() | wanted.keys() if stored.get(k) != wanted.get(k))
        return "rebuild", f"its recorded settings differ in {changed}"
    if not finished:
        return "rebuild", "it did not finish"
    return "reuse", "recorded settings equal"


def settled(what: str, folder: Path, stamp: Path, wanted: dict, done: Path) -> bool:
    """Applies `decide` to `folder`: True to reuse it; otherwise it is cleared (when ours) and
    `stamp` records `wanted` *before* the build, so an interrupted build is known as ours."""
    stored = json.loads(stamp.read_text()) if stamp.exists() else None
    action, why = decide(stored, wanted, folder.exists(), done.exists())
    if action == "reuse":
        print(f"lessons: reusing {what} in {folder} ({why})", flush=True)
        return True
    if action == "refuse":
        raise SystemExit(
            f"lessons: {folder} is in the way and {why}, so it may hold another experiment or "
            f"predate the records: remove it (or the whole --out folder) or choose another --out"
        )
    if action == "rebuild":
        print(f"lessons: rebuilding {what} in {folder}: {why}", flush=True)
        shutil.rmtree(folder, ignore_errors=True)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps(wanted, indent=1, sort_keys=True) + "\n")
    return False


def run(cmd: list[str], ok: tuple[int, ...] = (0,)) -> tuple[int, float]:
    """Runs `cmd` (python -m MODULE ...); SystemExit naming the module when its exit status is not
    in `ok`. Returns (exit status, wall seconds)."""
    print("+", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    code = subprocess.run(cmd).returncode
    if code not in ok:
        raise SystemExit(f"{cmd[2]} exited {code}")
    return code, time.perf_counter() - t0


def module(name: str, *args: str) -> list[str]:
    """The command line of `python -m name args...` with this interpreter."""
    return [sys.executable, "-m", name, *args]


def sample_prose(at_least: int) -> list[str]:
    """The embedded sample's prose documents, as JSON lines in the sample's order (built on first
    use: `pipelines.sample.build_sample`); SystemExit when it has fewer than `at_least`."""
    from pipelines import sample  # read at call time: the tests replace build_sample

    docs: list[str] = []
    for part in sorted((Path(sample.build_sample()) / "prose").glob("*.jsonl.gz")):
        with gzip.open(part, "rt", encoding="utf-8") as f:
            docs += [line for line in f if line.strip()]
    if len(docs) < at_least:
        raise SystemExit(f"the sample has {len(docs)} prose documents, fewer than --docs {at_least}")
    return docs


def html_table(columns: list[str] | tuple[str, ...], rows: list[list[str]]) -> str:
    """A header row and body rows, every cell escaped (the lessons' pages)."""

    def cells(tag: str, values: list[str] | tuple[str, ...]) -> str:
        return "".join(f"<{tag}>{html.escape(v)}</{tag}>" for v in values)

    return (
        "<table><tr>"
        + cells("th", columns)
        + "</tr>"
        + "".join(f"<tr>{cells('td', r)}</tr>" for r in rows)
        + "</table>"
    )


def md_table(columns: list[str] | tuple[str, ...], rows: list[list[str]]) -> list[str]:
    """The same table as markdown lines (lessons.md)."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]
