"""compare judges held-out losses only where both sides measured the same thing: the same
sets (a pooled loss only of the same pool), the same evaluation settings, the same tokens counted.
Anything else is UNKNOWN (exit 2) naming the difference; the training-loss gap is still reported."""

from __future__ import annotations

import pytest

from tests.compare import test_compare
from tests.compare.test_compare import run_compare, write_run
from tests.compare.test_compare_sets import SETS, set_rows

manifest = test_compare.manifest  # the fixture, shared (a name bound here, so pytest finds it)

WHOLE = {"instances": "packed", "batches": None, "global_batch_size": 8}


def with_settings(rows: list[dict], settings: dict | None, shift: float = 0.0, tokens: float = 1.0) -> list[dict]:
    """Evaluation rows that record `settings` (none when None), set losses + `shift`, set tokens × `tokens`."""
    for r in rows:
        if "heldout_loss" not in r:
            continue
        if settings is not None:
            r["eval_settings"] = dict(settings)
        for x in SETS:
            r[f"heldout/{x}/loss"] += shift
            r[f"heldout/{x}/tokens"] *= tokens
        r["heldout_loss"] += shift
    return rows


def renamed(rows: list[dict], names: dict[str, str]) -> list[dict]:
    """`rows` with each set's keys under its new name."""

    def key(k: str) -> str:
        for a, b in names.items():
            if k.startswith(f"heldout/{a}/"):
                return k.replace(f"heldout/{a}/", f"heldout/{b}/")
        return k

    return [{key(k): v for k, v in r.items()} for r in rows]


def test_no_heldout_set_in_common_is_unknown_naming_both_sides_sets(manifest, tmp_path):
    """Same pooled heldout_loss, different sets: never a PASS on the pool of different sets."""
    run = write_run(str(tmp_path / "run"), manifest, rows=set_rows())
    other = {x: f"other-{i}" for i, x in enumerate(SETS)}
    ref = write_run(str(tmp_path / "ref"), manifest, rows=renamed(set_rows(), other))
    code, result = run_compare(run, ref, tmp_path / "out")
    v = result["verdict"]
    assert code == 2 and v["passed"] is None and result["sets"] == {}
    assert (
        f"no held-out set in common: the run evaluated {list(SETS)}, the reference {list(other.values())}"
        in v["summary"]
    )
    assert v["train_loss_gap"]["max"] == 0.0  # the training comparison stands


def test_a_pooled_loss_is_not_compared_with_a_side_that_logged_its_sets(manifest, tmp_path):
    run = write_run(str(tmp_path / "run"), manifest, rows=set_rows())
    pooled = [{k: v for k, v in r.items() if not k.startswith("heldout/")} for r in set_rows()]
    ref = write_run(str(tmp_path / "ref"), manifest, rows=pooled)
    for a, b, side in ((run, ref, "reference"), (ref, run, "run")):
        code, result = run_compare(a, b, tmp_path / f"out-{side}")
        assert code == 2 and result["verdict"]["passed"] is None
        assert f"the {side} logged no per-set held-out losses" in result["verdict"]["summary"]
    code, result = run_compare(ref, ref, tmp_path / "pooled")  # both pooled alike: compared
    assert code == 0 and result["verdict"]["passed"] is True


@pytest.mark.parametrize(
    "ref_settings, names",
    [
        (
            {**WHOLE, "batches": 2},
            "examples read per set (eval_batches × global_batch_size): run all, reference 2 × 8 = 16",
        ),
        ({**WHOLE, "instances": "padded"}, "eval.instances: run 'packed', reference 'padded'"),
    ],
)
def test_other_evaluation_settings_make_the_heldout_verdict_unknown_naming_them(
    manifest, tmp_path, ref_settings, names
):
    """Identical training, another evaluation: the held-out losses differ by 0.05 nats, which is
    not the model's doing; the verdict says why instead of FAIL."""
    run = write_run(str(tmp_path / "run"), manifest, rows=with_settings(set_rows(), WHOLE))
    ref = write_run(str(tmp_path / "ref"), manifest, rows=with_settings(set_rows(), ref_settings, 0.05, 0.5))
    code, result = run_compare(run, ref, tmp_path / "out")
    v = result["verdict"]
    assert code == 2 and v["passed"] is None and names in v["summary"]
    assert all(s["passed"] is None and names in s["summary"] for s in result["sets"].values())
    assert v["train_loss_gap"]["max"] == 0.0 and "training loss (smoothed)" in v["summary"]
    assert result["evaluation"]["run_settings"] == [WHOLE] and result["evaluation"]["reference_settings"] == [
        ref_settings
    ]
    # the same settings on a whole set read the same examples whatever the batch: compared
    same = write_run(
        str(tmp_path / "same"), manifest, rows=with_settings(set_rows(), {**WHOLE, "global_batch_size": 4})
    )
    assert run_compare(run, same, tmp_path / "same-out")[0] == 0


