"""compare.html: one self-contained page (inline SVG from matplotlib's Agg/SVG backend, inline
CSS, no script, nothing fetched) and compare.json.

The first screen is the verdict table (check | badge | reason | the number that decided it), then
the run facts (collapsed), then one row per metric as W&B lays out panels: the two curves (run
solid, reference dashed) beside their difference (run − reference). A difference that is zero at
every point is said in one line instead of a flat chart. Every point carries its value on hover
(an SVG <title>).
"""

from __future__ import annotations

import dataclasses
import html
import io
import json
import os
import re
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display; the SVG backend draws the figures we inline
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, FuncFormatter

from contract import write_atomic

from .curves import Aligned, Curves, smooth

RUN_COLOR, REF_COLOR, DIFF_COLOR, BAD_COLOR = "#1f77b4", "#555555", "#9467bd", "#d62728"
FIGSIZE = (4.7, 2.6)  # inches: two side by side in the page's width
HOVER_POINTS = 150  # points per series given a hover value (evenly spaced when longer)
MAX_REASON_CHARS = 220
plt.rcParams.update(
    {
        "svg.fonttype": "none",
        "svg.hashsalt": "olmax-compare",
        "font.size": 8,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "axes.spines.top": False,
        "axes.spines.right": False,
    }
)


@dataclasses.dataclass(frozen=True)
class Panel:
    """One metric's row on the page: its curves (value) beside run − reference (difference).
    An svg is None when there is nothing to draw; `diff_note` then says why in one line."""

    title: str
    caption: str
    value: str | None
    difference: str | None
    diff_caption: str = ""
    diff_note: str = ""
    badge: str = ""  # PASS / FAIL / UNKNOWN when the row is a verdict of its own


_HOVER = re.compile(r'<g id="(hover-\d+)">')


