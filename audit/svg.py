"""Hand-written SVG charts (standard library only: the report must be one offline file).

Each function returns an `<svg>` string sized in CSS pixels; colours come from `PALETTE`.
"""

from __future__ import annotations

from html import escape

PALETTE = ("#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#bbbbbb")
WIDTH, HEIGHT = 640, 260
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 56, 16, 24, 56


def _frame(body: list[str], title: str, width: int = WIDTH, height: int = HEIGHT) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">'
        f"<title>{escape(title)}</title>" + "".join(body) + "</svg>"
    )


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000 or abs(v) < 0.01:
        return f"{v:.2g}"
    return f"{v:.3g}"


def bar_chart(title: str, categories: list[str], series: dict[str, list[float | None]], y_label: str = "") -> str:
    """Grouped bars: one group per category, one bar per series (None values are left out)."""
    vals = [v for vs in series.values() for v in vs if v is not None]
    top = max(vals + [1e-12])
    plot_w, plot_h = WIDTH - MARGIN_L - MARGIN_R, HEIGHT - MARGIN_T - MARGIN_B
    group_w = plot_w / max(1, len(categories))
    bar_w = group_w * 0.8 / max(1, len(series))
    body = [f'<text x="{MARGIN_L}" y="14" font-size="12">{escape(y_label)}</text>']
    for k in range(5):
        y = MARGIN_T + plot_h * (1 - k / 4)
        body.append(
            f'<line x1="{MARGIN_L}" x2="{WIDTH - MARGIN_R}" y1="{y:.1f}" y2="{y:.1f}" '
            f'stroke="#ddd"/><text x="{MARGIN_L - 4}" y="{y + 4:.1f}" font-size="10" '
            f'text-anchor="end">{_fmt(top * k / 4)}</text>'
        )
    for ci, cat in enumerate(categories):
        gx = MARGIN_L + ci * group_w + group_w * 0.1
        for si, (name, vs) in enumerate(series.items()):
            v = vs[ci]
            if v is None:
                continue
            h = plot_h * v / top
            body.append(
                f'<rect x="{gx + si * bar_w:.1f}" y="{MARGIN_T + plot_h - h:.1f}" '
                f'width="{bar_w * 0.95:.1f}" height="{h:.1f}" fill="{PALETTE[si % len(PALETTE)]}">'
                f"<title>{escape(cat)} {escape(name)}: {_fmt(v)}</title></rect>"
            )
        body.append(
            f'<text x="{gx + group_w * 0.4:.1f}" y="{HEIGHT - MARGIN_B + 14}" font-size="10" '
            f'text-anchor="middle">{escape(cat[:18])}</text>'
        )
    for si, name in enumerate(series):
        x = MARGIN_L + si * 120
        body.append(
            f'<rect x="{x}" y="{HEIGHT - 18}" width="10" height="10" '
            f'fill="{PALETTE[si % len(PALETTE)]}"/><text x="{x + 14}" y="{HEIGHT - 9}" '
            f'font-size="11">{escape(name)}</text>'
        )
    return _frame(body, title)


def histogram(title: str, labels: list[str], counts: list[int], x_label: str = "") -> str:
    return bar_chart(title, labels, {x_label or "count": [float(c) for c in counts]}, "documents")


def heatmap(title: str, matrix: list[list[int]], label: str = "host") -> str:
    """H×H matrix; the diagonal is drawn in blue, any off-diagonal value in red."""
    n = len(matrix)
    cell = max(4, min(40, (HEIGHT - 40) // max(1, n)))
    size = cell * n + 60
    top = max((v for row in matrix for v in row), default=1) or 1
    body = [f'<text x="40" y="14" font-size="11">{escape(label)} × {escape(label)}</text>']
    for i, row in enumerate(matrix):
        for j, v in enumerate(row):
            shade = 0.15 + 0.85 * v / top if v else 0.0
            colour = "68,119,170" if i == j else "238,102,119"
            fill = f"rgba({colour},{shade:.3f})" if v else "#f8f8f8"
            body.append(
                f'<rect x="{40 + j * cell}" y="{20 + i * cell}" width="{cell - 1}" '
                f'height="{cell - 1}" fill="{fill}"><title>{label} {i} × {label} {j}: {v}'
                f"</title></rect>"
            )
    return _frame(body, title, width=size, height=size)


def step_line(title: str, segments: list[list[int]], y_label: str = "hosts") -> str:
    """Run-length segments [first_step, last_step, value] drawn as a step function."""
    if not segments:
        return _frame([], title)
    x0, x1 = segments[0][0], max(segments[-1][1], segments[0][0] + 1)
    top = max(s[2] for s in segments) or 1
    plot_w, plot_h = WIDTH - MARGIN_L - MARGIN_R, HEIGHT - MARGIN_T - MARGIN_B

    def px(step: float) -> float:
        return MARGIN_L + plot_w * (step - x0) / (x1 - x0)

    def py(v: float) -> float:
        return MARGIN_T + plot_h * (1 - v / (top * 1.1))

    pts = []
    for a, b, v in segments:
        pts += [f"{px(a):.1f},{py(v):.1f}", f"{px(b + 1 if b < x1 else b):.1f},{py(v):.1f}"]
    body = [
        f'<text x="{MARGIN_L}" y="14" font-size="12">{escape(y_label)} per step</text>',
        f'<polyline points="{" ".join(pts)}" fill="none" stroke="{PALETTE[0]}" stroke-width="2"/>',
        f'<text x="{MARGIN_L}" y="{HEIGHT - MARGIN_B + 16}" font-size="10">step {x0}</text>',
        f'<text x="{WIDTH - MARGIN_R}" y="{HEIGHT - MARGIN_B + 16}" font-size="10" text-anchor="end">step {x1}</text>',
        f'<text x="{MARGIN_L - 4}" y="{py(top) + 4:.1f}" font-size="10" text-anchor="end">{top}</text>',
    ]
    return _frame(body, title)
