"""compare's downstream verdict: per-task differences and a macro average per kind of number
(accuracy; BPB) against another olmax run or an export of AI2's W&B history (CSV, JSON), OLMo-core's
keys, ±0.005 macro by default, UNKNOWN where the reference lacks a task. Runs written as the trainer
writes them (see test_compare)."""

from __future__ import annotations

import csv
import html
import json
import math
import shutil

import numpy as np
import pytest

from compare import cli, downstream, judging
from compare.curves import make_curves
from tests.audit import audit_fixtures as fx
from tests.compare.test_compare import EVAL_EVERY, SEQ_LEN, STEPS, metrics_rows, run_compare, write_run
from trainer.downstream import metric

# one task of each kind the OLMo 3 set holds: ARC mc (acc), MMLU mc (len_norm), basic skills rc (acc), a bpb task
TASKS = {
    "arc_challenge_test_mc_5shot_fast": "acc",
    "mmlu_stem_test_mc_5shot_fast": "len_norm",
    "basic_skills_arithmetic_rc_5shot": "acc",
    "hellaswag_bpb_5shot": "bpb",
}
ACC_TASKS = [x for x, t in TASKS.items() if t != "bpb"]


def suffixes(metric_type: str) -> list[str]:
    """The suffixes ICLMetric computes for a task of this type (the ported compute, on 2 docs)."""
    n = 4
    e = metric.Entries(
        doc_id=np.array([0, 0, 1, 1]),
        cont_id=np.array([0, 1, 0, 1]),
        label_id=np.zeros(n, int),
        loglik=np.array([-1.0, -2.0, -3.0, -1.5]),
        cont_str_len=np.full(n, 3),
        cont_byte_len=np.full(n, 3),
        cont_str_len_no_leading_space=np.full(n, 2),
        cont_byte_len_no_leading_space=np.full(n, 2),
    )
    return list(metric.compute(metric_type, e))


def task_values(label: str, metric_type: str, s: int) -> dict[str, float]:
    """Every value a task logs at step s, keyed as OLMo-core keys them; the headline rises (or, BPB, falls)."""
    base = 0.25 + 0.01 * (s + 1) / EVAL_EVERY + 0.01 * len(label) % 7 * 0.01
    out = {}
    for k in suffixes(metric_type):
        v = base if k.startswith(metric_type) else 1.0 + 0.1 * len(k) - 0.002 * s
        out[metric.metric_key(label, k)] = v if metric_type != "bpb" else 1.2 - 0.003 * s + 0.01 * (k == "bpb_v1")
    return out


def ds_rows(steps: int = STEPS, tasks=TASKS) -> list[dict]:
    """metrics_rows with the tasks logged at each evaluation (keys as trainer.downstream logs them)."""
    rows = metrics_rows(steps)
    for r in rows:
        if "heldout_loss" in r:
            for label, t in tasks.items():
                r.update(task_values(label, t, r["step"]))
    return rows


def wandb_csv(path, rows, *, shift: dict[str, float] | None = None, drop=(), keys=None, step_col="_step") -> None:
    """AI2's W&B history as `run.history().to_csv()` writes it: _step (updates done) and one
    column per key, empty where a row does not log it; `shift` adds to a key, `drop` leaves tasks out."""
    shift = shift or {}
    keys = keys or [
        k
        for k in dict.fromkeys(k for r in rows for k in r)
        if downstream.is_key(k) and not any(k.startswith(f"eval/downstream/{x} (") for x in drop)
    ]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([step_col, "train/CE loss", "eval/lm/heldout/CE loss", *keys])
        for r in rows:
            w.writerow(
                [
                    r["step"] + 1,
                    r["loss"],
                    r.get("heldout_loss", ""),
                    *(r[k] + shift.get(k, 0.0) if k in r else "" for k in keys),
                ]
            )


def headline_key(label: str) -> str:
    t = TASKS[label]
    return metric.metric_key(label, f"{t}_v2")


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return fx.write_sample(str(tmp_path_factory.mktemp("data")), seq_len=SEQ_LEN)


@pytest.fixture(scope="module")
def ds_run(manifest, tmp_path_factory):
    return write_run(str(tmp_path_factory.mktemp("run")), manifest, rows=ds_rows())


