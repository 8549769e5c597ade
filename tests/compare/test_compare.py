"""`python -m compare`: alignment by tokens, the held-out verdict and its exit codes, the data
comparison from data logs and data_sha256 chains, the reference-table reader, and the HTML page.

Runs are written as the trainer writes them (metrics.jsonl, config.json, data_log/ via the
loader's pure functions, summary.json with the chain hash) so every test takes well under a second.
"""

from __future__ import annotations

import csv
import html
import html.parser
import json
import math
import os
import re
import shutil
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from compare import cli, curves, data, report, table
from dataloader.plan import plan_from_manifests
from tests.audit import audit_fixtures as fx
from trainer import data_contract as trainer_data

G, SEQ_LEN, STEPS, EVAL_EVERY = 8, 32, 40, 5
TOKENS_PER_STEP = G * SEQ_LEN


def heldout(s: int) -> float:
    return 4.0 + 3.0 * math.exp(-(s + 1) / 15)


def metrics_rows(steps: int = STEPS) -> list[dict]:
    rows = []
    for s in range(steps):
        r = {
            "step": s,
            "loss": 3.5 + 3.0 * math.exp(-(s + 1) / 12) + 0.05 * math.sin(s),
            "grad_norm": 1.0 + 0.5 * math.cos(s / 3),
            "lr": 1e-3 * min(1.0, (s + 1) / 10),
            "skipped": False,
        }
        if (s + 1) % EVAL_EVERY == 0:
            r["heldout_loss"] = heldout(s)
        rows.append(r)
    return rows


def write_run(run_dir: str, manifest: str, *, seed: int = 0, rows: list[dict] | None = None) -> str:
    """A run as the trainer leaves it: data logs of 2 hosts, summary.json, run.json, metrics.jsonl."""
    fx.write_run_logs(run_dir, manifest, hosts=2, steps=STEPS, global_batch_size=G, seed=seed)
    manifests = trainer_data.load_manifests([manifest])
    plan = plan_from_manifests([json.load(open(manifest))], "train")
    trainer_data.run_record(
        manifests=manifests,
        global_batch_size=G,
        seed=seed,
        weights=None,
        loader_fingerprint=plan.fingerprint,
        host_count=2,
        model={},
    ).write(run_dir)
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in (rows or metrics_rows()))
    return run_dir


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return fx.write_sample(str(tmp_path_factory.mktemp("data")), seq_len=SEQ_LEN)


@pytest.fixture(scope="module")
def run(manifest, tmp_path_factory):
    return write_run(str(tmp_path_factory.mktemp("run")), manifest)


def run_compare(run_dir, ref, out, *extra):
    code = cli.main([run_dir, str(ref), "--out", str(out), *map(str, extra)])
    result = json.load(open(out / "compare.json")) if (out / "compare.json").exists() else None
    return code, result


def test_identical_runs_pass_with_zero_difference(run, tmp_path):
    twin = shutil.copytree(run, tmp_path / "twin")
    code, result = run_compare(run, twin, tmp_path / "out")
    assert code == 0
    v = result["verdict"]
    assert v["passed"] is True and v["max_abs_heldout_diff"] == 0.0
    assert v["compared_points"] == STEPS // EVAL_EVERY
    assert v["train_loss_gap"]["max"] == 0.0 == v["train_loss_gap"]["min"]
    for m in ("heldout_loss", "loss", "loss_smoothed", "grad_norm", "lr"):  # every metric, aligned and differenced
        a = result["aligned"][m]
        assert a["max_abs_diff"] == 0.0 and a["diff"] == [0.0] * len(a["tokens"]) and a["run"] == a["reference"]
    assert len(result["aligned"]["grad_norm"]["tokens"]) == STEPS == len(result["aligned"]["lr"]["tokens"])
    d = result["data"]
    assert d["status"] == "identical" and d["steps_compared"] == STEPS and d["first_difference"] is None
    assert d["chains"]["run"]["matches_summary"] is True and d["chains"]["reference"]["matches_summary"] is True


