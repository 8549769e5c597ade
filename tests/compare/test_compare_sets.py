"""compare per held-out set (issue 24) and its hardening (issue 25): a verdict per set and
overall, non-finite run values, thresholds refused at parsing, a prefix of the reference, malformed
metrics rows, --out and atomic reports. Runs written as the trainer writes them (see test_compare)."""

from __future__ import annotations

import csv
import json
import math
import shutil

import pytest

from compare import cli, report
from contract.errors import INTERRUPTED_EXIT
from tests.audit import audit_fixtures as fx
from tests.compare.test_compare import EVAL_EVERY, SEQ_LEN, STEPS, metrics_rows, run_compare, write_run

SETS = {"c4_en-validation": 3000.0, "dolma_books-validation": 1000.0, "wikitext_103-validation": 500.0}


def set_rows(steps: int = STEPS) -> list[dict]:
    """metrics_rows with the three sets logged at each evaluation, as trainer.heldout_eval logs them."""
    rows = metrics_rows(steps)
    for r in rows:
        if "heldout_loss" in r:
            for i, (label, tokens) in enumerate(SETS.items()):
                r[f"heldout/{label}/loss"] = r["heldout_loss"] + 0.3 * i
                r[f"heldout/{label}/tokens"] = tokens
            r["heldout_loss"] = sum(r[f"heldout/{x}/loss"] * t for x, t in SETS.items()) / sum(SETS.values())
    return rows


def olmo_core_table(path, rows, shift: dict[str, float] | None = None) -> None:
    """An OLMo-core W&B export of `rows`: its metric names, _step counting updates done; `shift`
    adds to a set's curve."""
    shift = shift or {}
    cols = ["_step", "train/CE loss", *(f"eval/lm/{x}/CE loss" for x in SETS)]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            w.writerow(
                [
                    r["step"] + 1,
                    r["loss"],
                    *(r[f"heldout/{x}/loss"] + shift.get(x, 0.0) if f"heldout/{x}/loss" in r else "" for x in SETS),
                ]
            )


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return fx.write_sample(str(tmp_path_factory.mktemp("data")), seq_len=SEQ_LEN)


@pytest.fixture(scope="module")
def set_run(manifest, tmp_path_factory):
    return write_run(str(tmp_path_factory.mktemp("run")), manifest, rows=set_rows())


def test_each_set_gets_its_verdict_and_only_the_set_a_perturbed_reference_shifts_fails(set_run, tmp_path):
    """An OLMo-core W&B export with one set shifted by 3× the tolerance: that set FAILs, the others
    PASS, and so does the run as a whole (exit 1); the overall weighs the sets by the run's tokens."""
    same, shifted = tmp_path / "same.csv", tmp_path / "shifted.csv"
    rows = set_rows()
    olmo_core_table(same, rows)
    olmo_core_table(shifted, rows, {"wikitext_103-validation": 3 * cli.DEFAULT_TOLERANCE})
    code, result = run_compare(set_run, same, tmp_path / "o1")
    assert code == 0 and set(result["sets"]) == set(SETS)
    assert all(v["passed"] is True and v["max_abs_heldout_diff"] < 1e-12 for v in result["sets"].values())
    assert result["verdict"]["compared_points"] == STEPS // EVAL_EVERY
    code, result = run_compare(set_run, shifted, tmp_path / "o2")
    assert code == 1 and result["verdict"]["passed"] is False
    assert {x: v["passed"] for x, v in result["sets"].items()} == {
        "c4_en-validation": True,
        "dolma_books-validation": True,
        "wikitext_103-validation": False,
    }
    assert result["sets"]["wikitext_103-validation"]["first_failure"]["diff"] == pytest.approx(
        -3 * cli.DEFAULT_TOLERANCE
    )
    share = SETS["wikitext_103-validation"] / sum(SETS.values())  # the overall moves by the set's token share
    assert result["aligned"]["heldout_loss"]["max_abs_diff"] == pytest.approx(3 * cli.DEFAULT_TOLERANCE * share)
    assert (
        result["verdict"]["overall_passed"] is True
        and "sets failing: wikitext_103-validation" in result["verdict"]["summary"]
    )
    page = (tmp_path / "o2" / "compare.html").read_text()
    for x in SETS:  # a plot of each set, and its verdict in the header
        assert f"Held-out set {x}" in page and f"set {x}" in page
    # an olmax reference run logging the same sets: per-set verdicts too, zero difference
    twin = shutil.copytree(set_run, tmp_path / "twin")
    code, result = run_compare(set_run, twin, tmp_path / "o3")
    assert code == 0 and all(v["max_abs_heldout_diff"] == 0.0 for v in result["sets"].values())


def test_a_set_missing_from_the_reference_is_named_and_a_per_set_column_can_be_mapped(set_run, tmp_path):
    path = tmp_path / "renamed.csv"
    rows = set_rows()
    olmo_core_table(path, rows)
    text = path.read_text().replace("eval/lm/c4_en-validation/CE loss", "eval/lm/c4_en/CE loss")
    path.write_text(text)
    code, result = run_compare(set_run, path, tmp_path / "o1")
    assert code == 0 and result["sets_not_compared"] == ["c4_en-validation"]
    assert "not in the reference (not compared): c4_en-validation" in result["verdict"]["summary"]
    code, result = run_compare(
        set_run, path, tmp_path / "o2", "--columns", 'heldout/c4_en-validation="eval/lm/c4_en/CE loss"'
    )
    assert code == 0 and set(result["sets"]) == set(SETS) and result["sets_not_compared"] == []