def test_the_headline_is_the_tasks_own_metric_in_its_v2_key_as_ai2_reads_it():
    """From the keys ICLMetric's values are logged under: ARC mc accuracy, MMLU mc length-normalized
    accuracy, rc accuracy, BPB v2 (lower is better) for a bpb task."""
    for label, t in TASKS.items():
        values = {k: np.array([0.5]) for k in task_values(label, t, 0)}
        [h] = downstream.headlines(make_curves("r", [{"step": 0, **{k: 0.5 for k in values}}], 1.0, 1)).values()
        assert (h.label, h.metric_type, h.key) == (label, t, headline_key(label))
        assert h.higher_is_better is (t != "bpb") and h.kind == ("BPB" if t == "bpb" else "accuracy")
    assert downstream.key("x", "bpb_v2") == "eval/downstream/x (BPB v2)"
    assert downstream.key("x", "len_norm_v2") == "eval/downstream/x (length-normalized accuracy v2)"


def test_headlines_follow_olmo_evals_own_metric_types_for_the_26_olmo3_tasks():
    """Each OLMo 3 in-loop task's metric type as olmo_eval defines it → the documented headline."""
    tasks = pytest.importorskip("olmo_eval.tasks")
    from contract.downstream import OLMO3_FAST_TASKS

    documented = {"acc": "accuracy v2", "len_norm": "length-normalized accuracy v2", "bpb": "BPB v2"}
    for label in OLMO3_FAST_TASKS:
        entry = tasks.LABEL_TO_TASK_MAP[label]
        cls, kwargs = entry if isinstance(entry, tuple) else (entry, {})
        t = kwargs.get("metric_type") or cls.metric_type
        row = {"step": 0, **{metric.metric_key(label, k): 0.5 for k in suffixes(t)}}
        [h] = downstream.headlines(make_curves("r", [row], 1.0, 1)).values()
        assert h.key == f"eval/downstream/{label} ({documented[t]})"
        assert ("mmlu" in label and "_mc_" in label) == (t == "len_norm")
        assert ("_bpb_" in label) == (t == "bpb")


def test_a_run_compared_with_itself_passes_with_zero_difference(ds_run, tmp_path):
    twin = shutil.copytree(ds_run, tmp_path / "twin")
    code, result = run_compare(ds_run, twin, tmp_path / "out")
    ds = result["downstream"]
    assert code == 0 and ds["passed"] is True and set(ds["macros"]) == {"accuracy", "BPB"}
    assert all(m["passed"] and m["max_abs_heldout_diff"] == 0.0 for m in ds["macros"].values())
    assert ds["macros"]["accuracy"]["compared_points"] == STEPS // EVAL_EVERY
    assert all(t["status"] == "compared" and t["max_abs_diff"] == 0.0 for t in ds["tasks"].values())
    page = (tmp_path / "out" / "compare.html").read_text()
    assert (
        'Downstream accuracy macro <span class="badge PASS">PASS</span>' in page
        and "basic_skills_arithmetic_rc_5shot" in page
    )


def test_a_wandb_csv_export_within_the_tolerance_passes_and_beyond_it_fails(ds_run, tmp_path):
    """AI2's W&B history as CSV (OLMo-core's keys, _step = updates done): exact → PASS; one task
    0.016 higher moves the accuracy macro (3 tasks) by 0.0053 > 0.005 → FAIL (exit 1) naming the first
    step, the task's delta shown; the same shift passes with --downstream_tolerance 0.006."""
    rows = ds_rows()
    same, shifted = tmp_path / "same.csv", tmp_path / "shifted.csv"
    wandb_csv(same, rows)
    key = headline_key("arc_challenge_test_mc_5shot_fast")
    wandb_csv(shifted, rows, shift={key: 0.016})
    code, result = run_compare(ds_run, same, tmp_path / "o1")
    assert code == 0 and result["downstream"]["passed"] is True
    assert result["downstream"]["tasks"]["hellaswag_bpb_5shot"]["reference_key"] == headline_key("hellaswag_bpb_5shot")
    code, result = run_compare(ds_run, shifted, tmp_path / "o2")
    ds = result["downstream"]
    assert code == 1 and result["verdict"]["passed"] is False and ds["passed"] is False
    acc = ds["macros"]["accuracy"]
    assert (
        acc["first_failure"]["diff"] == pytest.approx(-0.016 / 3)
        and acc["first_failure"]["reference_step"] == EVAL_EVERY
    )
    assert ds["macros"]["BPB"]["passed"] is True
    assert ds["tasks"]["arc_challenge_test_mc_5shot_fast"]["final"]["diff"] == pytest.approx(-0.016)
    assert ds["tasks"]["mmlu_stem_test_mc_5shot_fast"]["final"]["diff"] == 0.0
    assert result["verdict"]["overall_passed"] is True  # the held-out verdict itself still passes
    code, result = run_compare(ds_run, shifted, tmp_path / "o3", "--downstream_tolerance", "0.006")
    assert code == 0 and result["downstream"]["tolerance"] == 0.006


