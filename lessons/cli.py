"""`make lessons` — the case study's two failures replayed, measured and audited, and a contamination lesson.

The loss lessons (`--lessons loss`): three runs of the tiny OLMo 3 on a slice of the embedded sample, identical except for one thing:
  correct        the production loader and fp32 Adam moments;
  double_sharding  UNSAFE_double_sharding_experiment_hosts=2 (`dataloader.double_sharding`):
                   2 simulated hosts read through Grain ShardOptions *and* a host slice;
  bf16_moments     optimizer.{mu,nu}_dtype=bfloat16 via allow_low_precision_optimizer_state.
Then `python -m compare RUN correct` and `python -m audit` for each, and a
summary (OUT/lessons.json, OUT/lessons.md: the table; OUT/index.html: the table, a figure of each
run − correct against tokens, and links to every report).

Why a slice: the bug's mechanism is *repetition* — it only acts once data comes round again — so
the runs must cover several epochs within the time budget (≤ 20 minutes on 2 cores for all
three). The slice is the first `--docs` documents of the sample's prose source, tokenized into
`--seq_len`-token examples by the ordinary pipeline (`pipelines.tokenize` on a generated mixture).
Nothing here is tuned to a result: the settings are the defaults below, chosen for time only.

The contamination lesson (`--lessons contamination`, lessons/contamination.py): a
run on the slice plus planted instances of a downstream task beside a run on the same data
decontaminated at tokenize time; the audit names the contamination, and the planted run's
downstream metric against its clean-subset twin says what the plants bought. `--lessons all` (the
default) runs both; OUT/index.html and OUT/lessons.json show the lessons this invocation ran.

Reuse: a re-invocation skips the data and each finished run *only* when the settings recorded
next to it (OUT/data.settings.json, OUT/runs/NAME.settings.json, written before building) equal
this invocation's; otherwise it rebuilds, saying why. A folder in the way that carries no record
(not made by this script, or by a version before the records) is refused, never deleted.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import html
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from contract import LESSONS_REPORT, check_out_dir, write_atomic
from contract.cli import Parser, integer, number, run_main
from pipelines.sample import SAMPLE_VERSION

from . import contamination
from .io import TINY, html_table, lesson_run, md_table, sample_prose
from .io import decide as decide
from .io import run as _run
from .io import settled as _settled

RUNS = {
    "correct": [],
    "double_sharding": ["UNSAFE_double_sharding_experiment_hosts=2"],
    "bf16_moments": [
        "optimizer.mu_dtype=bfloat16",
        "optimizer.nu_dtype=bfloat16",
        "allow_low_precision_optimizer_state=true",
    ],
}


@dataclasses.dataclass(frozen=True)
class LessonsConfig:
    out: str = "out/lessons"
    docs: int = 100  # prose documents of the sample in the slice
    seq_len: int = 128
    heldout_fraction: float = 0.2
    steps: int = 120
    global_batch_size: int = 8
    eval_every: int = 10
    lr: float = 5e-3
    warmup_steps: int = 20
    plant_copies: int = 8  # the contamination lesson: copies of each planted task instance
    plant_batch_size: int = 4  # the contamination lesson's G (its examples are 512 tokens, not --seq_len)


LESSONS = ("all", "loss", "contamination")  # --lessons: which lessons this invocation runs


def fraction(text: str) -> float:
    """A finite share strictly between 0 and 1 (a held-out split that is neither empty nor everything)."""
    value = number()(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be a finite number in (0, 1), got {text!r}")
    return value


# Each LessonsConfig field's parser: every number refused at parsing (one `error:` line, exit 2)
# before any stage (data, audit, training) runs, never by a stage after minutes of work.
FLAG_TYPES: dict[str, Any] = {
    "out": str,
    "docs": integer(1),
    "seq_len": integer(2),  # an example predicts at least one next token
    "heldout_fraction": fraction,
    "steps": integer(1),
    "global_batch_size": integer(1),
    "eval_every": integer(1),
    "lr": number(positive=True),
    "warmup_steps": integer(0),
    "plant_copies": integer(1),
    "plant_batch_size": integer(1),
}


def contamination_plan(cfg: LessonsConfig) -> contamination.Plan:
    """The contamination lesson's settings: the loss lessons' shared ones (its data are tokenized at
    the task files' context length instead of --seq_len) and OUT/contamination."""
    return contamination.Plan(
        out=str(Path(cfg.out) / "contamination"),
        docs=cfg.docs,
        heldout_fraction=cfg.heldout_fraction,
        steps=cfg.steps,
        global_batch_size=cfg.plant_batch_size,
        lr=cfg.lr,
        warmup_steps=cfg.warmup_steps,
        plant_copies=cfg.plant_copies,
    )


def data_settings(cfg: LessonsConfig, out: Path) -> dict:
    """Everything the data depend on: the slice, the mixture the pipeline tokenizes, the sample."""

    mixture = {
        "name": "lessons",
        "tokenizer": "dolma2",
        "seq_len": cfg.seq_len,
        "seed": 0,
        "heldout_fraction": cfg.heldout_fraction,
        "dedup": True,
        "sources": [{"name": "prose", "paths": [str(out / "src" / "prose.jsonl")], "weight": 1.0, "max_repetition": 4}],
    }
    return {"docs": cfg.docs, "sample_version": SAMPLE_VERSION, "mixture": mixture}


def prepare_data(cfg: LessonsConfig) -> str:
    """The slice → OUT/data/manifest.json (via the pipeline); returns the manifest path."""

    out = Path(cfg.out).resolve()
    manifest = out / "data" / "manifest.json"
    wanted = data_settings(cfg, out)
    if _settled("the data", out / "data", out / "data.settings.json", wanted, manifest):
        return str(manifest)
    docs = sample_prose(cfg.docs)
    (out / "src").mkdir(parents=True, exist_ok=True)
    (out / "src" / "prose.jsonl").write_text("".join(docs[: cfg.docs]), encoding="utf-8")
    (out / "mixture.yaml").write_text(yaml.safe_dump(wanted["mixture"], sort_keys=False))
    _run(
        [
            sys.executable,
            "-m",
            "pipelines.tokenize",
            "--mixture",
            str(out / "mixture.yaml"),
            "--output",
            str(out / "data"),
        ]
    )
    return str(manifest)


def overrides(cfg: LessonsConfig, manifest: str, name: str) -> list[str]:
    """The trainer overrides (on tiny.yaml) of run `name`: shared settings + its one difference."""
    return [
        f"data=[{manifest}]",
        f"steps={cfg.steps}",
        f"global_batch_size={cfg.global_batch_size}",
        f"eval.every={cfg.eval_every}",
        "eval_batches=null",
        "checkpoint.every=0",
        f"lr={cfg.lr}",
        f"schedule.warmup_steps={cfg.warmup_steps}",
        "log.progress_every=20",
        "downstream.every=0",  # the tiny recipe's task files are built for seq_len 512, not --seq_len
        *RUNS[name],
    ]


def run_settings(cfg: LessonsConfig, manifest: str, name: str) -> dict:
    """Everything run `name` depends on: its overrides, the base config and the data (their
    settings and their manifest's content: rebuilt data under the same path are other data)."""
    sha = lambda p: hashlib.sha256(Path(p).read_bytes()).hexdigest()
    return {
        "overrides": overrides(cfg, manifest, name),
        "config_sha256": sha(TINY),
        "data": data_settings(cfg, Path(cfg.out).resolve()),
        "manifest_sha256": sha(manifest),
    }


def train(cfg: LessonsConfig, manifest: str, name: str) -> float | None:
    """Trains run `name` (skipped when OUT/runs/NAME finished with equal settings: `decide`);
    returns its wall seconds, None when reused."""
    run = lesson_run(cfg.out, name)
    if _settled(
        f"run {name}",
        run.path,
        run.path.with_name(f"{name}.settings.json"),
        run_settings(cfg, manifest, name),
        run.summary,
    ):
        return None
    return _run(
        [
            sys.executable,
            "-m",
            "trainer.main",
            "--config",
            str(TINY),
            "--run_dir",
            str(run),
            *overrides(cfg, manifest, name),
        ]
    )[1]


def _final(rows: list[dict], key: str, last: int = 20) -> float | None:
    vals = [r[key] for r in rows if key in r]
    if not vals:
        return None
    vals = vals[-last:] if key == "loss" else vals[-1:]
    return sum(vals) / len(vals)


AUDIT_WORD = {True: "pass", False: "FAIL", None: "not run"}  # the audit's run check: None = not run
COLUMNS = (
    "run",
    "train loss (mean of last 20 steps)",
    "held-out loss (final)",
    "Δ train vs correct (smoothed, final)",
    "Δ held-out vs correct (final)",
    "compare",
    "audit (run check)",
)


def table_rows(rows: dict[str, dict]) -> list[list[str]]:
    """Pure: the summary table's cells (COLUMNS), one row per run, as lessons.md and index.html show them."""
    fmt = lambda x, s="+.4f": "–" if x is None else format(x, s)
    return [
        [
            name,
            fmt(r["train_loss_last20_mean"], ".4f"),
            fmt(r["heldout_loss_final"], ".4f"),
            fmt(r["train_gap_vs_correct_final_smoothed"]),
            fmt(r["heldout_gap_vs_correct_final"]),
            r["compare_verdict"],
            AUDIT_WORD[r["audit_run_passed"]],
        ]
        for name, r in rows.items()
    ]


def gaps_figure(compares: dict[str, dict], tolerance: float | None) -> str | None:
    """One figure, inline SVG: each run − correct against tokens seen, training loss (smoothed, left)
    and held-out loss (right, with the ±tolerance band), from the compare reports' aligned arrays."""
    from compare import report  # matplotlib only when drawing

    fig, (left, right) = report.plt.subplots(1, 2, figsize=(2 * report.FIGSIZE[0], report.FIGSIZE[1] * 1.4))
    drawn = False
    for ax, key, title in (
        (left, "loss_smoothed", "Δ train loss (smoothed)"),
        (right, "heldout_loss", "Δ held-out loss"),
    ):
        ax.axhline(0.0, color="black", lw=0.8)
        if key == "heldout_loss" and tolerance is not None:
            ax.axhspan(-tolerance, tolerance, color="#2ca02c", alpha=0.15, label=f"±{tolerance:g} tolerance")
        for name, comp in compares.items():
            a = comp["aligned"].get(key) or {}
            if a.get("tokens"):
                ax.plot(
                    a["tokens"], a["diff"], lw=1.4, marker="o" if len(a["tokens"]) <= 60 else None, ms=3, label=name
                )
                drawn = True
        ax.set_title(f"{title}: run − correct")
        report._axes(ax, "run − correct")
        ax.legend(loc="best", frameon=False)
    if not drawn:
        report.plt.close(fig)
        return None
    return report._svg(fig)


def index_html(rows: dict[str, dict], figure: str | None, contaminated: dict | None = None) -> str:
    """The landing page: the summary table, the gaps figure, and each run's compare and audit links
    (when the loss lessons ran: `rows`), and the contamination lesson's section (when it ran)."""
    from compare.report import CSS  # matplotlib (the report's charts): imported where a page is made

    table = html_table(COLUMNS, table_rows(rows))
    fig = (
        "<p>No aligned training or held-out loss to plot.</p>"
        if figure is None
        else f"<figure>{figure}<figcaption>Each run − the correct run at equal tokens seen (the correct run against "
        f"itself is the zero line). A data bug that repeats data would show as a training-loss gain (below "
        f"zero); the held-out loss is the verdict.</figcaption></figure>"
    )
    items = "".join(
        f'<li><b>{html.escape(n)}</b>: <a href="compare/{n}/compare.html">compare vs correct</a> '
        f'({html.escape(r["compare_verdict"])}) · <a href="audit/{n}/report.html">audit</a> '
        f"({AUDIT_WORD[r['audit_run_passed']]})<br><small>{html.escape(r['compare_summary'])}"
        f"<br>audit: {html.escape(r['audit_run_check'] or 'run check not run')}</small></li>"
        for n, r in rows.items()
    )
    loss = (
        f"<h2>Training loss against held-out loss, each run vs the correct one</h2>{table}{fig}<h2>Reports</h2>"
        f"<ul>{items}</ul>"
        if rows
        else ""
    )
    section = "" if contaminated is None else contamination.section_html(contaminated)
    return (
        f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>olmax lessons</title><style>{CSS}"
        f"</style></head><body><h1>olmax lessons</h1>{loss}{section}</body></html>\n"
    )


def summarize(
    cfg: LessonsConfig, manifest: str | None, seconds: dict[str, float | None], contaminated: dict | None = None
) -> dict:
    """OUT/lessons.json, OUT/lessons.md (the tables) and OUT/index.html (tables, figure, links) from
    each loss run's metrics.jsonl, compare.json and audit.json (manifest None: the loss lessons did
    not run) and the contamination lesson's result (None: it did not run)."""
    out = Path(cfg.out)
    rows, compares = {}, {}
    for name in RUNS if manifest is not None else ():
        metrics = [json.loads(x) for x in lesson_run(out, name).metrics.read_text().splitlines() if x.strip()]
        comp = compares[name] = json.loads((out / "compare" / name / "compare.json").read_text())
        audit = json.loads((out / "audit" / name / "audit.json").read_text())
        run_check = audit["checks"].get("run")
        v = comp["verdict"]
        rows[name] = {
            "train_loss_last20_mean": _final(metrics, "loss"),
            "heldout_loss_final": _final(metrics, "heldout_loss"),
            "train_gap_vs_correct_final_smoothed": (v["train_loss_gap"] or {}).get("final"),
            "heldout_gap_vs_correct_final": (comp["aligned"]["heldout_loss"]["diff"] or [None])[-1],
            "compare_verdict": {True: "pass", False: "FAIL", None: "n/a"}[v["passed"]],
            "compare_summary": v["summary"],
            "data": comp["data"]["summary"] if comp["data"] else None,
            "audit_run_check": None if run_check is None else run_check.get("summary"),
            "audit_run_passed": None if run_check is None else run_check.get("passed"),
            "audit_passed": audit["passed"],
            "audit_failed_checks": [k for k, c in audit["checks"].items() if c["passed"] is False],
            "train_wall_seconds": seconds.get(name),  # None: trained by an earlier invocation
            "step_seconds_sum": sum(r["step_time_s"] for r in metrics),
        }
    plan_info = json.loads(Path(manifest).read_text()) if manifest is not None else {}
    result = {
        "settings": dataclasses.asdict(cfg),
        "manifest": manifest,
        "train_examples": plan_info.get("counts", {}),
        "runs": rows,
        "contamination": contaminated,
    }
    write_atomic((out / "lessons.json"), json.dumps(result, indent=1) + "\n")
    lines = []
    if rows:
        lines += md_table(COLUMNS, table_rows(rows))
    if contaminated is not None:
        c = contamination
        lines += [""] if lines else []
        lines += md_table(c.COLUMNS, c.table_rows(contaminated))
        lines += ["", c.bought_line(contaminated)]
    write_atomic((out / "lessons.md"), "\n".join(lines) + "\n")
    tolerance = compares["correct"]["verdict"].get("tolerance") if "correct" in compares else None
    figure = gaps_figure(compares, tolerance) if rows else None
    write_atomic((out / "index.html"), index_html(rows, figure, contaminated))
    print("\n".join(lines))
    return result


def main(argv: list[str] | None = None) -> int:
    p = Parser("python -m lessons", __doc__.splitlines()[0])
    for f in dataclasses.fields(LessonsConfig):  # FLAG_TYPES names every field (a KeyError otherwise)
        p.add_argument(f"--{f.name}", type=FLAG_TYPES[f.name], default=f.default)
    p.add_argument("--lessons", choices=LESSONS, default="all", help="which lessons to run (default: all)")
    args = vars(p.parse_args(argv))
    which = args.pop("lessons")
    cfg = LessonsConfig(**args)
    return run_main(lambda: _main(cfg, which))


def _main(cfg: LessonsConfig, which: str = "all") -> int:
    check_out_dir(cfg.out, own=LESSONS_REPORT)  # before the runs are trained
    manifest, seconds = _loss_lessons(cfg) if which in ("all", "loss") else (None, {})
    contaminated = contamination.lesson(contamination_plan(cfg)) if which in ("all", "contamination") else None
    summarize(cfg, manifest, seconds, contaminated)
    print(f"reports: {Path(cfg.out) / 'index.html'}")
    return 0


def _loss_lessons(cfg: LessonsConfig) -> tuple[str, dict[str, float | None]]:
    """The three loss runs, trained, compared with the correct one and audited: (the data's
    manifest, each run's training seconds)."""
    manifest = prepare_data(cfg)
    seconds = {name: train(cfg, manifest, name) for name in RUNS}  # one at a time: 2 cores
    for name in RUNS:
        run_dir = str(lesson_run(cfg.out, name))
        _run(
            [
                sys.executable,
                "-m",
                "compare",
                run_dir,
                str(lesson_run(cfg.out, "correct")),
                "--out",
                str(Path(cfg.out) / "compare" / name),
            ],
            ok=(0, 1),
        )
        _run(
            [
                sys.executable,
                "-m",
                "audit",
                "--data",
                manifest,
                "--run",
                run_dir,
                "--out",
                str(Path(cfg.out) / "audit" / name),
            ],
            ok=(0, 1),
        )
    return manifest, seconds


if __name__ == "__main__":
    sys.exit(main())
