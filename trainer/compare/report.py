"""compare.html: one self-contained page (inline SVG from matplotlib's Agg/SVG backend, inline
CSS, no script, nothing fetched) and compare.json.

Figures (x axis: tokens seen), each overlaid and then differenced (run − reference): training loss
raw + smoothed (differences of both); held-out loss (difference with the ±tolerance band); grad
norm; learning rate.
"""

from __future__ import annotations

import html
import io
import json
import os
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display; the SVG backend draws the figures we inline
import matplotlib.pyplot as plt
import numpy as np

from contract import write_atomic

from .curves import Aligned, Curves, smooth

RUN_COLOR, REF_COLOR, DIFF_COLOR, BAD_COLOR = "#1f77b4", "#7f7f7f", "#9467bd", "#d62728"
FIGSIZE = (9.0, 3.2)  # inches; 2 figures per screen height
plt.rcParams.update(
    {
        "svg.fonttype": "none",
        "svg.hashsalt": "olmax-compare",
        "font.size": 9,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "axes.spines.top": False,
        "axes.spines.right": False,
    }
)


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog and DOCTYPE: inline SVG in HTML


def _tokens_axis(ax) -> None:
    ax.set_xlabel("tokens seen")
    ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 3))


def overlay(run: Curves, ref: Curves, metric: str, ylabel: str, smoothing: int = 0, log_y: bool = False) -> str | None:
    """Both runs' `metric` against tokens (raw faint + smoothed when smoothing > 1)."""
    rt, _, rv = run.series(metric)
    ft, _, fv = ref.series(metric)
    if len(rt) == 0 and len(ft) == 0:
        return None
    fig, ax = plt.subplots(figsize=FIGSIZE)
    for t, v, name, color in ((ft, fv, ref.name, REF_COLOR), (rt, rv, run.name, RUN_COLOR)):
        if len(t) == 0:
            continue
        marker = "o" if len(t) <= 60 else None
        if smoothing > 1:
            ax.plot(t, v, color=color, alpha=0.25, lw=0.8)
            ax.plot(t, smooth(v, smoothing), color=color, lw=1.6, label=f"{name} (mean of {smoothing})")
        else:
            ax.plot(t, v, color=color, lw=1.4, marker=marker, ms=3, label=name)
    if log_y:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    _tokens_axis(ax)
    ax.legend(loc="best", frameon=False)
    return _svg(fig)


def difference(
    a: Aligned,
    ylabel: str,
    tolerance: float | None = None,
    after_tokens: float = 0.0,
    first_failure: dict | None = None,
) -> str | None:
    """run − reference on the reference's points, with the ±tolerance band when judged."""
    if len(a.tokens) == 0:
        return None
    fig, ax = plt.subplots(figsize=FIGSIZE)
    ax.axhline(0.0, color="black", lw=0.8)
    if tolerance is not None:
        ax.axhspan(-tolerance, tolerance, color="#2ca02c", alpha=0.15, label=f"±{tolerance:g} tolerance")
        if after_tokens > 0:
            ax.axvline(after_tokens, color="black", ls=":", lw=1, label="judged from here")
    marker = "o" if len(a.tokens) <= 60 else None
    ax.plot(a.tokens, a.diff, color=DIFF_COLOR, lw=1.4, marker=marker, ms=3, label="run − reference")
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
    ax.set_ylabel(ylabel)
    _tokens_axis(ax)
    ax.legend(loc="best", frameon=False)
    return _svg(fig)


CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:980px;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
.badge{padding:.1em .5em;border-radius:.3em;color:#fff}.PASS{background:#2ca02c}
.FAIL{background:#d62728}.UNKNOWN{background:#7f7f7f}table{border-collapse:collapse}
td,th{padding:.2em .8em;border-bottom:1px solid #eee;text-align:left}code{font-size:.95em}
figure{margin:.5em 0}figcaption{color:#555;font-size:.9em}"""


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


def downstream_table(ds: dict[str, Any] | None) -> str:
    """Per-task rows of the downstream verdict (its last compared point), '' when there is none."""
    if not ds:
        return ""
    rows = [
        "<h2>Downstream tasks (run − reference at the last compared step)</h2><table><tr><th>task</th>"
        "<th>headline</th><th>better</th><th>run</th><th>reference</th><th>diff</th><th>max |diff|</th>"
        "<th>points</th></tr>"
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
    return "\n".join(rows) + "</table>"


def render(result: dict[str, Any], figures: list[tuple[str, str, str | None]]) -> str:
    """result: compare.json's content; figures: (section title, caption, svg or None)."""
    v = result["verdict"]
    badge = {True: "PASS", False: "FAIL", None: "UNKNOWN"}[v["passed"]]
    data = result.get("data")
    parts = [
        f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>olmax compare: {badge}</title>"
        f"<style>{CSS}</style></head><body>",
        f'<h1>olmax fidelity report: <span class="badge {badge}">{badge}</span></h1>',
        f"<p>{html.escape(v['summary'])}</p><table>",
        _row("run", result["run"]["described"]),
        _row("reference", result["reference"]["described"]),
        _row("held-out tolerance", f"±{v['tolerance']:g} nats after {v['after_tokens']:,.0f} tokens"),
        _row("data", data["summary"] if data else "not compared (the reference is not an olmax run)"),
        _row("share of the reference compared", _coverage(v.get("coverage"))),
        *(
            _row(f"set {label}", f"{_badge(sv['passed'])}: {sv['summary']}")
            for label, sv in result.get("sets", {}).items()
        ),
        *(
            (_row("downstream", f"{_badge(ds['passed'])}: {ds['summary']}"),)
            if (ds := result.get("downstream"))
            else ()
        ),
        "</table>",
        downstream_table(result.get("downstream")),
    ]
    for title, caption, svg in figures:
        parts.append(f"<h2>{html.escape(title)}</h2>")
        if svg is None:
            parts.append(f"<p>{html.escape(caption)}: not logged by either side.</p>")
        else:
            parts.append(f"<figure>{svg}<figcaption>{html.escape(caption)}</figcaption></figure>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write(out_dir: str, result: dict[str, Any], figures: list[tuple[str, str, str | None]]) -> tuple[str, str]:
    """compare.html, then compare.json (the verdict), each written to a temporary file in `out_dir`
    and renamed over its name (contract.write_atomic): an interrupted write leaves the previous file
    (or none), never a truncated one; a failed one is a WriteFailed (a Stopped: exit 3)."""
    html_path, json_path = os.path.join(out_dir, "compare.html"), os.path.join(out_dir, "compare.json")
    text = json.dumps(result, indent=1, default=_json_default) + "\n"
    write_atomic(html_path, render(result, figures))
    write_atomic(json_path, text)  # the verdict: last
    return html_path, json_path


def _json_default(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON-able: {type(x).__name__}")