def test_a_task_the_reference_lacks_is_unknown_and_none_in_common_is_exit_2(ds_run, tmp_path):
    rows = ds_rows()
    part, none_ = tmp_path / "part.csv", tmp_path / "none.csv"
    wandb_csv(part, rows, drop=["mmlu_stem_test_mc_5shot_fast"])
    code, result = run_compare(ds_run, part, tmp_path / "o1")
    ds = result["downstream"]
    assert code == 0 and ds["not_compared"] == ["mmlu_stem_test_mc_5shot_fast"]
    assert ds["tasks"]["mmlu_stem_test_mc_5shot_fast"]["status"] == "UNKNOWN"
    assert ds["macros"]["accuracy"]["tasks"] == ["arc_challenge_test_mc_5shot_fast", "basic_skills_arithmetic_rc_5shot"]
    assert "mmlu_stem_test_mc_5shot_fast (not in the reference)" in ds["summary"]
    wandb_csv(none_, rows, drop=list(TASKS))
    code, result = run_compare(ds_run, none_, tmp_path / "o2")
    assert code == 2 and result["downstream"]["passed"] is None and result["verdict"]["overall_passed"] is True
    assert "no downstream task in common" in result["downstream"]["summary"]


def test_a_reference_that_logged_only_the_v1_accuracy_key_is_read_through_it(ds_run, tmp_path):
    """acc/len_norm v1 and v2 are one number in ICLMetric: an export holding only '(accuracy)'."""
    rows = ds_rows()
    keys = [k for k in dict.fromkeys(k for r in rows for k in r) if downstream.is_key(k) and " v2)" not in k]
    path = tmp_path / "v1.csv"
    wandb_csv(path, rows, keys=keys)
    code, result = run_compare(ds_run, path, tmp_path / "o")
    tasks = result["downstream"]["tasks"]
    assert tasks["arc_challenge_test_mc_5shot_fast"]["reference_key"].endswith("(accuracy)")
    assert tasks["hellaswag_bpb_5shot"]["status"] == "UNKNOWN"  # BPB v1 is another number: not a stand-in
    assert code == 0 and result["downstream"]["macros"]["accuracy"]["passed"] is True


@pytest.mark.parametrize("shape", ["records", "history", "split", "columns", "panel_csv"])
def test_wandb_history_json_shapes_and_a_panel_csv_export_are_read(ds_run, tmp_path, shape):
    rows = ds_rows()
    keys = [k for k in dict.fromkeys(k for r in rows for k in r) if downstream.is_key(k)]
    table = [
        {
            "_step": r["step"] + 1,
            "_timestamp": 1.7e9 + r["step"],
            "train/CE loss": r["loss"],
            **{k: r[k] for k in keys if k in r},
        }
        for r in rows
    ]
    if shape == "panel_csv":  # a W&B panel's "Export CSV": Step, '<run> - <key>' and its __MIN/__MAX
        path = tmp_path / "panel.csv"
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            cols = [c for k in ["train/CE loss", *keys] for c in (f"OLMo-3-7B - {k}", f"OLMo-3-7B - {k}__MIN")]
            w.writerow(["Step", *cols])
            for r in table:
                w.writerow([r["_step"], *(r.get(c.split(" - ", 1)[1].removesuffix("__MIN"), "") for c in cols)])
    else:
        doc = {
            "records": table,
            "history": {"history": table},
            "split": {"columns": list(table[-1]), "data": [[r.get(c) for c in table[-1]] for r in table]},
            "columns": {c: {str(i): r.get(c) for i, r in enumerate(table)} for c in table[-1]},
        }[shape]
        path = tmp_path / "history.json"
        path.write_text(json.dumps(doc))
    code, result = run_compare(ds_run, path, tmp_path / "o", "--columns", "loss=*train/CE loss")
    ds = result["downstream"]
    assert (
        code == 2 and ds["passed"] is True
    )  # 2: the table holds no held-out loss to judge and all(t["status"] == "compared" for t in ds["tasks"].values())
    assert ds["macros"]["accuracy"]["compared_points"] == STEPS // EVAL_EVERY