@pytest.mark.parametrize(
    "metric, value", [("heldout_loss", math.nan), ("heldout/dolma_books-validation/loss", math.inf), ("loss", math.nan)]
)
def test_a_non_finite_value_in_the_run_fails_naming_its_step(manifest, set_run, tmp_path, metric, value):
    """A diverged run is never passed: its NaN/Infinity is not dropped and interpolated across."""
    rows = set_rows()
    bad_step = 2 * EVAL_EVERY - 1  # an evaluation step
    rows[bad_step][metric] = value
    run = write_run(str(tmp_path / "run"), manifest, rows=rows)
    code, result = run_compare(run, set_run, tmp_path / "out")
    assert code == 1 and result["verdict"]["passed"] is False
    assert f"at step {bad_step}" in result["verdict"]["summary"] or any(
        f"at step {bad_step}" in v["summary"] for v in result["sets"].values()
    )
    found = result["verdict"]["nonfinite"] or next(v["nonfinite"] for v in result["sets"].values() if v["nonfinite"])
    assert found["step"] == bad_step and found["metric"] == metric


def test_an_empty_reference_cell_means_not_logged(set_run, tmp_path):
    path = tmp_path / "gaps.csv"
    olmo_core_table(path, set_rows())
    lines = path.read_text().splitlines()
    lines[EVAL_EVERY] = ",".join(lines[EVAL_EVERY].split(",")[:2] + [""] * len(SETS))  # one evaluation not logged
    path.write_text("\n".join(lines) + "\n")
    code, result = run_compare(set_run, path, tmp_path / "out")
    assert code == 0 and result["verdict"]["compared_points"] == STEPS // EVAL_EVERY - 1


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--tolerance", "nan"),
        ("--tolerance", "inf"),
        ("--tolerance", "-0.01"),
        ("--after_tokens", "nan"),
        ("--after_tokens", "-1"),
        ("--tokens_per_step", "0"),
        ("--tokens_per_step", "nan"),
        ("--run_tokens_per_step", "-inf"),
        ("--smooth", "0"),
        ("--step_offset", "-1"),
        ("--set_column", "eval/lm/CE loss"),
    ],
)
def test_non_finite_or_out_of_range_thresholds_are_refused_at_parsing(set_run, tmp_path, capsys, flag, value):
    with pytest.raises(SystemExit) as e:
        cli.main([set_run, set_run, "--out", str(tmp_path / "out"), flag, value])
    assert e.value.code == 2 and flag in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before any work


def test_a_run_covering_only_a_prefix_of_the_reference_fails_unless_a_prefix_is_allowed(manifest, set_run, tmp_path):
    short = write_run(str(tmp_path / "short"), manifest, rows=set_rows(STEPS // 2))
    code, result = run_compare(short, set_run, tmp_path / "o1")
    assert code == 1
    n = STEPS // EVAL_EVERY
    assert result["verdict"]["coverage"] == {"compared": n // 2, "reference": n, "share": 0.5}
    assert "covers only 4 of the reference's 8 held-out loss points (50%)" in result["verdict"]["summary"]
    assert all(v["passed"] is False for v in result["sets"].values())
    code, result = run_compare(short, set_run, tmp_path / "o2", "--allow_prefix")
    assert code == 0 and result["verdict"]["coverage"]["share"] == 0.5
    assert "50%" in result["verdict"]["summary"]


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"loss": 3.0}', "no step"),
        ("[1, 2, 3]", "a metrics row must be a JSON object, not list"),
        ('{"step": 1.7, "loss": 3.0}', "step 1.7 is not an integer"),
        ('{"step": true, "loss": 3.0}', "step True is not an integer"),
        ('{"step": 3, "loss": "low"}', "loss is 'low', not a number"),
        ('{"step": 3, "heldout/c4_en-validation/loss": [1]}', "heldout/c4_en-validation/loss is [1], not a number"),
    ],
)
def test_a_malformed_metrics_row_is_exit_2_naming_file_and_line(manifest, set_run, tmp_path, capsys, line, message):
    run = write_run(str(tmp_path / "run"), manifest, rows=set_rows())
    with open(f"{run}/metrics.jsonl") as f:
        lines = f.read().splitlines()
    lines[2] = line
    with open(f"{run}/metrics.jsonl", "w") as f:
        f.write("\n".join(lines) + "\n")
    code, result = run_compare(run, set_run, tmp_path / "out")
    err = capsys.readouterr().err
    assert code == 2 and result is None and f"metrics.jsonl:3: {message}" in err and "Traceback" not in err


def test_an_out_that_is_a_file_or_not_writable_is_refused_before_the_work(set_run, tmp_path, capsys):
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    for out in (a_file, a_file / "below"):
        code = cli.main([set_run, set_run, "--out", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and str(a_file) in err and "Traceback" not in err
    assert a_file.read_text() == "x"


def test_an_interrupted_report_write_leaves_the_previous_report_whole(set_run, tmp_path, monkeypatch):
    out = tmp_path / "out"
    assert run_compare(set_run, set_run, out)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def broken(*a, **k):
        raise KeyboardInterrupt  # interrupted while the page is made

    monkeypatch.setattr(report, "render", broken)
    # a Ctrl-C in any command: one line, exit 130 (contract.errors.run_main), nothing half-written
    assert cli.main([set_run, set_run, "--out", str(out), "--tolerance", "0.5"]) == INTERRUPTED_EXIT
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # both files whole, no temporaries
    json.loads(before["compare.json"])
