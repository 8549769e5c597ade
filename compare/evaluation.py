"""Whether two sides' held-out evaluations can be compared at all (pure functions).

A held-out loss is a fact about a model *and* an evaluation: which sets, how their instances are
built (``eval.instances``) and how many examples of each were read (``eval_batches`` ×
``global_batch_size``; unset = each set whole). Two runs that trained alike but evaluated
differently differ by a few hundredths of a nat per set, which a tolerance of 0.01 reads as a
model that does not match. So before any held-out point is judged:

* the sets: per-set losses are compared on the sets both sides logged; with none in common there
  is nothing to compare. A pooled ``heldout_loss`` is compared only when neither side logged its
  sets (older runs, tables with one held-out column): when one side did and the other did not,
  which sets the other pooled is unknown;
* the settings each evaluation row records (``trainer.heldout_eval.SETTINGS``): instances and the
  examples read per set must agree. A side that records none (a table; a run from before they were
  recorded) is not checked on them, and the report says so. Settings changed mid-run (``eval_batches``
  at a resume) are a difference unless both sides recorded the same settings at the same steps;
* the target tokens each set counted (``heldout/<set>/tokens``, ``heldout_tokens`` for a pooled
  loss), where both sides logged them: the same settings on the same sets count the same tokens.

Any difference makes the held-out verdict UNKNOWN, naming it; the training-loss comparison stands.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .curves import POOLED_TOKENS, Curves, set_key

SETTINGS_KEY = "eval_settings"  # trainer.heldout_eval.SETTINGS (written out: no Grain import here)


@dataclasses.dataclass(frozen=True)
class Check:
    """problems: why the held-out losses cannot be compared (empty: they can), those of every set
    and then each set's own (`of_set`); notes: what could not be checked."""

    problems: list[str]
    notes: list[str]
    per_set: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    def of_set(self, label: str) -> list[str]:
        """The problems that concern `label`: every set's, and its own."""
        own = {p for ps in self.per_set.values() for p in ps}
        return [p for p in self.problems if p not in own] + self.per_set.get(label, [])

    def to_json(self) -> dict[str, Any]:
        return {"problems": self.problems, "notes": self.notes}


def _settings_rows(rows: Sequence[Mapping[str, Any]]) -> list[tuple[Any, dict[str, Any]]] | None:
    """(step, settings) of each of a run's evaluation rows; None when one records none (a run from
    before they were recorded: unknown)."""
    out = []
    for r in rows:
        if r.get("heldout_loss") is None:
            continue
        s = r.get(SETTINGS_KEY)
        if not isinstance(s, dict):
            return None
        out.append((r.get("step"), s))
    return out


def recorded_settings(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    """The distinct settings of a run's evaluation rows, in first-logged order; None when an
    evaluation row records none (a run from before they were recorded: unknown)."""
    rows_ = _settings_rows(rows)
    if rows_ is None:
        return None
    out: list[dict[str, Any]] = []
    for _, s in rows_:
        if s not in out:
            out.append(dict(s))
    return out or None


def settings_history(rows: Sequence[Mapping[str, Any]]) -> tuple | None:
    """(step, settings) of each of a run's evaluation rows; None when one records none."""
    rows_ = _settings_rows(rows)
    if rows_ is None:
        return None
    return tuple((step, json.dumps(s, sort_keys=True)) for step, s in rows_) or None


def _examples(s: Mapping[str, Any]) -> str:
    """Examples read per set, as a text: 'all' (each set whole) or 'B × G = N'."""
    b, g = s.get("batches"), s.get("global_batch_size")
    if b is None:
        return "all"
    return f"{b} × {g} = {b * g}" if isinstance(b, int) and isinstance(g, int) else f"{b} batches of {g}"


def _examples_key(s: Mapping[str, Any]) -> Any:
    b, g = s.get("batches"), s.get("global_batch_size")
    return None if b is None else (b * g if isinstance(b, int) and isinstance(g, int) else (b, g))


def settings_problems(run: list[dict] | None, ref: list[dict] | None) -> list[str]:
    """The evaluation settings that differ between the sides (both recorded)."""
    if run is None or ref is None:
        return []
    out = []
    for side, settings in (("run", run), ("reference", ref)):
        if len(settings) > 1:
            out.append(
                f"the {side} changed its evaluation settings mid-run: "
                f"{'; '.join(json.dumps(s, sort_keys=True) for s in settings)}"
            )
    a, b = run[-1], ref[-1]
    if a.get("instances") != b.get("instances"):
        out.append(f"eval.instances: run {a.get('instances')!r}, reference {b.get('instances')!r}")
    if _examples_key(a) != _examples_key(b):
        out.append(
            f"examples read per set (eval_batches × global_batch_size): run {_examples(a)}, reference {_examples(b)}"
        )
    return out


def _last(curves: Curves, key: str) -> float | None:
    v = curves.values.get(key)
    v = v[np.isfinite(v)] if v is not None else np.zeros(0)
    return float(v[-1]) if len(v) else None


def token_problems(run: Curves, ref: Curves, labels: Sequence[str]) -> dict[str | None, str]:
    """{set (None: the pool, when `labels` is empty): problem} of those whose counted target tokens differ."""
    keys: list[tuple[str | None, str, str]] = [(x, f"set {x}", set_key(x, "tokens")) for x in labels] or [
        (None, "the pooled held-out loss", POOLED_TOKENS)
    ]
    out: dict[str | None, str] = {}
    for label, what, key in keys:
        a, b = _last(run, key), _last(ref, key)
        if a is not None and b is not None and a != b:
            out[label] = f"{what}: the run counted {a:,.0f} target tokens, the reference {b:,.0f}"
    return out


def sets_problem(run_labels: Sequence[str], ref_labels: Sequence[str]) -> str | None:
    """Why no held-out loss of the two sides measures the same sets (None when one does)."""
    common = [x for x in run_labels if x in ref_labels]
    if common or (not run_labels and not ref_labels):
        return None
    if run_labels and ref_labels:
        return f"no held-out set in common: the run evaluated {list(run_labels)}, the reference {list(ref_labels)}"
    side, other, labels = ("reference", "run", run_labels) if run_labels else ("run", "reference", ref_labels)
    return (
        f"the {side} logged no per-set held-out losses, so which sets its heldout_loss pools is unknown; "
        f"the {other} evaluated {list(labels)}"
    )


def check(
    run: Curves,
    ref: Curves,
    labels: Sequence[str],
    run_settings: list[dict] | None,
    ref_settings: list[dict] | None,
    ref_is_table: bool,
    same_history: bool = False,
) -> Check:
    """same_history: both sides recorded the same settings at the same steps of the same tokens
    per step (a run against itself, or a twin), so every compared point measured one evaluation
    even where the settings changed mid-run."""
    problem = sets_problem(run.labels, ref.labels)
    if problem:
        return Check([problem], [])
    tokens = token_problems(run, ref, labels)
    problems = ([] if same_history else settings_problems(run_settings, ref_settings)) + list(tokens.values())
    notes = []
    for side, settings in (("run", run_settings), ("reference", ref_settings)):
        if settings is None:
            why = "a metrics table" if side == "reference" and ref_is_table else "a run from before they were"
            notes.append(f"the {side}'s evaluation settings are not recorded ({why}): not checked")
    return Check(problems, notes, {x: [p] for x, p in tokens.items() if x is not None})