def test_heldout_shifted_by_twice_the_tolerance_fails_naming_that_step(run, manifest, tmp_path):
    shift_from = 24  # an evaluation step: (24 + 1) % 5 == 0
    rows = metrics_rows()
    for r in rows:
        if "heldout_loss" in r and r["step"] >= shift_from:
            r["heldout_loss"] += 2 * cli.DEFAULT_TOLERANCE
    ref = write_run(str(tmp_path / "ref"), manifest, rows=rows)
    code, result = run_compare(run, ref, tmp_path / "out")
    assert code == 1
    first = result["verdict"]["first_failure"]
    assert first["reference_step"] == shift_from
    assert first["tokens"] == (shift_from + 1) * TOKENS_PER_STEP
    assert first["diff"] == pytest.approx(-2 * cli.DEFAULT_TOLERANCE)
    assert f"reference step {shift_from}" in result["verdict"]["summary"]
    assert result["data"]["status"] == "identical"  # same data, other numbers
    # Judged only from after the shift's first point on: still failing; judged before it only: passes.
    assert run_compare(run, ref, tmp_path / "o2", "--after_tokens", (shift_from + 1) * TOKENS_PER_STEP)[0] == 1
    assert run_compare(run, ref, tmp_path / "o3", "--tolerance", 0.03)[0] == 0


def test_the_judging_stage_returns_the_verdicts_that_compare_json_holds_and_draws_nothing(
    run, manifest, tmp_path, monkeypatch
):
    """cli.judge is the verdict alone: its value is what compare.json holds (less run_facts), it
    calls no drawing (figures raise here), and cli.draw makes the page's panels from that value."""
    rows = metrics_rows()
    for r in rows:
        if "heldout_loss" in r and r["step"] >= 24:
            r["heldout_loss"] += 2 * cli.DEFAULT_TOLERANCE
    ref = write_run(str(tmp_path / "ref"), manifest, rows=rows)
    code, written = run_compare(run, ref, tmp_path / "out")
    assert code == 1
    cfg = cli.parse_args([run, ref, "--out", str(tmp_path / "unused")])

    def no_drawing(*args, **kwargs):
        raise AssertionError("the judging stage drew a figure")

    with monkeypatch.context() as m:
        m.setattr(cli, "figures", no_drawing)
        judged = cli.judge(cfg)
    assert judged.passed is False and judged.overall.passed is False
    assert judged.overall.first_failure is not None and judged.overall.first_failure["reference_step"] == 24
    assert json.loads(json.dumps(judged.result, default=report._json_default)) == {
        k: v for k, v in written.items() if k != "run_facts"
    }
    assert not (tmp_path / "unused").exists()  # judging writes nothing
    panels = cli.draw(cfg, judged)
    assert [p.title for p in panels][:2] == ["Training loss", "Held-out loss (overall)"]
    assert panels[1].badge == "FAIL"


def test_grad_norm_lr_and_raw_train_loss_are_differenced_step_by_step(run, manifest, tmp_path):
    rows = metrics_rows()
    for r in rows:  # the reference: other grad norms everywhere, a higher LR from step 20, noisier loss
        r["grad_norm"] *= 1.5
        r["lr"] += 1e-4 if r["step"] >= 20 else 0.0
        r["loss"] += 0.01 * (-1) ** r["step"]
    ref = write_run(str(tmp_path / "ref"), manifest, rows=rows)
    _, result = run_compare(run, ref, tmp_path / "out")
    ours = metrics_rows()
    for m in ("grad_norm", "lr", "loss"):
        a = result["aligned"][m]
        assert a["reference_step"] == list(range(STEPS))
        assert a["tokens"] == [(s + 1) * TOKENS_PER_STEP for s in range(STEPS)]
        assert a["run"] == [r[m] for r in ours] and a["reference"] == [r[m] for r in rows]
        assert a["diff"] == pytest.approx([x[m] - y[m] for x, y in zip(ours, rows)], abs=1e-15)
    assert result["aligned"]["lr"]["diff"][:20] == [0.0] * 20
    assert result["aligned"]["lr"]["max_abs_diff"] == pytest.approx(1e-4)
    assert result["aligned"]["loss"]["max_abs_diff"] == pytest.approx(0.01)  # raw: the smoothed gap is smaller
    assert abs(result["aligned"]["loss_smoothed"]["diff"][-1]) < 0.002


