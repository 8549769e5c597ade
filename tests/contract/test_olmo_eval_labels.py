"""The task labels a recipe is checked against at load are olmo_eval's own (written out so that
loading a config imports no torch)."""

from __future__ import annotations

from importlib.metadata import version

import olmo_eval

from contract import olmo_eval_labels
from contract.downstream import PRESETS


def test_the_written_out_labels_are_olmo_evals_list_tasks():
    assert version("ai2-olmo-eval") == olmo_eval_labels.OLMO_EVAL_VERSION
    assert list(olmo_eval_labels.LABELS) == sorted(olmo_eval.list_tasks())
    assert all(x in olmo_eval_labels.LABELS for labels in PRESETS.values() for x in labels)
