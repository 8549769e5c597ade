"""Clean-subset metrics' inputs: the instances the audit's check 8 found, read only from an audit
of the run's own data and the same task files; compare ignores the " clean" keys unless asked."""

from __future__ import annotations

import json

import numpy as np
import pytest

from compare import downstream as cmp
from compare.curves import Curves
from contract import downstream as ds
from tests.pipelines.leak_plants import TINY
from trainer.downstream.clean import contaminated_instances

DATA = ["a" * 64, "b" * 64]  # the run's manifests' fingerprints


def _audit(tmp_path, content_hash, passed=False, instances=None, audited=DATA):
    doc = {
        "inputs": {"fingerprints": audited} if len(audited) > 1 else {"fingerprint": audited[0]},
        "checks": {
            "task_contamination": {
                "passed": passed,
                "summary": "…",
                "figures": {
                    "index": {"tasks_content_hash": content_hash},
                    "instances": instances or {"copycolors_10way_fast": [3, 7]},
                },
            }
        },
    }
    (tmp_path / "audit.json").write_text(json.dumps(doc))
    return str(tmp_path)


def test_the_found_instances_come_only_from_an_audit_of_the_same_task_files(tmp_path):
    tasks = ds.load(TINY)
    got = contaminated_instances(_audit(tmp_path, tasks.manifest["content_hash"]), tasks, DATA)
    assert got == {"basic_skills_pattern_rc_5shot": set(), "copycolors_10way_fast": {3, 7}}
    with pytest.raises(ds.DownstreamTasksError, match="content hash"):
        contaminated_instances(_audit(tmp_path, "0" * 64), tasks, DATA)
    with pytest.raises(ds.DownstreamTasksError, match="did not check eval leakage"):
        contaminated_instances(_audit(tmp_path, tasks.manifest["content_hash"], passed=None), tasks, DATA)
    with pytest.raises(ds.DownstreamTasksError, match="not an audit.json"):
        contaminated_instances(str(tmp_path / "nothing.json"), tasks, DATA)


def test_the_found_instances_come_only_from_an_audit_of_the_runs_own_data(tmp_path):
    tasks, same = ds.load(TINY), ds.load(TINY).manifest["content_hash"]
    in_another_order = contaminated_instances(_audit(tmp_path, same, audited=DATA[::-1]), tasks, DATA)
    assert in_another_order["copycolors_10way_fast"] == {3, 7}  # the same manifests: the same data
    for audited in (["c" * 64], DATA[:1], [*DATA, "c" * 64]):  # another dataset, part of the run's, more
        with pytest.raises(ds.DownstreamTasksError, match="the audit read other data than the run"):
            contaminated_instances(_audit(tmp_path, same, audited=audited), tasks, DATA)
    (tmp_path / "audit.json").write_text(  # an audit.json that records no manifests
        (tmp_path / "audit.json").read_text().replace('"inputs"', '"elsewhere"')
    )
    with pytest.raises(ds.DownstreamTasksError, match="fingerprints none recorded"):
        contaminated_instances(str(tmp_path), tasks, DATA)


def test_the_clean_subset_leaves_out_what_either_detector_found_whatever_decon_found(tmp_path):
    """--eval-leakage-mode both: the instances of decon and of the 13-gram cross-check, together;
    decon finding none must not swap in the other's list, nor decon finding some drop it."""
    tasks = ds.load(TINY)
    label = "copycolors_10way_fast"

    def found(decon, ngram13):
        _audit(tmp_path, tasks.manifest["content_hash"])
        doc = json.loads((tmp_path / "audit.json").read_text())
        doc["checks"]["task_contamination"]["figures"].update(instances=decon, instances_ngram13=ngram13)
        (tmp_path / "audit.json").write_text(json.dumps(doc))
        return contaminated_instances(str(tmp_path), tasks, DATA)[label]

    assert found({}, {label: [5]}) == {5}
    assert found({label: [3]}, {label: [5]}) == {3, 5}
    assert found({label: [3]}, {}) == {3}
    assert found({label: [3]}, None) == {3}  # decon alone: no cross-check ran
    assert found(None, {label: [5, 3]}) == {3, 5}  # ngram13 alone


def test_compare_ignores_the_clean_keys_unless_asked():
    full, clean = "eval/downstream/t (accuracy v2)", "eval/downstream/t (accuracy v2) clean"
    c = Curves("run", np.arange(3.0), np.arange(3), {full: np.ones(3), clean: np.zeros(3), "train/loss": np.ones(3)})
    assert cmp.is_key(full) and not cmp.is_key(clean)
    assert list(cmp.tasks_of(c.values)) == ["t"]  # one task, its full keys only
    v = cmp.clean_view(c)
    assert set(v.values) == {full, "train/loss"} and np.array_equal(v.values[full], np.zeros(3))
    plain = Curves("ref", np.arange(3.0), np.arange(3), {full: np.ones(3)})
    assert cmp.clean_view(plain) is plain  # a side without clean keys is judged on its full ones