def test_a_run_without_run_json_is_read_from_its_config(run, manifest, tmp_path):
    old = shutil.copytree(run, tmp_path / "old")
    os.remove(old / "run.json")
    with open(old / "config.json", "w") as f:  # what the trainer wrote before run.json existed
        json.dump(
            {"config": {"global_batch_size": G, "seed": 0, "data": [manifest], "seq_len": None}, "process_count": 2}, f
        )
    code, result = run_compare(str(old), run, tmp_path / "out")
    assert code == 0 and result["run"]["tokens_per_step"] == TOKENS_PER_STEP
    assert "from config.json" in result["run"]["described"] and "from run.json" in result["reference"]["described"]
    assert result["data"]["status"] == "identical"


def test_another_seed_is_reported_as_different_data_from_step_0(run, manifest, tmp_path):
    other = write_run(str(tmp_path / "seed1"), manifest, seed=1)
    code, result = run_compare(run, other, tmp_path / "out")
    assert code == 0  # identical metrics were written for both: the loss verdict says what the numbers say
    d = result["data"]
    assert d["status"] == "different" and d["first_difference"]["step"] == 0
    assert d["first_difference"]["kind"] in ("other examples", "other order")
    assert "first difference at step 0" in d["summary"]
    assert d["chains"]["run"]["recomputed"] != d["chains"]["reference"]["recomputed"]


def test_a_reordered_batch_mid_run_is_named_as_other_order(run, tmp_path):
    ref = shutil.copytree(run, tmp_path / "ref")
    log = os.path.join(ref, "data_log", "host-00001-of-00002.jsonl")
    lines = fx.read_log(log)
    lines[7]["example"] = lines[7]["example"][::-1]
    fx.write_log(log, lines)
    d = run_compare(run, ref, tmp_path / "out")[1]["data"]
    assert d["first_difference"]["step"] == 7 and d["first_difference"]["kind"] == "other order"
    assert d["differing_steps"] == 1
    assert d["chains"]["reference"]["matches_summary"] is False  # the log is not what was hashed


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"step": 40, "data_sha256": "ab', ":1: not valid JSON"),
        ('[40, "ab"]', "a run summary is a JSON object"),
        ('{"step": "40", "data_sha256": "ab"}', "step must be a non-negative integer"),
        ('{"step": 40, "data_sha256": null}', "data_sha256 must be a string"),
    ],
)
def test_a_damaged_summary_is_exit_2_naming_the_file(run, tmp_path, capsys, content, message):
    ref = shutil.copytree(run, tmp_path / "ref")
    (ref / "summary.json").write_text(content)
    code, result = run_compare(run, ref, tmp_path / "out")
    err = capsys.readouterr().err
    assert code == 2 and result is None
    assert f"{ref / 'summary.json'}" in err and message in err


@pytest.mark.parametrize(
    "line, message",
    [
        (b"\xff", "not UTF-8 text"),
        (b'{"step": "x", "index": [0], "example": [0]}', "step must be an int"),
        (b'{"step": 99, "index": [0], "example": [[0], 1]}', "example must be a list of ints"),
    ],
)
def test_a_malformed_data_log_line_is_named_and_the_summaries_decide(run, tmp_path, capsys, line, message):
    # unusable logs are not a crash: the data verdict names file:line and falls back to the
    # summaries' final stream hashes (here equal)
    ref = shutil.copytree(run, tmp_path / "ref")
    log = ref / "data_log" / "host-00001-of-00002.jsonl"
    n = len(log.read_bytes().splitlines())
    with open(log, "ab") as f:
        f.write(line + b"\n")
    code, result = run_compare(run, ref, tmp_path / "out")
    d = result["data"]
    assert code == 0 and d["status"] == "identical"
    assert f"data logs unusable ({log}:{n + 1}: " in d["summary"] and message in d["summary"]


