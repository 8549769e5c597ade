"""The downstream verdict: a run's in-loop task metrics against the reference's (pure functions).

Keys are OLMo-core's, as olmax's metrics.jsonl and AI2's W&B history both spell them:
``eval/downstream/<label> (<metric label>)`` (trainer.downstream.metric.METRIC_LABELS). A task logs
every value ICLMetric computes; its headline (the one judged) is the value of the task's own metric
type, in its v2 spelling, which is the one AI2's tooling reads off W&B (olmo-cookbook, olmix):

==============================================  ===========  ====================================  ======
task                                            metric type  headline key suffix                   better
==============================================  ===========  ====================================  ======
arc_{challenge,easy}_test_mc_5shot_fast         acc          (accuracy v2)                         higher
mmlu_*_test_mc_5shot_fast                       len_norm     (length-normalized accuracy v2)       higher
basic_skills_*_rc_5shot, copycolors_10way_fast  acc          (accuracy v2)                         higher
every *_bpb_* task                              bpb          (BPB v2)                              lower
==============================================  ===========  ====================================  ======

The metric type is read off the keys the run logged (an accuracy-type task logs its accuracy
beside CE loss, BPB and soft losses; a bpb task logs BPB and BPB v2 only), so any olmo_eval task
works. For acc, len_norm and pmi_dc ICLMetric's v1 and v2 are the same number: a reference that
logged only the v1 key is read through it.

The verdict is on macro averages, one per kind of number (accuracies and BPB are not averaged
together): at each evaluation both sides logged, the plain mean of the headlines of the tasks both
sides have. Each macro must stay within ±tolerance (absolute; 0.005 by default) of the reference's
at every reference point from after_tokens on, the points picked as the held-out verdict picks
them (curves.align and curves.judge: the reference's points inside the run's range, a run that
covers only a prefix fails unless allow_prefix, a NaN logged by the run fails). Per-task
differences are reported, not judged: one task's accuracy moves by more than 0.005 with a handful
of instances. A task the reference lacks is UNKNOWN (named, left out of the macro); with no task in
common the downstream verdict is UNKNOWN.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from trainer.downstream.metric import METRIC_LABELS

from . import curves as curves_lib
from .curves import Curves

DEFAULT_TOLERANCE = 0.005  # absolute, on each macro average (accuracy; BPB)
PREFIX = "eval/downstream/"
KEY_RE = re.compile(r"^eval/downstream/(?P<label>.+) \((?P<metric>[^()]+)\)$")
SUFFIX_OF = {text: suffix for suffix, text in METRIC_LABELS.items()}
# metric type → (kind of number it is, higher is better); the order decides a task's type
TYPES = {
    "len_norm": ("accuracy", True),
    "pmi_dc": ("accuracy", True),
    "acc": ("accuracy", True),
    "f1": ("accuracy", True),
    "bpb": ("BPB", False),
    "ce_loss": ("CE loss", False),
}
SAME_V1 = ("acc", "len_norm", "pmi_dc")  # ICLMetric: v1 == v2


def is_key(key: str) -> bool:
    """An OLMo-core downstream key with a metric label ICLMetric logs."""
    m = KEY_RE.match(key)
    return m is not None and m["metric"] in SUFFIX_OF


def key(label: str, suffix: str) -> str:
    return f"{PREFIX}{label} ({METRIC_LABELS[suffix]})"


CLEAN = " clean"  # trainer.downstream.metric.CLEAN_SUFFIX: a task's metrics on its clean subset


def clean_view(c: Curves) -> Curves:
    """The curves with each task's clean-subset values (its keys with " clean" appended, which
    `is_key` does not match, so a plain verdict ignores them) in place of its full ones; a side
    that logged none is returned as it is."""
    clean = {k[: -len(CLEAN)]: v for k, v in c.values.items() if k.endswith(CLEAN) and is_key(k[: -len(CLEAN)])}
    if not clean:
        return c
    values = {k: v for k, v in c.values.items() if k not in clean and not k.endswith(CLEAN)}
    return dataclasses.replace(c, values={**values, **clean})


def tasks_of(keys) -> dict[str, set[str]]:
    """{label: ICLMetric suffixes logged} of the downstream keys among `keys`, first-seen order."""
    out: dict[str, set[str]] = {}
    for k in keys:
        m = KEY_RE.match(k)
        if m and m["metric"] in SUFFIX_OF:
            out.setdefault(m["label"], set()).add(SUFFIX_OF[m["metric"]])
    return out


def metric_type(suffixes: set[str]) -> str | None:
    """The task's ICLMetric type from the suffixes it logged (None: no headline among them)."""
    for t in TYPES:
        if t in ("bpb", "ce_loss"):
            continue
        if f"{t}_v1" in suffixes or f"{t}_v2" in suffixes:
            return t
    plain = {s.rsplit("_v", 1)[0] for s in suffixes}
    for t in ("bpb", "ce_loss"):
        if plain == {t}:
            return t
    return None


@dataclasses.dataclass(frozen=True)
class Headline:
    label: str
    metric_type: str
    kind: str
    higher_is_better: bool
    key: str  # the run's key

    def candidates(self) -> list[str]:
        """Keys that carry this number on the reference's side, preferred first."""
        out = [self.key]
        if self.metric_type in SAME_V1:
            out.append(key(self.label, f"{self.metric_type}_v1"))
        return out