def test_sets_that_counted_other_tokens_are_not_compared_even_without_recorded_settings(manifest, tmp_path):
    run = write_run(str(tmp_path / "run"), manifest, rows=set_rows())
    ref = write_run(str(tmp_path / "ref"), manifest, rows=with_settings(set_rows(), None, 0.05, 0.5))
    code, result = run_compare(run, ref, tmp_path / "out")
    assert code == 2 and result["verdict"]["passed"] is None
    assert (
        "set c4_en-validation: the run counted 3,000 target tokens, the reference 1,500" in result["verdict"]["summary"]
    )
    books = result["sets"]["dolma_books-validation"]
    assert books["passed"] is None and "the run counted 1,000 target tokens, the reference 500" in books["summary"]
    assert "c4_en-validation" not in books["summary"]  # each set names its own difference


def test_a_side_without_recorded_settings_is_compared_and_the_report_says_they_were_not_checked(manifest, tmp_path):
    run = write_run(str(tmp_path / "run"), manifest, rows=with_settings(set_rows(), WHOLE))
    old = write_run(str(tmp_path / "old"), manifest, rows=set_rows())  # a run from before settings were recorded
    code, result = run_compare(run, old, tmp_path / "out")
    assert code == 0 and result["verdict"]["passed"] is True
    assert (
        "the reference's evaluation settings are not recorded (a run from before they were): not checked"
        in result["verdict"]["summary"]
    )


def test_a_run_whose_evaluation_changed_mid_run_passes_against_itself_and_not_against_another(manifest, tmp_path):
    """eval_batches may change at a resume: a run compared with itself measured the same evaluation
    at every point (PASS); another run that switched at another step did not (UNKNOWN, naming it)."""

    def switched(at: int, rows=None) -> list[dict]:
        rows = with_settings(rows or set_rows(), WHOLE)
        for r in rows:
            if "eval_settings" in r and r["step"] >= at:
                r["eval_settings"] = {**WHOLE, "batches": 2}
        return rows

    run = write_run(str(tmp_path / "run"), manifest, rows=switched(20))
    code, result = run_compare(run, run, tmp_path / "self")
    assert code == 0 and result["verdict"]["passed"] is True
    assert all(s["passed"] is True for s in result["sets"].values())
    other = write_run(str(tmp_path / "other"), manifest, rows=switched(30))
    code, result = run_compare(run, other, tmp_path / "other-out")
    assert code == 2 and result["verdict"]["passed"] is None
    assert "changed its evaluation settings mid-run" in result["verdict"]["summary"]


def test_a_diverged_run_fails_even_where_the_evaluations_cannot_be_compared(manifest, tmp_path):
    """A NaN training loss is the run's own fact, whatever the reference evaluated: FAIL (exit 1),
    never UNKNOWN; the evaluation difference is still named."""
    rows = with_settings(set_rows(), WHOLE)
    rows[7]["loss"] = float("nan")
    run = write_run(str(tmp_path / "run"), manifest, rows=rows)
    ref = write_run(str(tmp_path / "ref"), manifest, rows=with_settings(set_rows(), {**WHOLE, "batches": 2}))
    code, result = run_compare(run, ref, tmp_path / "out")
    v = result["verdict"]
    assert code == 1 and v["passed"] is False and v["nonfinite"]["step"] == 7
    assert "a diverged run fails" in v["summary"] and "examples read per set" in v["summary"]