def test_a_summary_of_other_steps_says_the_chain_check_was_not_run(run, tmp_path):
    ref = shutil.copytree(run, tmp_path / "ref")
    summary = json.load(open(ref / "summary.json"))
    summary["step"] = STEPS - 1  # e.g. a summary from before the last step was logged
    (ref / "summary.json").write_text(json.dumps(summary))
    code, result = run_compare(run, ref, tmp_path / "out")
    assert code == 0
    chains = result["data"]["chains"]
    assert chains["run"]["matches_summary"] is True and chains["run"]["not_run"] is None
    assert chains["reference"]["matches_summary"] is None
    assert chains["reference"]["not_run"] == (
        f"{ref / 'summary.json'}'s data_sha256 covers {STEPS - 1} steps, the data log holds {STEPS}"
    )
    said = f"the reference's chain check not run: {chains['reference']['not_run']}"
    assert said in result["data"]["summary"]
    assert html.escape(said) in (tmp_path / "out" / "compare.html").read_text()


def test_a_run_without_a_summary_says_the_chain_check_was_not_run(run, tmp_path):
    ref = shutil.copytree(run, tmp_path / "ref")
    os.remove(ref / "summary.json")
    d = run_compare(run, ref, tmp_path / "out")[1]["data"]
    assert d["status"] == "identical" and d["chains"]["reference"]["matches_summary"] is None
    why = f"{ref / 'summary.json'} is missing (the run has not finished)"
    assert d["chains"]["reference"]["not_run"] == why
    assert f"the reference's chain check not run: {why}" in d["summary"]


def test_a_run_read_from_its_config_refuses_a_tampered_manifest(run, manifest, tmp_path, capsys):
    raw = json.load(open(manifest))
    raw["seq_len"] = 2 * SEQ_LEN  # content changed, fingerprint field left as it was
    tampered = tmp_path / "manifest.json"
    tampered.write_text(json.dumps(raw))
    old = shutil.copytree(run, tmp_path / "old")
    os.remove(old / "run.json")
    with open(old / "config.json", "w") as f:
        json.dump({"config": {"global_batch_size": G, "seed": 0, "data": [str(tampered)], "seq_len": None}}, f)
    code, result = run_compare(str(old), run, tmp_path / "out")
    err = capsys.readouterr().err
    assert code == 2 and result is None
    assert str(tampered) in err and "does not match the manifest's content" in err


def test_batch_differences_are_classified():
    a = np.array([1, 2, 3, 4])
    assert data.describe_difference(a, a.copy()) == {}
    assert data.describe_difference(a, a[::-1])["kind"] == "other order"
    d = data.describe_difference(np.array([1, 2, 2, 4]), a)
    assert d["kind"] == "other examples" and d["extra"] == [2] and d["missing"] == [3]
    assert d["repeated_in_run"] == 1 and "more than once" in d["text"]
    d = data.describe_difference(a[:3], a)
    assert d["kind"] == "extra or missing rows" and d["missing"] == [4] and d["extra_rows"] == 0


def test_runs_with_different_batch_sizes_align_by_tokens():
    # The same held-out curve as a function of tokens, logged every 4 steps of T tokens by the
    # run and every step of 4T tokens by the reference: the points coincide, the difference is zero.
    f = lambda t: 5.0 - t / 1e5
    run_rows = [{"step": s, "loss": f((s + 1) * 100), "heldout_loss": f((s + 1) * 100)} for s in range(40)]
    ref_rows = [{"step": n, "loss": f(n * 400), "heldout_loss": f(n * 400)} for n in range(1, 11)]
    run_c = curves.make_curves("run", run_rows, 100, 1)
    ref_c = curves.make_curves("ref", ref_rows, 400, 0)
    a = curves.align(run_c, ref_c, "heldout_loss")
    assert a.tokens.tolist() == [n * 400.0 for n in range(1, 11)]
    assert np.abs(a.diff).max() < 1e-12
    # Reference points between the run's: linear interpolation of the run's neighbours.
    half = curves.make_curves("ref", [{"step": 0, "heldout_loss": 0.0}], 150, 1)
    assert curves.align(run_c, half, "heldout_loss").run.tolist() == [pytest.approx(f(150))]