def headlines(curves: Curves) -> dict[str, Headline]:
    """{label: its headline} of each task the side logged a value of."""
    logged = [k for k, v in curves.values.items() if is_key(k) and (np.isfinite(v).any() or k in curves.nonfinite)]
    out = {}
    for label, suffixes in tasks_of(logged).items():
        t = metric_type(suffixes)
        if t is None:
            continue
        kind, higher = TYPES[t]
        suffix = f"{t}_v2" if f"{t}_v2" in suffixes or t not in SAME_V1 else f"{t}_v1"
        out[label] = Headline(label, t, kind, higher, key(label, suffix))
    return out


def wanted_keys(curves: Curves) -> list[str]:
    """The reference keys a table is searched for: every candidate of the run's headlines."""
    return [k for h in headlines(curves).values() for k in h.candidates()]


def _ref_key(h: Headline, ref: Curves) -> str | None:
    for k in h.candidates():
        v = ref.values.get(k)
        if v is not None and np.isfinite(v).any():
            return k
    return None


def _macro(curves: Curves, keys: list[str]) -> np.ndarray:
    """The plain mean of `keys` at each row that logged all of them (NaN elsewhere)."""
    return np.stack([curves.values[k] for k in keys]).mean(axis=0)


def _with(curves: Curves, extra: dict[str, np.ndarray]) -> Curves:
    return dataclasses.replace(curves, values={**curves.values, **extra})


def _task_row(h: Headline, ref_key: str | None, a: curves_lib.Aligned | None) -> dict[str, Any]:
    row = {
        "key": h.key,
        "reference_key": ref_key,
        "metric_type": h.metric_type,
        "kind": h.kind,
        "higher_is_better": h.higher_is_better,
    }
    if a is None:
        return {**row, "status": "UNKNOWN", "why": "not in the reference", "points": 0}
    if not len(a.tokens):
        return {**row, "status": "UNKNOWN", "why": "no common evaluation step", "points": 0}
    d = a.diff
    final = {
        "tokens": float(a.tokens[-1]),
        "reference_step": int(a.ref_steps[-1]),
        "run": float(a.run[-1]),
        "reference": float(a.ref[-1]),
        "diff": float(d[-1]),
    }
    return {
        **row,
        "status": "compared",
        "points": len(a.tokens),
        "final": final,
        "max_abs_diff": float(np.abs(d).max()),
        "aligned": {"tokens": a.tokens, "reference_step": a.ref_steps, "run": a.run, "reference": a.ref},
    }


def macro_key(kind: str) -> str:
    return f"{PREFIX}macro ({kind})"


def verdict(
    run: Curves,
    ref: Curves,
    tolerance: float = DEFAULT_TOLERANCE,
    after_tokens: float = 0.0,
    allow_prefix: bool = False,
) -> tuple[dict[str, Any] | None, Curves, Curves]:
    """→ (compare.json's "downstream", the run's and the reference's curves with the macro averages
    added under `macro_key(kind)`); None when the run logged no downstream metric."""
    heads = headlines(run)
    if not heads:
        return None, run, ref
    tasks: dict[str, Any] = {}
    groups: dict[str, Any] = {}
    for label, h in heads.items():
        rk = _ref_key(h, ref)
        a = None
        if rk is not None:
            a = curves_lib.align(run, _with(ref, {h.key: ref.values[rk]}), h.key)
            if len(a.tokens):
                groups.setdefault(h.kind, []).append((label, h.key, rk))
        tasks[label] = _task_row(h, rk, a)
    macros, run_extra, ref_extra = {}, {}, {}
    for kind, pairs in groups.items():
        mk = macro_key(kind)
        run_extra[mk] = _macro(run, [k for _, k, _ in pairs])
        ref_extra[mk] = _macro(ref, [rk for _, _, rk in pairs])
    run, ref = _with(run, run_extra), _with(ref, ref_extra)
    for kind, pairs in groups.items():
        mk = macro_key(kind)
        a = curves_lib.align(run, ref, mk)
        what = f"downstream {kind} macro ({len(pairs)} task{'s' if len(pairs) > 1 else ''})"
        v = curves_lib.judge(
            a,
            None,
            tolerance,
            after_tokens,
            allow_prefix,
            curves_lib.first_nonfinite(run, [k for _, k, _ in pairs]),
            what=what,
            unit="",
        )
        macros[kind] = {
            **v.to_json(),
            "key": mk,
            "tasks": [x for x, _, _ in pairs],
            "higher_is_better": kind == "accuracy",
        }
    missing = [x for x, t in tasks.items() if t["status"] == "UNKNOWN"]
    passed: bool | None
    if any(m["passed"] is False for m in macros.values()):
        passed = False
    elif not macros or any(m["passed"] is None for m in macros.values()):
        passed = None
    else:
        passed = True
    parts = [m["summary"] for m in macros.values()] or [
        f"no downstream task in common with the reference (the run logged {len(tasks)}: {', '.join(tasks)})"
    ]
    if missing and macros:
        parts.append("UNKNOWN (not compared): " + ", ".join(f"{x} ({tasks[x]['why']})" for x in missing))
    return (
        {
            "passed": passed,
            "summary": "; ".join(parts),
            "tolerance": tolerance,
            "macros": macros,
            "tasks": tasks,
            "not_compared": missing,
        },
        run,
        ref,
    )


def task_text(t: dict[str, Any]) -> str:
    """One task's line: its last compared point, or why it is UNKNOWN."""
    if t["status"] != "compared":
        return f"UNKNOWN ({t['why']})"
    f = t["final"]
    better = "higher" if t["higher_is_better"] else "lower"
    return (
        f"run {f['run']:.4f} vs reference {f['reference']:.4f} (diff {f['diff']:+.4f}, {better} is better) at "
        f"reference step {f['reference_step']}; max |diff| {t['max_abs_diff']:.4f} over {t['points']} points"
    )
