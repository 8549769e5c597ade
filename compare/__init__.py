"""Fidelity report: an olmax run against a reference run or metrics table (`python -m compare`).

Modules: `table` (CSV/JSONL reader with a column mapping), `curves` (alignment by tokens,
differences, the verdict; pure), `evaluation` (whether the two held-out evaluations can be
compared; pure), `downstream` (the downstream verdict: per task, macro averages; pure), `data`
(data logs and data_sha256 chains of two runs), `sides` (reading the two inputs), `judging` (the
judging stage: `judge` → the verdicts and compare.json's content, nothing drawn),
`figures` (the drawing stage: the page's panels from that value), `report` (compare.html +
compare.json), `cli` (the command: judge, then draw, then write).
"""

from .cli import CompareConfig, Judged, draw, judge, main

__all__ = ["CompareConfig", "Judged", "draw", "judge", "main"]