def test_csv_reference_with_a_column_mapping(run, tmp_path):
    # An OLMo-core run exported from W&B: its metric names, _step counting updates done.
    path = tmp_path / "olmo_core.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "_step",
                "train/CE loss",
                "eval/lm/c4_en-validation/CE loss",
                "optim/total grad norm",
                "optim/LR (group 0)",
                "_runtime",
            ]
        )
        for r in metrics_rows():
            w.writerow([r["step"] + 1, r["loss"], r.get("heldout_loss", ""), r["grad_norm"], r["lr"], 1.0])
    code, result = run_compare(run, path, tmp_path / "out", "--tokens_per_step", TOKENS_PER_STEP)
    assert code == 0 and result["verdict"]["max_abs_heldout_diff"] < 1e-12
    assert result["data"] is None  # not an olmax run: no data comparison
    assert "eval/lm/c4_en-validation/CE loss" in result["reference"]["described"]
    # Without --tokens_per_step (and no tokens column) the run's tokens per step are assumed, and said.
    code, result = run_compare(run, path, tmp_path / "out2")
    assert code == 0 and result["reference"]["tokens_per_step"] == TOKENS_PER_STEP
    assert "the run's (assumed" in result["reference"]["described"]


def test_jsonl_reference_with_explicit_columns_and_a_tokens_column(run, tmp_path):
    path = tmp_path / "ref.jsonl"
    with open(path, "w") as f:
        for r in metrics_rows():
            row = {"it": r["step"], "seen": (r["step"] + 1) * TOKENS_PER_STEP, "ce": r["loss"]}
            if "heldout_loss" in r:
                row["val ce"] = r["heldout_loss"] + (0.5 if r["step"] >= 30 else 0.0)
            f.write(json.dumps(row) + "\n")
    code, result = run_compare(
        run, path, tmp_path / "out", "--columns", 'step=it,tokens=seen,loss=ce,heldout_loss="val ce"'
    )
    assert code == 1 and result["verdict"]["first_failure"]["reference_step"] == 34
    assert table.parse_columns('step=it,heldout_loss="val, ce"') == {"step": "it", "heldout_loss": "val, ce"}


@pytest.mark.parametrize(
    "content, suffix, columns, message",
    [
        ("_step,train/CE loss\n1,2.5\n2,oops\n", ".csv", None, ":3: loss is 'oops', not a number"),
        ("_step,train/CE loss\n1,2.5,7\n", ".csv", None, ":2: 3 fields, the header has 2"),
        ('{"_step": 1, "train/CE loss": 2.5}\n{"_step": 2, "train/CE\n', ".jsonl", None, ":2: not JSON"),
        ("_step,train/CE loss\n1,2.5\n", ".csv", "heldout_loss=val", "no column 'val' for heldout_loss"),
        ("_step,eval/lm/a/CE loss,eval/lm/b/CE loss\n1,2,3\n", ".csv", None, "matches 2 columns"),
        ("iteration,loss\n1,2\n", ".csv", None, "no column '_step' for step"),
        ("_step,train/CE loss\n1.5,2\n", ".csv", None, "not a non-negative integer"),
        ("", ".csv", None, "empty CSV"),
        ("_step,train/CE loss\n1,2\n", ".parquet", None, "expected a .csv or .jsonl"),
        ("_step,train/CE loss\n1,2\n", ".csv", "bogus=x", "unknown key 'bogus'"),
    ],
)
def test_malformed_reference_is_a_clear_error_with_exit_2(run, tmp_path, capsys, content, suffix, columns, message):
    path = tmp_path / f"ref{suffix}"
    path.write_text(content)
    extra = ["--tokens_per_step", TOKENS_PER_STEP] + (["--columns", columns] if columns else [])
    code, result = run_compare(run, path, tmp_path / "out", *extra)
    assert code == 2 and result is None
    assert message in capsys.readouterr().err


def test_no_heldout_points_to_compare_is_exit_2(run, tmp_path):
    path = tmp_path / "train_only.csv"
    path.write_text("_step,train/CE loss\n" + "".join(f"{s + 1},{r['loss']}\n" for s, r in enumerate(metrics_rows())))
    code, result = run_compare(run, path, tmp_path / "out", "--tokens_per_step", TOKENS_PER_STEP)
    assert code == 2 and result["verdict"]["passed"] is None
    assert result["verdict"]["train_loss_gap"]["max"] < 1e-12