def _svg(fig: Figure, hovers: dict[str, list[str]] | None = None) -> str:
    """The figure as inline SVG; each marker of a hover-N group gets its label as a <title>."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    text = text[text.index("<svg") :]  # drop the XML prolog and DOCTYPE: inline SVG in HTML
    # the axis labels marked by class (ids would repeat across the page's figures)
    text = text.replace('<g id="xlabel">', '<g class="axis-label x">').replace(
        '<g id="ylabel">', '<g class="axis-label y">'
    )
    for gid, labels in (hovers or {}).items():
        start = text.index(f'<g id="{gid}">')
        nxt = text.find('<g id="', start + 10)
        end = len(text) if nxt < 0 else nxt
        body = _titled(text[start:end], labels)
        text = text[:start] + body + text[end:]
    return text


def _titled(group: str, labels: list[str]) -> str:
    """Each marker (`<use .../>`) of `group`, in order, wrapped with its label as a <title>."""
    it = iter(labels)
    return re.sub(r"<use [^>]*/>", lambda m: f"<g><title>{html.escape(next(it, ''))}</title>{m.group(0)}</g>", group)


def _hover(
    ax: Axes, t: np.ndarray, v: np.ndarray, what: str, hovers: dict[str, list[str]], fmt: str = "{:.4g}"
) -> None:
    """Invisible markers on (t, v) (at most HOVER_POINTS) whose <title> a browser shows on hover."""
    if len(t) == 0:
        return
    idx = np.unique(np.linspace(0, len(t) - 1, min(len(t), HOVER_POINTS)).astype(int))
    gid = f"hover-{len(hovers)}"
    ax.plot(t[idx], v[idx], "o", ms=7, alpha=0.0, gid=gid)
    tok = EngFormatter(sep="")
    hovers[gid] = [f"{what}: {fmt.format(v[i])} at {tok(t[i])} tokens" for i in idx]


def _axes(ax: Axes, ylabel: str) -> None:
    ax.set_xlabel("tokens seen", gid="xlabel")
    ax.set_ylabel(ylabel, gid="ylabel")
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 1k / 10k / 1.2M


def same_series(run: Curves, ref: Curves, metric: str) -> bool:
    rt, _, rv = run.series(metric)
    ft, _, fv = ref.series(metric)
    return len(rt) > 0 and np.array_equal(rt, ft) and np.array_equal(rv, fv)


def overlay(run: Curves, ref: Curves, metric: str, ylabel: str, smoothing: int = 0, log_y: bool = False) -> str | None:
    """Both runs' `metric` against tokens: the run solid, the reference dashed (raw faint and the
    debiased EMA when smoothing > 1); one line when the two are the same series."""
    rt, _, rv = run.series(metric)
    ft, _, fv = ref.series(metric)
    if len(rt) == 0 and len(ft) == 0:
        return None
    fig, ax = plt.subplots(figsize=FIGSIZE)
    hovers: dict[str, list[str]] = {}
    same = same_series(run, ref, metric)
    sides = [(rt, rv, f"{run.name} = {ref.name}" if same else run.name, RUN_COLOR, "-")]
    if not same:
        sides.insert(0, (ft, fv, ref.name, REF_COLOR, "--"))
    for t, v, name, color, ls in sides:
        if len(t) == 0:
            continue
        marker = "o" if len(t) <= 30 else None
        if smoothing > 1:
            s = smooth(v, smoothing)
            ax.plot(t, v, color=color, alpha=0.25, lw=0.8, ls=ls)
            ax.plot(t, s, color=color, lw=1.6, ls=ls, label=f"{name} (EMA, span {smoothing})")
            _hover(ax, t, v, f"{name} raw", hovers)
        else:
            ax.plot(t, v, color=color, lw=1.4, ls=ls, marker=marker, ms=3, label=name)
            _hover(ax, t, v, name, hovers)
    if log_y:  # plain numbers (0.5, 1, 2), not 2×10⁰
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25" else ""))
    _axes(ax, ylabel)
    ax.legend(loc="best", frameon=False)
    return _svg(fig, hovers)


def identical_note(a: Aligned) -> str:
    """The line that replaces a difference chart whose every point is 0 ('' when one is not)."""
    if len(a.tokens) and not np.any(a.diff):
        return f"run − reference is exactly 0 at all {len(a.tokens):,} compared points: no chart."
    return ""


def difference(
    a: Aligned,
    ylabel: str,
    tolerance: float | None = None,
    after_tokens: float = 0.0,
    first_failure: dict | None = None,
    raw: Aligned | None = None,
) -> str | None:
    """run − reference on the reference's points, with the ±tolerance band when judged; `raw`: the
    unsmoothed difference, drawn faint behind. None when nothing overlaps or every point is 0."""
    if len(a.tokens) == 0 or identical_note(a):
        return None
    fig, ax = plt.subplots(figsize=FIGSIZE)
    hovers: dict[str, list[str]] = {}
    ax.axhline(0.0, color="black", lw=0.8)
    if tolerance is not None:
        ax.axhspan(-tolerance, tolerance, color="#2ca02c", alpha=0.15, label=f"±{tolerance:g} tolerance")
        if after_tokens > 0:
            ax.axvline(after_tokens, color="black", ls=":", lw=1, label="judged from here")
    if raw is not None and len(raw.tokens):
        ax.plot(raw.tokens, raw.diff, color=DIFF_COLOR, alpha=0.3, lw=0.8, label="raw")
    marker = "o" if len(a.tokens) <= 30 else None
    ax.plot(a.tokens, a.diff, color=DIFF_COLOR, lw=1.4, marker=marker, ms=3, label="run − reference")
    _hover(ax, a.tokens, a.diff, "run − reference", hovers, "{:+.4g}")
    if first_failure is not None:
        ax.plot(
            [first_failure["tokens"]],
            [first_failure["diff"]],
            "x",
            color=BAD_COLOR,
            ms=10,
            mew=2,
            label=f"first outside (reference step {first_failure['reference_step']})",
        )
    _axes(ax, ylabel)
    ax.legend(loc="best", frameon=False)
    return _svg(fig, hovers)


CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:1000px;color:#222;padding:0 1em}
h1{font-size:1.5em;margin:.2em 0 .4em}h2{font-size:1.1em;margin:1.2em 0 .3em;border-bottom:1px solid #ddd}
.badge{padding:1px 7px;border-radius:4px;color:#fff;font-weight:bold;font-size:.85em;white-space:nowrap}
.PASS{background:#228833}.FAIL{background:#cc3311}.UNKNOWN{background:#777}.info{background:#4477aa}
table{border-collapse:collapse;margin:.4em 0;font-size:.9em;display:block;overflow-x:auto;max-width:100%}
td,th{padding:2px 6px;border:1px solid #ddd;text-align:left;vertical-align:top}th{background:#f4f4f4}
table.verdicts td:nth-child(4){font-weight:600}details{margin:.4em 0}summary{cursor:pointer;color:#335}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:4px 12px;align-items:start}
.grid figure{margin:0}.grid svg{max-width:100%;height:auto}figcaption{color:#555;font-size:.85em}
p.flat{color:#555;font-style:italic;margin:2em 0}code{font-size:.95em}"""