def test_a_run_that_logged_a_nan_accuracy_fails(manifest, tmp_path):
    rows = ds_rows()
    rows[2 * EVAL_EVERY - 1][headline_key("arc_challenge_test_mc_5shot_fast")] = math.nan
    run = write_run(str(tmp_path / "run"), manifest, rows=rows)
    ref = tmp_path / "ref.csv"
    wandb_csv(ref, ds_rows())
    code, result = run_compare(run, ref, tmp_path / "o")
    acc = result["downstream"]["macros"]["accuracy"]
    assert code == 1 and acc["passed"] is False and acc["nonfinite"]["step"] == 2 * EVAL_EVERY - 1


def test_without_downstream_rows_nothing_changes(manifest, tmp_path):
    """A run that logged no downstream metric: no downstream section, the held-out verdict alone."""
    run = write_run(str(tmp_path / "run"), manifest, rows=metrics_rows())
    ref = tmp_path / "ref.csv"
    wandb_csv(ref, ds_rows())
    code, result = run_compare(run, ref, tmp_path / "o", "--columns", "heldout_loss=eval/lm/heldout/CE loss")
    assert code == 0 and result["downstream"] is None and result["verdict"]["passed"] is True
    assert "Downstream" not in (tmp_path / "o" / "compare.html").read_text()