@pytest.fixture(scope="module")
def page(run, manifest, tmp_path_factory):
    root = tmp_path_factory.mktemp("page")
    rows = metrics_rows()
    for r in rows:
        r["loss"] -= 0.1 * r["step"] / STEPS  # a "gain" in training loss…
        if "heldout_loss" in r:
            r["heldout_loss"] += 0.05 * r["step"] / STEPS  # …that held-out loss exposes
    other = write_run(str(root / "other"), manifest, rows=rows, seed=1)
    code, _ = run_compare(other, run, root / "out")
    assert code == 1
    return root / "out" / "compare.html"


class _Collect(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.urls = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.urls += [v for k, v in attrs if k in ("src", "href") and v and not v.startswith("#")]


def test_page_is_self_contained_with_a_plot_per_metric(page):
    text = page.read_text()
    p = _Collect()
    p.feed(text)
    assert p.urls == [] and "script" not in p.tags and "link" not in p.tags and "img" not in p.tags
    svgs = re.findall(r"<svg.*?</svg>", text, flags=re.S)
    # train | Δtrain (smoothed, raw faint), held-out | Δheld-out, grad norm, lr: the two runs log the
    # same grad norms and learning rates, so each difference is one line, not a flat chart
    assert len(svgs) == p.tags.count("svg") == 6
    assert text.count("run − reference is exactly 0 at all") == 2
    assert text.count("<div class=grid>") == 4  # a row per metric: value | difference
    for s in svgs:  # matplotlib's SVG, well-formed (browsers drop malformed inline SVG silently)
        assert ET.fromstring(s).tag == "{http://www.w3.org/2000/svg}svg"
    assert '<span class="badge FAIL">FAIL</span>' in text and "first difference at step 0" in text


def test_the_verdict_table_opens_the_page_and_every_chart_reads_on_its_own(page, tmp_path, chromium):
    """The first screen (1000×900 px) holds the whole verdict table; every chart has both axes
    labelled, and a value on hover at each point; no text is cut mid-escape; the reference is dashed."""
    from tests.browser import FIRST_SCREEN, broken_escapes, first_screen_height_of, unlabelled_charts

    text = page.read_text()
    head = text[: text.index('id="verdicts"')]
    assert "<svg" not in head and "<h2" not in head  # nothing before the table but the title
    table = text[text.index('id="verdicts"') : text.index("</table>", text.index('id="verdicts"'))]
    assert table.count('<span class="badge FAIL">FAIL</span>') >= 1 and "max |Δ|" in table
    assert unlabelled_charts(text) == [] and broken_escapes(text) == []
    assert text.count("<title>") > 20 and "tokens</title>" in text  # hover values
    assert "stroke-dasharray" in text  # the reference's dashed line
    assert first_screen_height_of(chromium, page, tmp_path, "verdicts") <= FIRST_SCREEN[1]


def test_smoothing_is_the_debiased_ema_of_pandas():
    """curves.smooth is pandas' ewm(span=N, adjust=True): W&B's and TensorBoard's debiased EMA (its
    first point is the first value, not pulled toward 0)."""
    import pandas as pd  # the test extra brings it (ai2-olmo-core depends on it)

    v = np.random.default_rng(0).normal(10.0, 1.0, 200)
    for span in (2, 10, 50):
        want = pd.Series(v).ewm(span=span, adjust=True).mean().to_numpy()
        np.testing.assert_allclose(curves.smooth(v, span), want, rtol=1e-12)
    assert curves.smooth(v, 10)[0] == v[0] and np.array_equal(curves.smooth(v, 1), v)


def test_page_renders_in_headless_chromium_without_console_errors(page, tmp_path, chromium):
    shot = tmp_path / "compare.png"
    proc = chromium(page, shot, "1000,2400")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.exists() and shot.stat().st_size > 20_000
    console = [line for line in proc.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == [] and "ERR_FILE_NOT_FOUND" not in proc.stderr


# -- long runs: what is stored and drawn stays bounded --------------------------------------------


def test_the_envelope_keeps_a_long_curves_spikes_and_dips_within_the_point_budget():
    rng = np.random.default_rng(0)
    n = 600_000  # a 7B stage-1 run's steps
    v = np.cumsum(rng.standard_normal(n)) * 1e-3
    v[123_457] += 50.0  # a one-step loss spike
    v[400_001] -= 50.0
    v[7] = np.nan  # a step with nothing logged
    keep = curves.envelope(v, 4000)
    assert len(keep) <= 4000 and (np.diff(keep) > 0).all()
    assert {0, n - 1, 123_457, 400_001} <= set(keep.tolist()) and 7 not in set(keep.tolist())
    assert np.nanmax(v[keep]) == np.nanmax(v) and np.nanmin(v[keep]) == np.nanmin(v)
    assert curves.envelope(v[:4000], 4000).tolist() == list(range(4000))  # short curves: every point


def test_a_long_runs_compare_json_holds_at_most_the_point_budget_per_curve(manifest, tmp_path):
    steps = 3 * curves.MAX_POINTS
    rows = [
        {
            "step": s,
            "loss": 3.0 + 1.0 / (s + 1),
            "grad_norm": 1.0,
            "lr": 1e-3,
            **({"heldout_loss": 4.0} if (s + 1) % 100 == 0 else {}),
        }
        for s in range(steps)
    ]
    run_dir = write_run(str(tmp_path / "run"), manifest, rows=rows)
    spike = 5_000  # the reference differs at one step only
    path = tmp_path / "ref.jsonl"
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps({**r, "loss": r["loss"] + (0.75 if r["step"] == spike else 0.0)}) + "\n")
    code, result = run_compare(
        run_dir,
        path,
        tmp_path / "out",
        "--tokens_per_step",
        TOKENS_PER_STEP,
        "--columns",
        "step=step,loss=loss,heldout_loss=heldout_loss,grad_norm=grad_norm,lr=lr",
        "--step_offset",
        1,
    )
    assert code == 0
    raw = result["aligned"]["loss"]
    assert raw["points"] == steps and len(raw["tokens"]) <= curves.MAX_POINTS
    assert raw["max_abs_diff"] == pytest.approx(0.75) and spike in raw["reference_step"]  # the spike survives
    assert (
        result["aligned"]["heldout_loss"]["points"] == len(result["aligned"]["heldout_loss"]["tokens"]) == steps // 100
    )
    # 3.2 MB when every point of the five per-step arrays is kept (measured); the budget bounds it
    assert (tmp_path / "out" / "compare.json").stat().st_size < 1_500_000


def test_a_run_whose_metrics_start_late_names_the_missing_start_and_shows_no_fake_gap(run, manifest, tmp_path):
    """Identical data, the run's metrics.jsonl starting at step 12: the missing start is named (not
    called a prefix) and the smoothed training loss is not averaged across it (before: a −0.41 gap
    at step 12, mean −0.10, between identical numbers)."""
    late = write_run(str(tmp_path / "late"), manifest, rows=metrics_rows()[12:])
    code, result = run_compare(late, run, tmp_path / "o")
    v = result["verdict"]
    assert code == 1 and "the run's metrics start at step 12, the reference's at step 0" in v["summary"]
    assert "judged on a prefix" not in v["summary"]
    assert result["aligned"]["loss_smoothed"]["max_abs_diff"] == 0.0 == result["aligned"]["loss"]["max_abs_diff"]
    assert v["train_loss_gap"]["min"] == 0.0 == v["train_loss_gap"]["max"]
    code, result = run_compare(late, run, tmp_path / "o2", "--allow_prefix")
    assert code == 0 and result["verdict"]["passed"] is True


def test_every_loss_axis_names_its_unit(page):
    """Each chart's axes are labelled; a loss's y axis says nats/token, the x axis tokens seen."""
    labels = re.findall(r'class="axis-label (x|y)">\s*<text[^>]*>(.*?)</text>', page.read_text(), flags=re.S)
    ys = [text for axis, text in labels if axis == "y"]
    assert {text for axis, text in labels if axis == "x"} == {"tokens seen"}
    assert any("loss" in y for y in ys) and all("(nats/token)" in y for y in ys if "loss" in y)
