"""Hand-written SVG charts (standard library only: the report must be one offline file, no script).

Every chart has both axes labelled (`<text class="axis-label x|y">`), round ticks (1k / 10k / 1.2M),
and a `<title>` on each mark, which browsers show on hover. A chart with nothing to tell (an
all-zero matrix, a constant series) is not drawn: the report says it in one line of text instead
(`flat_text`). Colours come from `PALETTE` (Paul Tol's colour-blind-safe set).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from html import escape

PALETTE = ("#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#bbbbbb")
WIDTH, HEIGHT = 640, 240
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 64, 16, 28, 52


def _frame(body: list[str], title: str, width: int = WIDTH, height: int = HEIGHT) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}" font-family="system-ui,sans-serif">'
        f"<title>{escape(title)}</title>" + "".join(body) + "</svg>"
    )


def fmt(v: float) -> str:
    """A round, short number: 0, 0.25, 442, 1.3k, 10k, 1.2M, 3G (k/M/G: thousands, millions, billions)."""
    if v == 0 or not math.isfinite(v):
        return "0" if v == 0 else str(v)
    a = abs(v)
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{v / div:.3g}{suffix}"
    if a >= 0.01:
        return f"{v:.3g}"
    return f"{v:.1e}"


def nice_ticks(top: float, count: int = 4) -> list[float]:
    """0 and round steps (1, 2, 2.5 or 5 × 10^k) up to the first tick at or above `top`."""
    if top <= 0 or not math.isfinite(top):
        return [0.0, 1.0]
    raw = top / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    n = math.ceil(top / step - 1e-9)
    return [round(i * step, 12) for i in range(n + 1)]


def _axes(x_label: str, y_label: str, width: int = WIDTH, height: int = HEIGHT) -> list[str]:
    mid_y = MARGIN_T + (height - MARGIN_T - MARGIN_B) / 2
    return [
        f'<text class="axis-label x" x="{MARGIN_L + (width - MARGIN_L - MARGIN_R) / 2:.0f}" y="{height - 6}" '
        f'font-size="12" text-anchor="middle">{escape(x_label)}</text>',
        f'<text class="axis-label y" x="14" y="{mid_y:.0f}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 14 {mid_y:.0f})">{escape(y_label)}</text>',
    ]


def _y_grid(ticks: list[float], plot_h: float, width: int = WIDTH) -> list[str]:
    top = ticks[-1]
    out = []
    for t in ticks:
        y = MARGIN_T + plot_h * (1 - t / top)
        out.append(
            f'<line x1="{MARGIN_L}" x2="{width - MARGIN_R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e4e4"/>'
            f'<text x="{MARGIN_L - 4}" y="{y + 4:.1f}" font-size="10" text-anchor="end">{fmt(t)}</text>'
        )
    return out


def bar_chart(
    title: str,
    categories: list[str],
    series: dict[str, list[float | None]],
    y_label: str,
    x_label: str,
    value_fmt: Callable[[float], str] = fmt,
) -> str:
    """Grouped bars: one group per category, one bar per series (None values are left out); a
    legend above the plot when there are several series."""
    vals = [v for vs in series.values() for v in vs if v is not None]
    ticks = nice_ticks(max(vals + [0.0]))
    top = ticks[-1]
    plot_w, plot_h = WIDTH - MARGIN_L - MARGIN_R, HEIGHT - MARGIN_T - MARGIN_B
    group_w = plot_w / max(1, len(categories))
    bar_w = group_w * 0.8 / max(1, len(series))
    body = _y_grid(ticks, plot_h) + _axes(x_label, y_label)
    every = max(1, math.ceil(len(categories) * 40 / plot_w))  # category labels at least 40 px apart
    for ci, cat in enumerate(categories):
        gx = MARGIN_L + ci * group_w + group_w * 0.1
        for si, (name, vs) in enumerate(series.items()):
            v = vs[ci]
            if v is None:
                continue
            h = plot_h * v / top
            label = f"{cat}: {name} {value_fmt(v)}" if len(series) > 1 else f"{cat}: {value_fmt(v)}"
            body.append(
                f'<rect x="{gx + si * bar_w:.1f}" y="{MARGIN_T + plot_h - h:.1f}" '
                f'width="{max(bar_w * 0.95, 1):.1f}" height="{h:.1f}" fill="{PALETTE[si % len(PALETTE)]}">'
                f"<title>{escape(label)}</title></rect>"
            )
        if ci % every == 0:
            body.append(
                f'<text x="{gx + group_w * 0.4:.1f}" y="{HEIGHT - MARGIN_B + 14}" font-size="10" '
                f'text-anchor="middle">{escape(cat[:18])}</text>'
            )
    if len(series) > 1:
        for si, name in enumerate(series):
            x = MARGIN_L + si * 110
            body.append(
                f'<rect x="{x}" y="6" width="10" height="10" fill="{PALETTE[si % len(PALETTE)]}"/>'
                f'<text x="{x + 14}" y="15" font-size="11">{escape(name)}</text>'
            )
    return _frame(body, title)


def histogram(title: str, labels: list[str], counts: list[int], x_label: str, y_label: str = "documents") -> str:
    return bar_chart(title, labels, {y_label: [float(c) for c in counts]}, y_label, x_label)


def heatmap(title: str, matrix: list[list[int]], label: str = "host", what: str = "positions") -> str:
    """H×H matrix with its count in each cell (when the cell is big enough; always on hover): the
    diagonal in blue, any off-diagonal value in red."""
    n = len(matrix)
    cell = max(6, min(44, 200 // max(1, n)))
    left, top_m = 56, 40
    size_w, size_h = left + cell * n + 12, top_m + cell * n + 12
    vmax = max((v for row in matrix for v in row), default=1) or 1
    body = [
        f'<text class="axis-label x" x="{left + cell * n / 2:.0f}" y="14" font-size="12" text-anchor="middle">'
        f"{escape(label)} j</text>",
        f'<text class="axis-label y" x="14" y="{top_m + cell * n / 2:.0f}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 14 {top_m + cell * n / 2:.0f})">{escape(label)} i</text>',
    ]
    show = cell >= 28
    for i, row in enumerate(matrix):
        if show or i % max(1, n // 8) == 0:
            body.append(
                f'<text x="{left - 4}" y="{top_m + i * cell + cell / 2 + 4:.0f}" font-size="10" text-anchor="end">{i}</text>'
                f'<text x="{left + i * cell + cell / 2:.0f}" y="{top_m - 4}" font-size="10" text-anchor="middle">{i}</text>'
            )
        for j, v in enumerate(row):
            shade = 0.15 + 0.85 * v / vmax if v else 0.0
            colour = "68,119,170" if i == j else "238,102,119"
            fill = f"rgba({colour},{shade:.3f})" if v else "#f8f8f8"
            x, y = left + j * cell, top_m + i * cell
            body.append(
                f'<rect x="{x}" y="{y}" width="{cell - 1}" height="{cell - 1}" fill="{fill}">'
                f"<title>{escape(label)} {i} × {escape(label)} {j}: {v:,} {escape(what)}</title></rect>"
            )
            if show:
                ink = "#fff" if shade > 0.6 else "#222"
                body.append(
                    f'<text x="{x + cell / 2:.0f}" y="{y + cell / 2 + 4:.0f}" font-size="10" '
                    f'text-anchor="middle" fill="{ink}">{fmt(v)}</text>'
                )
    return _frame(body, title, width=size_w, height=size_h)


def step_line(title: str, segments: list[list[int]], y_label: str = "hosts logging") -> str:
    """Run-length segments [first_step, last_step, value] drawn as a step function."""
    x0, x1 = segments[0][0], max(segments[-1][1], segments[0][0] + 1)
    ticks = nice_ticks(max(s[2] for s in segments))
    top = ticks[-1]
    plot_w, plot_h = WIDTH - MARGIN_L - MARGIN_R, HEIGHT - MARGIN_T - MARGIN_B

    def px(step: float) -> float:
        return MARGIN_L + plot_w * (step - x0) / (x1 - x0)

    def py(v: float) -> float:
        return MARGIN_T + plot_h * (1 - v / top)

    body = _y_grid(ticks, plot_h) + _axes("step", y_label)
    for a, b, v in segments:
        body.append(
            f'<line x1="{px(a):.1f}" x2="{px(b + 1 if b < x1 else b):.1f}" y1="{py(v):.1f}" y2="{py(v):.1f}" '
            f'stroke="{PALETTE[0]}" stroke-width="3"><title>steps {a}–{b}: {v}</title></line>'
        )
    for t in nice_ticks(x1 - x0):
        if t <= x1 - x0:
            body.append(
                f'<text x="{px(x0 + t):.1f}" y="{HEIGHT - MARGIN_B + 14}" font-size="10" '
                f'text-anchor="middle">{fmt(x0 + t)}</text>'
            )
    return _frame(body, title)


def is_flat(segments: list[list[int]]) -> bool:
    """One value over the whole range: a chart would be a flat line."""
    return len({s[2] for s in segments}) <= 1


def stacked_shares(title: str, categories: list[str], series: dict[str, list[int]], x_label: str, y_label: str) -> str:
    """One horizontal bar per category, split into its series' shares of the category's total: the
    count written in each segment wide enough to hold it, count and share on hover."""
    row_h, gap, left = 26, 8, 96
    legend_h = 22
    height = MARGIN_T + legend_h + len(categories) * (row_h + gap) + 40
    plot_w = WIDTH - left - MARGIN_R
    body = [
        f'<text class="axis-label x" x="{left + plot_w / 2:.0f}" y="{height - 6}" font-size="12" '
        f'text-anchor="middle">{escape(x_label)}</text>',
        f'<text class="axis-label y" x="14" y="{MARGIN_T + legend_h + 20}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 14 {MARGIN_T + legend_h + 20})">{escape(y_label)}</text>',
    ]
    for si, name in enumerate(series):
        lx = left + si * 110
        body.append(
            f'<rect x="{lx}" y="6" width="10" height="10" fill="{PALETTE[si % len(PALETTE)]}"/>'
            f'<text x="{lx + 14}" y="15" font-size="11">{escape(name)}</text>'
        )
    base = MARGIN_T + legend_h
    for t in (0, 0.25, 0.5, 0.75, 1.0):
        gx = left + plot_w * t
        body.append(
            f'<line x1="{gx:.1f}" x2="{gx:.1f}" y1="{base - 4}" y2="{height - 34}" stroke="#e4e4e4"/>'
            f'<text x="{gx:.1f}" y="{height - 22}" font-size="10" text-anchor="middle">{t:.0%}</text>'
        )
    for ci, cat in enumerate(categories):
        y = base + ci * (row_h + gap)
        total = sum(vs[ci] for vs in series.values()) or 1
        body.append(
            f'<text x="{left - 6}" y="{y + row_h / 2 + 4:.0f}" font-size="11" text-anchor="end">{escape(cat[:14])}</text>'
        )
        x = float(left)
        for si, (name, vs) in enumerate(series.items()):
            v = vs[ci]
            if not v:
                continue
            w = plot_w * v / total
            body.append(
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row_h}" fill="{PALETTE[si % len(PALETTE)]}">'
                f"<title>{escape(cat)}: {v:,} {escape(name)} ({v / total:.1%})</title></rect>"
            )
            if w >= 8 * len(fmt(v)) + 6:
                body.append(
                    f'<text x="{x + w / 2:.1f}" y="{y + row_h / 2 + 4:.0f}" font-size="10" fill="#fff" '
                    f'text-anchor="middle">{fmt(v)}</text>'
                )
            x += w
    return _frame(body, title, height=height)
