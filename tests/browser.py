"""Measuring a page rendered by headless Chromium (the `chromium` fixture of tests/conftest.py):
how tall it is, and what its first screen shows."""

from __future__ import annotations

import html
import re
from pathlib import Path

import numpy as np
from PIL import Image

FIRST_SCREEN = (1000, 900)  # CSS px: a laptop's browser window
TALL = 16000  # px: taller than any page measured here (Chromium renders the whole window)


def rows_with_ink(shot: Path) -> np.ndarray:
    """Indices of the screenshot's rows holding anything not white."""
    img = np.asarray(Image.open(shot).convert("L"))
    return np.flatnonzero((img < 250).any(axis=1))


def page_height(chromium, page: Path, tmp: Path, width: int = 1000) -> int:
    """The rendered height of `page` in CSS px: the last row with ink in a very tall window."""
    shot = tmp / f"{page.stem}-tall.png"
    proc = chromium(page, shot, f"{width},{TALL}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    ink = rows_with_ink(shot)
    assert len(ink) and ink[-1] < TALL - 1, "the page is taller than the measuring window"
    return int(ink[-1]) + 1


def first_screen_height_of(chromium, page: Path, tmp: Path, element_id: str) -> int:
    """How far down the page element `element_id` (a child of <body>) ends: the height of a copy of
    the page with everything after that element hidden."""
    text = page.read_text(encoding="utf-8")
    assert f'id="{element_id}"' in text
    cut = tmp / f"{page.stem}-to-{element_id}.html"
    cut.write_text(text.replace("</head>", f"<style>#{element_id} ~ *{{display:none}}</style></head>", 1))
    return page_height(chromium, cut, tmp)


ENTITY = re.compile(r"&(?:[A-Za-z][A-Za-z0-9]*|#[0-9]+|#x[0-9A-Fa-f]+);")


def broken_escapes(page_text: str) -> list[str]:
    """Each '&' in the HTML that does not start a whole character reference, and each text that
    shows an escape to the reader (escaped twice, or cut mid-reference), with some context."""
    bad = [page_text[max(0, m.start() - 20) : m.start() + 20] for m in re.finditer("&", page_text)]
    bad = [b for b, m in zip(bad, re.finditer("&", page_text)) if not ENTITY.match(page_text, m.start())]
    shown = html.unescape(re.sub(r"<[^>]*>", " ", page_text))
    bad += [
        shown[max(0, m.start() - 20) : m.start() + 20] for m in re.finditer(r"&(#\d*|#x|amp;|lt;|gt;|quot;)", shown)
    ]
    return bad


def unlabelled_charts(page_text: str) -> list[str]:
    """The title (or start) of each inline <svg> chart without both axis labels: a non-empty
    `<text class="axis-label x|y">` (audit.svg) or `<g class="axis-label x|y">` group (matplotlib)."""
    out = []
    for svg in re.findall(r"<svg.*?</svg>", page_text, flags=re.S):
        for axis in ("x", "y"):
            label = re.search(rf'class="axis-label {axis}"[^>]*>(.*?)</(text|g)>', svg, flags=re.S)
            if not label or not re.sub(r"<[^>]*>|\s", "", label.group(1)):
                title = re.search(r"<title>([^<]*)</title>", svg)
                out.append(f"{title.group(1) if title else svg[:80]}: no {axis} label")
    return out
