"""The frozen downstream files (contract.downstream): what is written is read back, any change to
an array or the manifest is refused, and reading them (and scoring) imports neither torch nor
olmo_eval."""

from __future__ import annotations

import json

import numpy as np
import pytest

from contract import downstream as ds

VOCAB = 100278


def _task(n_docs: int = 3, fast_mc: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(n_docs)
    samples = []
    for doc in range(n_docs):
        ctx = rng.integers(0, VOCAB, 5 + doc).tolist()
        for opt in range(1 if fast_mc else 2):
            cont = rng.integers(0, VOCAB, 1 if fast_mc else 2 + opt).tolist()
            samples.append(
                {
                    "query": ctx + cont[:-1],
                    "continuation": cont,
                    "dc_query": cont[:-1],
                    "doc_id": doc,
                    "cont_id": opt,
                    "ctx_len": len(ctx),
                    "dc_len": 0,
                    "cont_len": len(cont),
                    "cont_str_len": 4,
                    "cont_byte_len": 4,
                    "cont_str_len_no_leading_space": 3,
                    "cont_byte_len_no_leading_space": 3,
                    "label_id": 1 % (1 if fast_mc else 2),
                    "choices": [7, 8, 9][: 2 + doc % 2],
                }
            )
    arrays = {}
    for f in ds.RAGGED_FIELDS:
        arrays[f], arrays[f"{f}_offsets"] = ds.pack_ragged([s[f] for s in samples])
    for f in ds.INT_FIELDS:
        arrays[f] = np.asarray([s[f] for s in samples], dtype=ds.INT_DTYPE)
    arrays["choices"] = ds.pad_choices(
        [s["choices"] for s in samples] if fast_mc else [[]] * len(samples), len(samples)
    )
    return arrays


def _write(root, tasks: dict[str, tuple[dict, bool]]):
    meta = {}
    for label, (arrays, fast) in tasks.items():
        ds.check_arrays(label, arrays, VOCAB)
        ds.write_task(root, label, arrays)
        meta[label] = ds.task_meta("acc", fast, arrays, 128)
    return ds.write_manifest(
        root,
        {
            "olmo_eval_version": "0.9.0",
            "model_ctx_len": 8192,
            "tokenizer": {
                "name": "dolma2",
                "vocab_size": VOCAB,
                "eos_id": 100257,
                "pad_id": 100277,
                "bos_id": None,
                "fingerprint": "x",
            },
            "tasks": meta,
        },
    )


def test_written_tasks_read_back_equal(tmp_path):
    a, b = _task(3), _task(4, fast_mc=True)
    manifest = _write(tmp_path, {"rc": (a, False), "mc": (b, True)})
    got = ds.load(tmp_path)
    assert got.labels == ["mc", "rc"] and got.manifest == manifest  # sorted, the order OLMo-core evaluates them in
    for label, arrays in (("rc", a), ("mc", b)):
        for name in ds.ARRAYS:
            np.testing.assert_array_equal(got.tasks[label][name], arrays[name])
    assert got.tasks["mc"].choices(1).tolist() == [7, 8, 9] and got.tasks["mc"].choices(0).tolist() == [7, 8]
    assert (
        got.tasks["rc"].tokens("continuation", 1).tolist()
        == a["continuation"][a["continuation_offsets"][1] : a["continuation_offsets"][2]].tolist()
    )
    assert ds.load(tmp_path, ["mc"]).labels == ["mc"]


def test_a_changed_array_is_refused(tmp_path):
    arrays = _task(3)
    _write(tmp_path, {"rc": (arrays, False)})
    changed = dict(arrays, query=arrays["query"].copy())
    changed["query"][0] ^= 1
    np.save(tmp_path / "rc" / "query.npy", changed["query"])
    with pytest.raises(ds.DownstreamTasksError, match="differ from the manifest"):
        ds.load(tmp_path)


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda m: m["tasks"]["rc"].update(instances=99), "content_hash does not match"),
        (lambda m: m.update(format_version=2), "format_version 2"),
        (lambda m: m.update(format="other"), "not an olmax-downstream-tasks manifest"),
    ],
)
def test_a_changed_manifest_is_refused(tmp_path, edit, words):
    _write(tmp_path, {"rc": (_task(3), False)})
    path = tmp_path / ds.MANIFEST_NAME
    m = json.loads(path.read_text())
    edit(m)
    path.write_text(json.dumps(m))
    with pytest.raises(ds.DownstreamTasksError, match=words):
        ds.load(tmp_path)


def test_unknown_label_and_bad_arrays_are_refused(tmp_path):
    _write(tmp_path, {"rc": (_task(3), False)})
    with pytest.raises(ds.DownstreamTasksError, match=r"no task \['mmlu'\]"):
        ds.load(tmp_path, ["mmlu"])
    bad = _task(3)
    bad["query"] = bad["query"].copy()
    bad["query"][0] = VOCAB
    with pytest.raises(ds.DownstreamTasksError, match="outside"):
        ds.check_arrays("rc", bad, VOCAB)
    bad = dict(_task(3), cont_len=_task(3)["cont_len"] + 1)
    with pytest.raises(ds.DownstreamTasksError, match="cont_len"):
        ds.check_arrays("rc", bad, VOCAB)