def _clip(text: Any, limit: int) -> str:
    """Cut, then escaped: no entity is ever cut in half."""
    s = str(text)
    return html.escape(s if len(s) <= limit else s[: limit - 1] + "…")


def _row(k: str, v: Any) -> str:
    return f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"


def _badge(passed: bool | None) -> str:
    return {True: "PASS", False: "FAIL", None: "UNKNOWN"}[passed]


def _coverage(c: dict | None) -> str:
    if not c or not c.get("reference"):
        return "no reference held-out points"
    return f"{c['compared']} of {c['reference']} held-out points ({100 * c['share']:.0f}%)"


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.4f}"


def _judged(v: dict[str, Any], tolerance: float) -> str:
    """The number behind a held-out verdict: the largest |run − reference| against the band."""
    m = v.get("max_abs_heldout_diff")
    if m is None:
        return "nothing compared"
    return f"max |Δ| {m:.4f} vs ±{tolerance:g} over {v.get('compared_points', 0):,} points"


def verdict_rows(result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(check, badge, reason, deciding number) of every verdict on the page; 'info' for what is
    reported, not judged (the training-loss gap, the data comparison)."""
    v = result["verdict"]
    tol = v["tolerance"]
    overall = v.get("overall_passed", v["passed"])
    reason = v["summary"].split(";")[0]
    rows = [("held-out loss (overall)", _badge(overall), reason, _judged(v, tol))]
    for label, sv in result.get("sets", {}).items():
        rows.append((f"held-out set {label}", _badge(sv["passed"]), sv["summary"].split(";")[0], _judged(sv, tol)))
    ds = result.get("downstream")
    if ds:
        for kind, m in ds.get("macros", {}).items():
            num = m.get("max_abs_heldout_diff")
            rows.append(
                (
                    f"downstream {kind} macro",
                    _badge(m["passed"]),
                    m["summary"].split(";")[0],
                    "nothing compared" if num is None else f"max |Δ| {num:.4f} vs ±{m['tolerance']:g}",
                )
            )
    if ds and ds.get("clean"):  # --downstream_clean: which side's clean subsets were judged
        c = ds["clean"]
        side = {True: "logged", False: "none"}
        rows.append(
            (
                "downstream clean subsets",
                "info",
                c["note"],
                f"run: {side[c['run']]}; reference: {side[c['reference']]}",
            )
        )
    gap = v.get("train_loss_gap")
    if gap:
        rows.append(
            (
                "training loss (smoothed)",
                "info",
                "reported, not judged: a data bug that repeats data shows here as a gain (below 0)",
                f"final Δ {gap['final']:+.4f}, mean {gap['mean']:+.4f}",
            )
        )
    data = result.get("data")
    if data:
        rows.append(
            (
                "data stream",
                "info",
                data["summary"],
                f"{data.get('differing_steps', 0):,} of {data.get('steps_compared', 0):,} steps differ",
            )
        )
    return rows


def _verdict_table(result: dict[str, Any]) -> str:
    body = "".join(
        f'<tr><td>{html.escape(c)}</td><td><span class="badge {b}">{b}</span></td>'
        f'<td title="{html.escape(r)}">{_clip(r, MAX_REASON_CHARS)}</td><td>{html.escape(n)}</td></tr>'
        for c, b, r, n in verdict_rows(result)
    )
    return (
        '<table class="verdicts" id="verdicts"><tr><th>check</th><th>verdict</th><th>why</th>'
        f"<th>deciding number</th></tr>{body}</table>"
    )


def downstream_table(ds: dict[str, Any] | None) -> str:
    """Per-task rows of the downstream verdict (its last compared point), '' when there is none."""
    if not ds:
        return ""
    rows = [
        "<details><summary>Downstream tasks (run − reference at the last compared step)</summary><table><tr>"
        "<th>task</th><th>headline</th><th>better</th><th>run</th><th>reference</th><th>diff</th>"
        "<th>max |diff|</th><th>points</th></tr>"
    ]
    for label, t in ds["tasks"].items():
        metric = t["key"].rsplit(" (", 1)[-1].rstrip(")")
        cells = [label, metric, "higher" if t["higher_is_better"] else "lower"]
        if t["status"] == "compared":
            f = t["final"]
            cells += [_num(f["run"]), _num(f["reference"]), f"{f['diff']:+.4f}", _num(t["max_abs_diff"]), t["points"]]
        else:
            cells += [f"UNKNOWN: {t['why']}", "", "", "", 0]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    return "\n".join(rows) + "</table></details>"


def _facts(result: dict[str, Any]) -> str:
    v = result["verdict"]
    data = result.get("data")
    facts = result.get("run_facts") or {}
    rows = [
        _row("run", result["run"]["described"]),
        _row("reference", result["reference"]["described"]),
        _row("held-out tolerance", f"±{v['tolerance']:g} nats after {v['after_tokens']:,.0f} tokens"),
        _row("data", data["summary"] if data else "not compared (the reference is not an olmax run)"),
        _row("share of the reference compared", _coverage(v.get("coverage"))),
        _row("full verdict", v["summary"]),
        *(_row(k, val) for k, val in facts.items()),
    ]
    named = (("olmax", facts.get("olmax_version")), ("commit", str(facts.get("commit") or "")[:12]))
    head = [f"{k} {val}" for k, val in named if val]
    if facts.get("duration_s") is not None:
        head.append(f"took {facts['duration_s']:.0f} s")
    label = "Run facts and inputs" + (f" ({', '.join(head)})" if head else "")
    return f'<details id="facts"><summary>{html.escape(label)}</summary><table>{"".join(rows)}</table></details>'


def _figure(svg: str | None, caption: str, missing: str) -> str:
    if svg is None:
        return f'<p class="flat">{html.escape(missing)}</p>'
    return f"<figure>{svg}<figcaption>{html.escape(caption)}</figcaption></figure>"


def render(result: dict[str, Any], panels: list[Panel]) -> str:
    """result: compare.json's content; panels: a row of the grid each."""
    badge = _badge(result["verdict"]["passed"])
    parts = [
        f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>olmax compare: {badge}</title>"
        f"<style>{CSS}</style></head><body>",
        f'<h1>olmax fidelity report: <span class="badge {badge}">{badge}</span></h1>',
        _verdict_table(result),
        _facts(result),
        downstream_table(result.get("downstream")),
    ]
    for p in panels:
        badge = f' <span class="badge {p.badge}">{p.badge}</span>' if p.badge else ""
        parts.append(f"<h2>{html.escape(p.title)}{badge}</h2><div class=grid>")
        parts.append(_figure(p.value, p.caption, f"{p.caption}: not logged by either side."))
        parts.append(_figure(p.difference, p.diff_caption, p.diff_note or "no overlapping points to difference."))
        parts.append("</div>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write(out_dir: str, result: dict[str, Any], panels: list[Panel]) -> tuple[str, str]:
    """compare.html, then compare.json (the verdict), each written to a temporary file in `out_dir`
    and renamed over its name (contract.write_atomic): an interrupted write leaves the previous file
    (or none), never a truncated one; a failed one is a WriteFailed (a Stopped: exit 3)."""
    html_path, json_path = os.path.join(out_dir, "compare.html"), os.path.join(out_dir, "compare.json")
    text = json.dumps(result, indent=1, default=_json_default) + "\n"
    write_atomic(html_path, render(result, panels))
    write_atomic(json_path, text)  # the verdict: last
    return html_path, json_path


def _json_default(x: object) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON-able: {type(x).__name__}")
