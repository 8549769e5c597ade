"""contract.downstream.load refuses, in one line naming the task, what used to crash the first
downstream step or be read silently wrong: a manifest's fields of the wrong type (its hash valid), a
task label that leaves the folder, a label_id naming no option, a choice id outside the vocabulary,
a task without instances, a query longer than model_ctx_len, a continuation so long that no context
is left (naming the shortest model_ctx_len that holds it)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from contract import downstream as ds
from tests.trainer.downstream.synthetic import task_arrays, write_tasks

VOCAB, CTX = 50, 64


def write(root, label="syn_rc", fast_mc=False, edit=None, metric_type="acc", model_ctx_len=CTX, **kw):
    """One synthetic task written as the builder writes it, its arrays first changed by `edit`."""
    arrays = dict(task_arrays(seed=0, n=6, vocab=VOCAB, fast_mc=fast_mc, max_ctx=20, max_cont=4, **kw))
    if edit:
        edit(arrays)
    write_tasks(root, [ds.TaskInstances(label, metric_type, fast_mc, arrays)], VOCAB, model_ctx_len)
    return root


def rewrite_manifest(root, change):
    """The manifest changed and re-hashed (a content_hash recomputed: the hash alone proves nothing)."""
    m = json.loads((root / ds.MANIFEST_NAME).read_text())
    change(m)
    body = {k: v for k, v in m.items() if k not in ("format", "format_version", "content_hash")}
    ds.write_manifest(root, body)


def refused(root, *words, labels=None):
    with pytest.raises(ds.DownstreamTasksError) as e:
        ds.load(root, labels)
    text = str(e.value)
    assert "\n" not in text and all(w in text for w in words), text
    return text


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda m: m.update(tasks=[]), ["tasks is [], not an object"]),
        (lambda m: m["tokenizer"].update(vocab_size="abc"), ["tokenizer: vocab_size is 'abc'"]),
        (lambda m: m.update(model_ctx_len="64"), ["model_ctx_len is '64', not an integer"]),
        (lambda m: m.update(tokenizer="dolma2"), ["tokenizer: not an object"]),
        (lambda m: m["tasks"]["syn_rc"].update(instances="6"), ["task 'syn_rc': instances is '6'"]),
        (lambda m: m["tasks"]["syn_rc"].update(fast_mc=0), ["task 'syn_rc': fast_mc is 0, not a bool"]),
    ],
)
def test_a_manifest_with_fields_of_the_wrong_type_is_refused_in_one_line(tmp_path, change, words):
    rewrite_manifest(write(tmp_path), change)
    refused(tmp_path, *words)


@pytest.mark.parametrize("label", ["../outside", "/etc/passwd", ".", "a/b"])
def test_a_task_label_that_leaves_the_folder_is_refused(tmp_path, label):
    root = write(tmp_path / "tasks")
    if label == "../outside":
        write(tmp_path / "elsewhere", label="outside")  # a real task folder outside tasks_dir
    rewrite_manifest(root, lambda m: m["tasks"].update({label: m["tasks"]["syn_rc"]}))
    refused(root, f"task label {label!r} is not a plain folder name")
    refused(write(tmp_path / "clean"), "not a plain folder name", labels=[label])


def _bump_label(arrays):
    arrays["label_id"] = arrays["label_id"] + 7


@pytest.mark.parametrize(
    "fast_mc, edit, words",
    [
        (True, _bump_label, ["syn_rc: label_id 7 of instance 0 names none of its"]),
        (False, _bump_label, ["syn_rc: label_id 7 of document 0 names none of its 1 options"]),
        (True, lambda a: a["choices"].__setitem__((0, 0), VOCAB + 3), ["syn_rc: choices hold ids outside [0, 50)"]),
    ],
    ids=["fast-mc-label", "rc-label", "choice-id"],
)
def test_labels_and_choices_that_name_nothing_are_refused(tmp_path, fast_mc, edit, words):
    refused(write(tmp_path, fast_mc=fast_mc, edit=edit), *words)


def test_a_task_without_instances_is_refused(tmp_path):
    def empty(arrays):
        for name in list(arrays):
            a = arrays[name]
            arrays[name] = np.zeros(1, a.dtype) if name.endswith("_offsets") else a[:0]

    refused(write(tmp_path, edit=empty), "syn_rc: no instances")


def test_a_query_longer_than_model_ctx_len_is_refused(tmp_path):
    refused(write(tmp_path, model_ctx_len=8), "syn_rc: a query of", "is longer than model_ctx_len 8")


def test_a_continuation_longer_than_the_context_is_refused_naming_the_shortest_that_holds_it(tmp_path):
    """olmo_eval left-truncates the query and gives ctx_len = len(query) - cont_len + 1, which is ≤ 0
    when the continuation does not fit: the scored positions start before the row."""

    def cut(arrays):  # instance 0 built at model_ctx_len 3 with a 4-token continuation
        arrays["ctx_len"][0] = 3 - int(arrays["cont_len"][0]) + 1

    def long(arrays):
        arrays["continuation"], arrays["continuation_offsets"] = ds.pack_ragged([[1, 2, 3, 4, 5]] * 6)
        arrays["cont_len"] = np.full(6, 5, ds.INT_DTYPE)
        arrays["query"], arrays["query_offsets"] = ds.pack_ragged([[9, 1, 2, 3]] * 6)
        arrays["ctx_len"] = np.full(6, 4 - 5 + 1, ds.INT_DTYPE)  # 0: no context token left

    refused(write(tmp_path / "a", edit=long, model_ctx_len=4), "syn_rc: 6 of 6 instances", "is 5")
    refused(write(tmp_path / "b", edit=cut), "syn_rc:")
