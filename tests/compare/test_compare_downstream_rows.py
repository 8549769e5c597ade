"""The downstream verdict row by row (pure functions, no run directory): a reference value that is
NaN or spelled with the other version's key at some evaluations is read per row and per task, never
by dropping the evaluation for every task; each task is judged besides the macro; a reference that
holds too few of the run's tasks, or rows judged on fewer tasks, is UNKNOWN; an accuracy outside
[0, 1] is refused."""

from __future__ import annotations

import math

import pytest

from compare import downstream
from compare.curves import Verdict, make_curves
from contract.errors import Refused
from trainer.downstream import metric

A, B, C, D = "arc_easy_test_mc_5shot_fast", "arc_challenge_test_mc_5shot_fast", "basic_skills_coding_rc_5shot", "x_rc"
STEPS = (10, 20, 30)


def k(label: str, version: str = "v2") -> str:
    return metric.metric_key(label, f"acc_{version}" if version == "v2" else "acc_v1")


def rows(values: dict[str, dict[int, float]], versions: dict[tuple[str, int], str] | None = None) -> list[dict]:
    """{label: {step: accuracy}} → metrics rows, each task under its v2 key unless `versions` says v1."""
    versions = versions or {}
    out = []
    for s in STEPS:
        r: dict = {"step": s}
        for label, by_step in values.items():
            if s in by_step:
                r[k(label, versions.get((label, s), "v2"))] = by_step[s]
        out.append(r)
    return out


def curves(name, values, versions=None):
    return make_curves(name, rows(values, versions), 1.0, 0)


def same(*labels, v=0.5):
    return {x: dict.fromkeys(STEPS, v) for x in labels}


def judge(run_values, ref_values, versions=None, **kw):
    ds, _, _ = downstream.verdict(curves("run", run_values), curves("reference", ref_values, versions), **kw)
    return ds


def test_a_nan_in_one_reference_task_keeps_the_evaluation_for_the_others():
    """Task A NaN at the reference's step 20, task B 0.5 off there: the row is judged on B (FAIL at
    step 20), not dropped for both (a PASS at 'all 2 of 2 points' before)."""
    ref = same(A, B)
    ref[A][20], ref[B][20] = math.nan, 0.0
    ds = judge(same(A, B), ref)
    acc = ds["macros"]["accuracy"]
    assert ds["passed"] is False and acc["passed"] is False
    assert acc["first_failure"]["reference_step"] == 20 and acc["first_failure"]["diff"] == pytest.approx(0.5)
    assert acc["coverage"]["compared"] == 3 and acc["coverage"]["partial"] == 1
    assert acc["partial_points"] == [{"reference_step": 20, "missing": [A]}]


def test_a_row_judged_on_fewer_tasks_is_unknown_never_pass():
    ref = same(A, B)
    ref[A][20] = math.inf
    ds = judge(same(A, B), ref)
    acc = ds["macros"]["accuracy"]
    assert acc["passed"] is None and ds["passed"] is None
    assert "partial" in acc["summary"] and "step 20" in acc["summary"] and A in acc["summary"]
    assert acc["coverage"]["compared"] == 3  # the row still judged on B


def test_a_reference_that_switches_from_v1_to_v2_keys_midway_is_read_whole():
    """OLMo-core upgraded mid-run: A logged as v1 at step 10, v2 after; B off by 0.4 at step 10.
    Before, A's v2 column was picked and step 10 dropped for every task (PASS on 2 points)."""
    ref = same(A, B)
    ref[B][10] = 0.1
    ds = judge(same(A, B), ref, versions={(A, 10): "v1"})
    acc = ds["macros"]["accuracy"]
    assert ds["passed"] is False and acc["first_failure"]["reference_step"] == 10
    assert acc["coverage"] == {"compared": 3, "reference": 3, "share": 1.0, "partial": 0, "empty": 0}
    assert ds["tasks"][A]["points"] == 3


