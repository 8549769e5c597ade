"""The downstream metric keys are one contract: the trainer writes them and compare reads
them back through the same two functions (no second spelling, no regex of its own)."""

from __future__ import annotations

import re

from contract import downstream as ds
from trainer.downstream.metric import METRIC_LABELS, metric_key

# what compare matched before the keys moved into the contract
OLD_KEY_RE = re.compile(r"^eval/downstream/(?P<label>.+) \((?P<metric>[^()]+)\)$")


def test_every_key_the_trainer_writes_reads_back_as_its_label_and_metric():
    for label in ("arc_easy_test_rc_5shot", "mmlu_stem_test_mc_5shot_fast", "odd (label)"):
        for suffix, metric_label in METRIC_LABELS.items():
            key = metric_key(label, suffix)
            assert key.startswith(ds.METRIC_KEY_PREFIX + "/")
            assert ds.parse_metric_key(key) == (label, metric_label)
            assert ds.parse_metric_key(key + ds.CLEAN_SUFFIX) is None  # a clean-subset key is not a plain one


def test_the_reader_accepts_exactly_what_the_old_pattern_did():
    keys = [
        "eval/downstream/a (accuracy)",
        "eval/downstream/a (b) (c)",
        "eval/downstream/a (b(c))",
        "eval/downstream/ (accuracy)",
        "eval/downstream/a ()",
        "eval/downstream/a (x) clean",
        "eval/downstream/a(x)",
        "eval/other/a (x)",
        "heldout/c4/loss",
    ]
    for key in keys:
        m = OLD_KEY_RE.match(key)
        assert ds.parse_metric_key(key) == (None if m is None else (m["label"], m["metric"])), key
