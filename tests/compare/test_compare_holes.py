"""compare's one rule for a logged point without a finite value (compare/holes.py, issue 55 finding 1):
every quantity a verdict reads — training loss, the pooled and per-set held-out losses and their
tokens, each downstream task (its clean subset with --downstream_clean) — goes through
`holes.check`. A NaN, +Infinity or −Infinity the run logged fails it; one the reference logged, or a
value left out of an evaluation either side logged, counts in the denominator and makes the verdict
UNKNOWN, naming the metric and the step. Runs' metrics.jsonl written by hand, as the trainer writes
them (see test_compare)."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest

from compare import cli, curves, downstream, holes, sides
from contract.rundir import RunDir
from tests.audit import audit_fixtures as fx
from tests.compare.test_compare import EVAL_EVERY, SEQ_LEN, STEPS, run_compare, write_run
from tests.compare.test_compare_downstream import task_values
from tests.compare.test_compare_sets import SETS, olmo_core_table, set_rows

AT = 2 * EVAL_EVERY - 1  # the planted step: the second evaluation
TASKS = {"arc_challenge_test_mc_5shot_fast": "acc", "hellaswag_bpb_5shot": "bpb"}
VALUES = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
# Read by no verdict: drawn only. Every other key the reader loads must go through the rule.
DRAWN_ONLY = ("grad_norm", "lr")


def full_rows() -> list[dict]:
    """Every kind of quantity compare reads: each name in curves.METRICS on every row, three held-out
    sets with their tokens and the pooled tokens, two downstream tasks (every value ICLMetric logs)
    and each of their clean-subset twins (downstream.clean_from's keys)."""
    rows = set_rows()
    for r in rows:
        for m in curves.METRICS:  # a metric added to METRICS is planted too
            if m != "heldout_loss":
                r.setdefault(m, 1.0)
        if "heldout_loss" in r:
            r[curves.POOLED_TOKENS] = 4500.0
            for label, t in TASKS.items():
                values = task_values(label, t, r["step"])
                r.update(values)
                r.update({k + downstream.CLEAN: v - 0.01 for k, v in values.items()})
    return rows


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return fx.write_sample(str(tmp_path_factory.mktemp("data")), seq_len=SEQ_LEN)


@pytest.fixture(scope="module")
def base(manifest, tmp_path_factory):
    return write_run(str(tmp_path_factory.mktemp("base")), manifest, rows=full_rows())


def side(base: str, folder: Path, rows: list[dict]) -> str:
    """A run directory with `rows` as its metrics.jsonl (run.json of `base`; no data log: the data
    comparison says it cannot compare, which no verdict reads)."""
    folder.mkdir(parents=True)
    shutil.copy(Path(base) / "run.json", folder / "run.json")
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(folder)


def verdicts(base: str, folder: Path, run_rows: list[dict], ref_rows: list[dict], clean: bool) -> dict:
    """compare.json's content for the two sides (the figures are not drawn: verdicts only)."""
    run, ref = side(base, folder / "run", run_rows), side(base, folder / "ref", ref_rows)
    cfg = cli.CompareConfig(RunDir.resolved(run), ref, str(folder / "out"), downstream_clean=clean)
    return cli.judge(cfg).result


def summaries(result: dict) -> list[str]:
    ds = result["downstream"] or {}
    return [
        result["verdict"]["summary"],
        *(v["summary"] for v in result["sets"].values()),
        ds.get("summary", ""),
        *(m["summary"] for m in ds.get("macros", {}).values()),
    ]


def read_keys(keys: list[str], base: str, where: str) -> set[str]:
    """The keys a verdict reads on `where`'s side: all but the drawn-only ones and a downstream task's
    values other than its headline (the run) or the headline's spellings (the reference: v2, else v1),
    by the code's own definition of a headline (downstream.headlines)."""
    heads = downstream.headlines(sides.load_run(RunDir.resolved(base), "side").curves)
    headline = {k for h in heads.values() for k in (h.candidates() if where == "reference" else [h.key])}
    plain = {k for k in keys if not downstream.is_key(k.removesuffix(downstream.CLEAN)) and k not in DRAWN_ONLY}
    return plain | {k for k in keys if k.removesuffix(downstream.CLEAN) in headline}


def test_a_reference_heldout_set_of_infinity_or_nan_is_unknown_not_dropped(manifest, tmp_path):
    """The reproduction: the reference logged 8 evaluations, one set's loss Infinity at one. Before,
    that point was dropped and the run PASSed 'at all 7 of the reference's 7 points (100%)', exit 0."""
    run = write_run(str(tmp_path / "run"), manifest, rows=set_rows())
    for name, value in VALUES.items():
        rows = set_rows()
        rows[AT]["heldout/dolma_books-validation/loss"] = value
        ref = write_run(str(tmp_path / f"ref{name}"), manifest, rows=rows)
        code, result = run_compare(run, ref, tmp_path / f"o{name}")
        v, dolma = result["verdict"], result["sets"]["dolma_books-validation"]
        assert code == 2 and v["passed"] is None and dolma["passed"] is None
        assert dolma["coverage"]["reference"] == STEPS // EVAL_EVERY == dolma["coverage"]["compared"] + 1
        said = f"the reference logged heldout/dolma_books-validation/loss = {name} at step {AT}"
        assert said in v["summary"] and said in dolma["summary"] and "UNKNOWN" in v["summary"]
        assert dolma["holes"] == [
            {
                "side": "reference",
                "metric": "heldout/dolma_books-validation/loss",
                "step": AT,
                "tokens": (AT + 1) * SEQ_LEN * 8,
                "value": name,
            }
        ]


def test_every_quantity_a_verdict_reads_goes_through_the_rule_on_both_sides(base, tmp_path):
    """Every key the reader loads from a run that logs every kind of quantity, each side, each of
    NaN, +Infinity and −Infinity planted at one evaluation: the run's makes the verdict FAIL, the
    reference's UNKNOWN, each naming the metric and the step; a key no verdict reads leaves it PASS.
    A quantity added later that a verdict reads without the rule fails here (its planted NaN passes
    or is not named)."""
    rows = full_rows()
    loaded = sides.load_run(RunDir.resolved(base), "run").curves
    keys = sorted({*loaded.values, *loaded.nonfinite})
    assert set(curves.METRICS) <= set(keys) and any(k.endswith(downstream.CLEAN) for k in keys)
    read = {where: read_keys(keys, base, where) for where in ("run", "reference")}
    assert {"loss", "heldout_loss", curves.POOLED_TOKENS} <= read["run"] < read["reference"]
    wrong = []
    for i, key in enumerate(keys):
        clean = key.endswith(downstream.CLEAN)
        for where in ("run", "reference"):
            for name, value in VALUES.items():
                planted = [dict(r) for r in rows]
                planted[AT][key] = value
                run_rows, ref_rows = (planted, rows) if where == "run" else (rows, planted)
                result = verdicts(base, tmp_path / f"{i}-{where}-{name}", run_rows, ref_rows, clean)
                passed = result["verdict"]["passed"]
                said = f"the {where} logged {key} = {name} at step {AT}"
                if key not in read[where]:
                    ok = passed is True
                elif where == "run":
                    ok = passed is False and any(said in s for s in summaries(result))
                else:
                    ok = passed is None and any(said in s for s in summaries(result))
                if not ok:
                    wrong.append(f"{key} = {name} in the {where}: {passed}, {summaries(result)[0][:160]}")
    assert wrong == []


@pytest.mark.parametrize("where", ["run", "reference"])
def test_a_value_left_out_of_a_logged_evaluation_is_unknown_naming_it(base, tmp_path, where):
    """A held-out set's loss, its tokens or a downstream task's value missing from one evaluation
    row that logged the others: counted and UNKNOWN (before: interpolated across or dropped)."""
    rows = full_rows()
    c = sides.load_run(RunDir.resolved(base), "run").curves
    heads = downstream.headlines(c)
    quantities = [curves.set_key("c4_en-validation"), curves.set_key("c4_en-validation", "tokens"), "heldout_loss"]
    quantities += [tuple(h.candidates()) if where == "reference" else (h.key,) for h in heads.values()]
    for i, q in enumerate(quantities):
        keys = (q,) if isinstance(q, str) else q
        planted = [dict(r) for r in rows]
        for k in keys:
            planted[AT].pop(k, None)
        run_rows, ref_rows = (planted, rows) if where == "run" else (rows, planted)
        result = verdicts(base, tmp_path / str(i), run_rows, ref_rows, False)
        said = f"the {where} logged no {keys[0]} at step {AT}"
        assert result["verdict"]["passed"] is None, (q, summaries(result))
        assert any(said in s for s in summaries(result)), (q, summaries(result))


def test_a_compared_point_outside_the_tolerance_still_fails_beside_a_hole(manifest, tmp_path):
    """A reference NaN makes a verdict that would pass UNKNOWN; it does not hide a real failure."""
    run = write_run(str(tmp_path / "run"), manifest, rows=set_rows())
    rows = set_rows()
    rows[AT]["heldout/c4_en-validation/loss"] = math.nan
    for r in rows[AT + 1 :]:
        if "heldout/wikitext_103-validation/loss" in r:
            r["heldout/wikitext_103-validation/loss"] += 0.5
    ref = write_run(str(tmp_path / "ref"), manifest, rows=rows)
    code, result = run_compare(run, ref, tmp_path / "o")
    assert code == 1 and result["sets"]["wikitext_103-validation"]["passed"] is False
    assert result["sets"]["c4_en-validation"]["passed"] is None


def test_the_rule_alone():
    """holes.check on two hand-made sides: the run's non-finite fails, the reference's and a missing
    value are unjudged, a row logging nothing of the group is no evaluation, after_tokens applies to
    the reference's."""
    rows = [
        {"step": 0, "loss": 3.0},
        {"step": 1, "loss": 2.0, "heldout/a/loss": 2.5, "heldout/b/loss": 2.6},
        {"step": 2, "loss": 1.0, "heldout/a/loss": math.inf},  # b missing at an evaluation
    ]
    c = curves.make_curves("reference", rows, 1.0, 1)
    gate = holes.check(c, c, ["heldout/a/loss", "heldout/b/loss", "loss"], None)
    assert gate.fail == holes.Hole("run", "heldout/a/loss", 2, 3.0, math.inf)
    assert [(h.side, h.metric, h.step, holes.value_text(h.value)) for h in gate.unjudged] == [
        ("reference", "heldout/a/loss", 2, "Infinity"),
        ("reference", "heldout/b/loss", 2, "missing"),
        ("run", "heldout/b/loss", 2, "missing"),
    ]
    assert holes.check(c, c, ["loss"]) == holes.Gate()  # step 0 logs no evaluation: no hole
    late = holes.check(dataclasses.replace(c, nonfinite={}), c, ["heldout/a/loss"], None, after_tokens=3.5)
    assert late == holes.Gate()


@pytest.mark.parametrize(
    "cell, said", [("nan", "NaN"), ("NaN", "NaN"), ("inf", "Infinity"), ("-Infinity", "-Infinity")]
)
def test_a_reference_tables_written_out_nan_is_a_logged_value_not_an_empty_cell(manifest, tmp_path, cell, said):
    """An OLMo-core export with every set's cell of one evaluation written as NaN (or ±Infinity):
    before, 'nan' read as an empty cell, the row was no evaluation and the run PASSed on the other 7.
    An empty cell still means "not logged" (test_compare_sets)."""
    run = write_run(str(tmp_path / "run"), manifest, rows=set_rows())
    path = tmp_path / "ref.csv"
    olmo_core_table(path, set_rows())
    lines = path.read_text().splitlines()
    lines[AT + 1] = ",".join(lines[AT + 1].split(",")[:2] + [cell] * len(SETS))  # line 1 is the header
    path.write_text("\n".join(lines) + "\n")
    code, result = run_compare(run, path, tmp_path / "o")
    assert code == 2 and result["verdict"]["passed"] is None
    for label in SETS:
        assert (
            f"the reference logged heldout/{label}/loss = {said} at step {AT + 1}" in result["sets"][label]["summary"]
        )