def test_tasks_that_cancel_in_the_macro_each_fail_their_own_bound():
    """+0.3 and −0.3: the macro is unchanged, each task is far past tolerance × 2 tasks."""
    run = same(A, B)
    run[A] = dict.fromkeys(STEPS, 0.8)
    run[B] = dict.fromkeys(STEPS, 0.2)
    ds = judge(run, same(A, B))
    acc = ds["macros"]["accuracy"]
    assert acc["max_abs_heldout_diff"] == pytest.approx(0.0, abs=1e-12)  # the macro alone would pass
    assert ds["passed"] is False and acc["passed"] is False
    assert acc["task_tolerance"] == pytest.approx(2 * downstream.DEFAULT_TOLERANCE)
    assert [f["task"] for f in acc["tasks_failing"]] == [A, B]
    # the bound is the difference at which one task alone moves the macro past the tolerance
    assert downstream.task_bound(0.005, 13) == pytest.approx(0.065)
    run[A], run[B] = dict.fromkeys(STEPS, 0.509), dict.fromkeys(STEPS, 0.491)  # 0.009 < 0.01: within
    assert judge(run, same(A, B))["passed"] is True
    assert judge(run, same(A, B), task_tolerance=0.008)["passed"] is False


def test_a_reference_holding_too_few_of_the_runs_tasks_is_unknown():
    """1 of 4 tasks compared (a reference with 1 of OLMo 3's 26 would PASS before): UNKNOWN."""
    ds = judge(same(A, B, C, D), same(A))
    assert ds["passed"] is None and ds["macros"]["accuracy"]["passed"] is True
    assert "only 1 of the run's 4 downstream tasks compared" in ds["summary"]
    assert judge(same(A, B, C, D), same(A, B))["passed"] is True  # half: the default share
    assert judge(same(A, B, C, D), same(A, B), min_share=0.75)["passed"] is None


@pytest.mark.parametrize("side", ["run", "reference"])
@pytest.mark.parametrize("value", [1.5, -0.1, 55.0])
def test_an_accuracy_outside_0_1_is_refused(side, value):
    bad = same(A, B)
    bad[B][20] = value
    run, ref = (bad, same(A, B)) if side == "run" else (same(A, B), bad)
    with pytest.raises(Refused, match=rf"{side}: .*{B}.* at step 20 is not an accuracy"):
        judge(run, ref)


def test_a_kinds_ruling_fails_on_a_task_outside_its_bound_and_is_never_pass_when_rows_were_partial():
    """downstream._macro_ruling, the step that turns a macro's verdict into its kind's: a task outside
    ±bound fails a macro that passes (named, with the count); rows judged on part of the tasks make
    a PASS UNKNOWN and are added to a FAIL's summary; a clean pass stays PASS."""
    passing = Verdict(True, "macro within ±0.005", 0.005, 0.0, 3, 0.001, None, None)
    failing = Verdict(False, "macro leaves ±0.005", 0.005, 0.0, 3, 0.02, None, None)
    fails = [("arc_easy", {"diff": -0.2, "reference_step": 20}), ("mmlu", {"diff": 0.1, "reference_step": 30})]

    assert downstream._macro_ruling(passing, [], 0.01, "") == (True, "macro within ±0.005")
    passed, summary = downstream._macro_ruling(passing, fails, 0.01, "")
    assert passed is False
    assert summary.startswith("2 task(s) leave ±0.01 of the reference although the macro does not (first: arc_easy")
    assert "diff -0.2000 at reference step 20" in summary and summary.endswith("macro within ±0.005")
    passed, summary = downstream._macro_ruling(passing, [], 0.01, "1 of 3 rows lacked a task")
    assert passed is None and summary == "UNKNOWN: partial: 1 of 3 rows lacked a task (macro within ±0.005)"
    passed, summary = downstream._macro_ruling(failing, [], 0.01, "1 of 3 rows lacked a task")
    assert passed is False and summary == "macro leaves ±0.005; partial: 1 of 3 rows lacked a task"