@pytest.mark.parametrize("value", ["-0.1", "nan", "x"])
def test_a_bad_downstream_tolerance_is_refused(ds_run, tmp_path, value, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([ds_run, ds_run, "--out", str(tmp_path / "o"), "--downstream_tolerance", value])
    assert e.value.code == 2 and "--downstream_tolerance" in capsys.readouterr().err


def test_with_downstream_folds_the_verdicts():
    w = judging.with_downstream
    assert [w(True, True), w(True, False), w(None, False), w(True, None), w(None, True), w(False, None)] == [
        True,
        False,
        False,
        None,
        None,
        False,
    ]


def test_a_run_covering_part_of_the_references_evaluations_fails_unless_allow_prefix(manifest, tmp_path):
    """The points are picked as for held-out loss: a run stopped at half the reference's steps."""
    run = write_run(str(tmp_path / "run"), manifest, rows=ds_rows()[: STEPS // 2])
    ref = tmp_path / "ref.csv"
    wandb_csv(ref, ds_rows())
    code, result = run_compare(run, ref, tmp_path / "o1")
    acc = result["downstream"]["macros"]["accuracy"]
    assert code == 1 and acc["passed"] is False and "covers only" in acc["summary"]
    assert acc["coverage"] == {
        "compared": STEPS // 2 // EVAL_EVERY,
        "reference": STEPS // EVAL_EVERY,
        "share": 0.5,
        "partial": 0,
        "empty": 0,
    }
    code, result = run_compare(run, ref, tmp_path / "o2", "--allow_prefix")
    assert code == 0 and result["downstream"]["passed"] is True


def test_a_nan_in_one_reference_task_no_longer_hides_another_tasks_difference(ds_run, tmp_path):
    """AI2's export with arc NaN at one evaluation and mmlu 0.5 off there: before, that evaluation
    was dropped for every task and the verdict said PASS at every remaining point."""
    rows = ds_rows()
    at = 2 * EVAL_EVERY - 1  # the second evaluation
    for suffix in ("acc_v2", "acc_v1"):  # neither spelling finite there (v1 would stand in for v2)
        rows[at][metric.metric_key("arc_challenge_test_mc_5shot_fast", suffix)] = math.nan
    rows[at][headline_key("mmlu_stem_test_mc_5shot_fast")] += 0.5
    ref = tmp_path / "ref.csv"
    wandb_csv(ref, rows)
    code, result = run_compare(ds_run, ref, tmp_path / "o")
    acc = result["downstream"]["macros"]["accuracy"]
    assert code == 1 and acc["passed"] is False and acc["first_failure"]["reference_step"] == at + 1
    assert acc["partial_points"] == [{"reference_step": at + 1, "missing": ["arc_challenge_test_mc_5shot_fast"]}]


def test_a_reference_that_switched_to_v2_keys_midway_is_read_at_every_evaluation(ds_run, tmp_path):
    """An OLMo-core upgrade mid-run: the accuracy tasks logged under v1 names first, v2 after. Every
    evaluation is compared (before: only those after the switch, 'at all N of N points')."""
    rows = ds_rows()
    evals = [r for r in rows if "heldout_loss" in r]
    for r in evals[: len(evals) // 2]:
        for label in ACC_TASKS:
            r[metric.metric_key(label, f"{TASKS[label]}_v1")] = r.pop(headline_key(label))
    keys = list(dict.fromkeys(k for r in rows for k in r if downstream.is_key(k)))
    ref = tmp_path / "ref.csv"
    wandb_csv(ref, rows, keys=keys)
    code, result = run_compare(ds_run, ref, tmp_path / "o")
    acc = result["downstream"]["macros"]["accuracy"]
    assert code == 0 and acc["passed"] is True and acc["compared_points"] == len(evals)
    assert acc["coverage"]["reference"] == len(evals) and acc["coverage"]["partial"] == 0


def with_clean(rows: list[dict], shift: float = 0.0) -> list[dict]:
    """`rows` with each downstream value's clean-subset twin (downstream.clean_from's keys), `shift` apart."""
    out = []
    for r in rows:
        r = dict(r)
        r.update({k + downstream.CLEAN: v + shift for k, v in r.items() if downstream.is_key(k)})
        out.append(r)
    return out


def test_downstream_clean_without_clean_keys_on_either_side_is_unknown_saying_why(ds_run, tmp_path):
    """Before: the full metrics were judged in their place and PASSed without a word (exit 0)."""
    ref = tmp_path / "ref.csv"
    wandb_csv(ref, ds_rows())
    code, result = run_compare(ds_run, ref, tmp_path / "o", "--downstream_clean")
    ds = result["downstream"]
    assert ds["passed"] is None and ds["clean"] == {"run": False, "reference": False, "note": ds["clean"]["note"]}
    assert "neither the run nor the reference logged clean-subset metrics" in ds["summary"]
    assert all(m["passed"] is None for m in ds["macros"].values())
    assert code == 2 and result["verdict"]["passed"] is None


def test_downstream_clean_on_one_side_says_which_side_has_them_and_judges_them(manifest, tmp_path):
    """The run logged its clean subsets (0.1 below its full values), the reference (AI2's export)
    none: the run's clean subsets are judged against the reference's full metrics — a FAIL here —
    and the summary and the page say which side is which. Without the flag the clean keys are ignored.
    Before, the clean keys were never read at all (the full ones were judged: PASS)."""
    run = write_run(str(tmp_path / "run"), manifest, rows=with_clean(ds_rows(), -0.1))
    ref = tmp_path / "ref.csv"
    wandb_csv(ref, ds_rows())
    assert run_compare(run, ref, tmp_path / "plain")[1]["downstream"]["passed"] is True
    code, result = run_compare(run, ref, tmp_path / "o", "--downstream_clean")
    ds = result["downstream"]
    said = "the run's clean-subset metrics (keys ending ' clean') against the reference's full metrics"
    assert ds["clean"]["run"] is True and ds["clean"]["reference"] is False
    assert said in ds["summary"] and said in result["verdict"]["summary"]
    assert ds["passed"] is False and code == 1
    page = html.unescape((tmp_path / "o" / "compare.html").read_text())
    assert said in page and "run: logged; reference: none" in page
    # the reference's clean subsets, the run's none: the other way round
    ref_run = write_run(str(tmp_path / "ref_run"), manifest, rows=with_clean(ds_rows()))
    plain_run = write_run(str(tmp_path / "plain_run"), manifest, rows=ds_rows())
    code, result = run_compare(plain_run, ref_run, tmp_path / "o2", "--downstream_clean")
    assert result["downstream"]["clean"]["run"] is False and result["downstream"]["clean"]["reference"] is True
    assert "the reference's clean-subset metrics" in result["downstream"]["summary"] and code == 0
