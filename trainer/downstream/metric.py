"""olmo_eval's `ICLMetric` (0.9.0: update + compute) ported to numpy, and OLMo-core's metric keys.

Input: one task's per-instance continuation log-likelihood sums (log p of the continuation's tokens
given the query, summed), one per option for a fast multiple-choice task. What AI2's code does
with them, reproduced step by step because the numbers depend on it:

- Precision. OLMo-core scores bf16 logits, so `-F.cross_entropy(..., reduction="sum")` is a bf16
  number and every quantity ICLMetric derives from it per instance (/ chars, / bytes, * log2 e) is a
  bf16 operation: computed in float32, rounded to bf16. `dtype="bfloat16"` (the default) does the
  same; `dtype="float32"` keeps float32 throughout (a float32-logits run).
- Ties go to the first option (torch.argmax), which bf16 rounding makes common early in training.
- Duplicates: the first value per (doc, option) counts, the first label per doc; a doc whose option
  ids do not cover 0..n-1 is skipped (ICLMetric's IndexError).
- acc_v1 and acc_v2 (and len_norm_v1/_v2, pmi_dc_v1/_v2) are the same number: ICLMetric computes
  both from the with-leading-space log-likelihoods. v1 of ce_loss, bpb, soft, soft_log is the one
  WITHOUT the leading space, v2 the one with it.
- Means: accuracy, ce_loss, bpb, soft and soft_log of a multiple-choice task are Python float sums
  (float64) of float32 per-doc values, then float32; ce_loss/bpb tasks sum float32 tensors, so
  their mean is a float32 running sum (reproduced with a float32 cumulative sum).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from contract import downstream as ds

LOG_2_OF_E = 1.44269504089  # olmo_eval.metrics.LOG_2_OF_E
METRIC_TYPES = ("acc", "len_norm", "pmi_dc", "ce_loss", "bpb", "f1")
METRIC_LABELS = ds.METRIC_LABELS  # OLMo-core's metric labels, the contract's
KEY_PREFIX = ds.METRIC_KEY_PREFIX  # the contract's (compare reads the keys back)
DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32}


def metric_key(label: str, suffix: str, prefix: str = KEY_PREFIX) -> str:
    """OLMo-core's key of one value: 'eval/downstream/<label> (<metric label>)'."""
    return ds.metric_key(label, METRIC_LABELS[suffix], prefix)


def keyed(label: str, values: Mapping[str, float], prefix: str = KEY_PREFIX) -> dict[str, float]:
    return {metric_key(label, k, prefix): v for k, v in values.items()}


CLEAN_SUFFIX = ds.CLEAN_SUFFIX  # a task's metrics on its instances not found in the training data


def keyed_clean(label: str, values: Mapping[str, float], prefix: str = KEY_PREFIX) -> dict[str, float]:
    """OLMo-core's keys with the " clean" suffix, as lm-evaluation-harness reports its
    decontaminated metrics beside the full ones."""
    return {k + CLEAN_SUFFIX: v for k, v in keyed(label, values, prefix).items()}


def without_docs(e: Entries, docs: Collection[int]) -> Entries:
    """The entries of the documents not in `docs` (in order)."""
    keep = ~np.isin(e.doc_id, np.fromiter(docs, np.int64, count=len(docs)))
    fields: dict[str, Any] = {
        f.name: (None if getattr(e, f.name) is None else np.asarray(getattr(e, f.name))[keep])
        for f in dataclasses.fields(e)
    }
    return Entries(**fields)


@dataclass(frozen=True)
class Entries:
    """ICLMetric's state: one row per scored (doc, option) in update order (a fast-mc instance
    contributes one row per option, each with the instance's lengths and label)."""

    doc_id: np.ndarray
    cont_id: np.ndarray
    label_id: np.ndarray
    loglik: np.ndarray  # continuation log-likelihood sums (any float dtype; rounded to dtype below)
    cont_str_len: np.ndarray
    cont_byte_len: np.ndarray
    cont_str_len_no_leading_space: np.ndarray
    cont_byte_len_no_leading_space: np.ndarray
    dc_loglik: np.ndarray | None = None  # pmi_dc: the domain-conditional sums


def entries(
    instances: Mapping[str, np.ndarray], loglik: np.ndarray, fast_mc: bool, dc_loglik: np.ndarray | None = None
) -> Entries:
    """A task's instance fields (contract.downstream arrays, or an olmo_eval batch as numpy) and
    its log-likelihoods ([n], or [n, options] for fast mc with NaN/anything where choices is -1)
    → Entries in ICLMetric's order."""
    n = len(instances["doc_id"])
    loglik = np.asarray(loglik)
    lengths = ("cont_str_len", "cont_byte_len", "cont_str_len_no_leading_space", "cont_byte_len_no_leading_space")
    if not fast_mc:
        if loglik.shape != (n,):
            raise ValueError(f"expected log-likelihoods [{n}], got {loglik.shape}")
        rows, opts = np.arange(n), np.asarray(instances["cont_id"])
        ll, dc = loglik, dc_loglik
    else:
        choices = np.asarray(instances["choices"])
        if loglik.shape != choices.shape:
            raise ValueError(f"expected log-likelihoods {choices.shape} (one per option), got {loglik.shape}")
        rows, opts = np.nonzero(choices != -1)  # row-major: instance by instance, options in order
        ll = loglik[rows, opts]
        dc = None if dc_loglik is None else np.asarray(dc_loglik)[rows, opts]
    take = {f: np.asarray(instances[f])[rows] for f in ("doc_id", "label_id") + lengths}
    return Entries(
        take["doc_id"],
        np.asarray(opts, np.int64),
        take["label_id"],
        ll,
        **{f: take[f] for f in lengths},
        dc_loglik=None if dc is None else np.asarray(dc),
    )


def _per_entry(metric_type: str, e: Entries, dtype: np.dtype | type) -> dict[str, np.ndarray]:
    """ICLMetric.update's per-entry values, each op in float32 rounded to `dtype` (torch's bf16)."""

    def r(x: np.ndarray | float) -> np.ndarray:  # one torch op's result in the logits' dtype, held as float32
        return np.asarray(x, np.float32).astype(dtype).astype(np.float32)

    def div(a: np.ndarray, n: np.ndarray | int) -> np.ndarray:
        return r(a / np.asarray(n).astype(np.float32))

    log2e = np.float32(LOG_2_OF_E)
    ll = r(e.loglik)
    with np.errstate(divide="ignore", invalid="ignore"):
        if metric_type == "pmi_dc":
            if e.dc_loglik is None:
                raise ValueError("pmi_dc needs the domain-conditional log-likelihoods")
            v = div(ll, r(e.dc_loglik))
            return dict(ll=v, ce=-v, bpb=-v, ll_nls=v, ce_nls=-v, bpb_nls=-v)
        if metric_type in ("acc", "f1"):
            out = dict(ll=ll, ll_nls=ll)
        elif metric_type in ("len_norm", "ce_loss", "bpb"):
            out = dict(ll=div(ll, e.cont_str_len), ll_nls=div(ll, e.cont_str_len_no_leading_space))
        else:
            raise ValueError(f"unknown metric type {metric_type!r}; known: {METRIC_TYPES}")
        out.update(
            ce=div(-ll, e.cont_str_len),
            ce_nls=div(-ll, e.cont_str_len_no_leading_space),
            bpb=r(div(-ll, e.cont_byte_len) * log2e),
            bpb_nls=r(div(-ll, e.cont_byte_len_no_leading_space) * log2e),
        )
    return out


def _softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max())
    return z / z.sum(dtype=np.float32)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max()
    return shifted - np.log(np.exp(shifted).sum(dtype=np.float32))


def _f32_mean_py(values: list[float]) -> float:
    """torch.tensor(sum(python floats) / len): a float64 sum, then float32."""
    return float(np.float32(sum(values) / len(values)))


def _f32_mean_torch(values: list[np.float32]) -> float:
    """sum(0-d float32 tensors) / len: a float32 running sum, then a float32 division."""
    total = np.cumsum(np.asarray(values, np.float32), dtype=np.float32)[-1]
    return float(np.float32(total / np.float32(len(values))))


def _f1(y_true: list[int], y_pred: list[int], pos_label: int = 0) -> float:
    tp = sum(t == pos_label and p == pos_label for t, p in zip(y_true, y_pred))
    fp = sum(t != pos_label and p == pos_label for t, p in zip(y_true, y_pred))
    fn = sum(t == pos_label and p != pos_label for t, p in zip(y_true, y_pred))
    if tp + fp == 0 or tp + fn == 0:
        return 0.0
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


# the lists ICLMetric.update appends to, one value per complete document
PER_DOC = (
    "correct",
    "ce",
    "ce_nls",
    "bpb",
    "bpb_nls",
    "soft",
    "soft_log",
    "soft_nls",
    "soft_log_nls",
    "pred",
    "pred_nls",
    "label",
)


def _documents(e: Entries) -> tuple[dict[int, int], dict[int, dict[int, int]]]:
    """({doc: its label (the first entry's)}, {doc: {option: its first entry's index}})."""
    labels: dict[int, int] = {}
    first: dict[int, dict[int, int]] = {}  # doc -> option -> entry index (first seen)
    for i, (doc, cont, lab) in enumerate(zip(e.doc_id.tolist(), e.cont_id.tolist(), e.label_id.tolist())):
        labels.setdefault(doc, lab)
        first.setdefault(doc, {}).setdefault(cont, i)
    return labels, first


def _per_doc(
    metric_type: str, v: dict[str, np.ndarray], labels: dict[int, int], first: dict[int, dict[int, int]]
) -> dict[str, list]:
    """Each complete document's values, as ICLMetric.update appends them (PER_DOC's lists)."""
    per_doc: dict[str, list] = {k: [] for k in PER_DOC}
    for doc, opts in first.items():
        n = len(opts)
        if any(not 0 <= c < n for c in opts):  # ICLMetric: IndexError → the doc is skipped
            continue  # (a negative id indexes from the end in torch; none occurs in olmo_eval's tasks)
        idx = np.empty(n, np.int64)
        for c, i in opts.items():
            idx[c] = i
        lab = labels[doc]
        if metric_type in ("ce_loss", "bpb"):
            key = "ce" if metric_type == "ce_loss" else "bpb"
            per_doc[key].append(v[key][idx[0]])
            per_doc[key + "_nls"].append(v[key + "_nls"][idx[0]])
            continue
        ll, ll_nls = v["ll"][idx], v["ll_nls"][idx]
        if metric_type == "f1":
            per_doc["pred"].append(int(np.argmax(ll)))
            per_doc["pred_nls"].append(int(np.argmax(ll_nls)))
            per_doc["label"].append(lab)
            continue
        per_doc["correct"].append(1.0 if int(np.argmax(ll)) == lab else 0.0)  # first max wins
        for key in ("ce", "ce_nls", "bpb", "bpb_nls"):
            per_doc[key].append(float(v[key][idx][lab]))
        per_doc["soft"].append(float(_softmax(ll)[lab]))
        per_doc["soft_log"].append(float(_log_softmax(ll)[lab]))
        per_doc["soft_nls"].append(float(_softmax(ll_nls)[lab]))
        per_doc["soft_log_nls"].append(float(_log_softmax(ll_nls)[lab]))
    return per_doc


def compute(metric_type: str, e: Entries, dtype: str = "bfloat16") -> dict[str, float]:
    """ICLMetric(metric_type) after update() over these entries, then compute(): {suffix: value}
    (suffixes as ICLMetric names them, e.g. "acc_v1"; values are the float32 numbers it returns).
    Named steps: the documents (`_documents`), their values (`_per_doc`), the means."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    labels, first = _documents(e)
    d = _per_doc(metric_type, _per_entry(metric_type, e, DTYPES[dtype]), labels, first)
    if metric_type == "f1":
        if not d["label"]:
            raise ValueError("no complete document to score")
        return {
            "f1_v1": float(np.float32(_f1(d["label"], d["pred"]))),
            "f1_v2": float(np.float32(_f1(d["label"], d["pred_nls"]))),
        }
    if metric_type in ("ce_loss", "bpb"):
        key = "ce" if metric_type == "ce_loss" else "bpb"
        if not d[key]:
            raise ValueError("no complete document to score")
        return {f"{metric_type}_v1": _f32_mean_torch(d[key + "_nls"]), f"{metric_type}_v2": _f32_mean_torch(d[key])}
    if not d["correct"]:
        raise ValueError("no complete document to score")
    acc = _f32_mean_py(d["correct"])
    return {
        f"{metric_type}_v1": acc,
        f"{metric_type}_v2": acc,
        "ce_loss_v1": _f32_mean_py(d["ce_nls"]),
        "ce_loss_v2": _f32_mean_py(d["ce"]),
        "bpb_v1": _f32_mean_py(d["bpb_nls"]),
        "bpb_v2": _f32_mean_py(d["bpb"]),
        "soft_v1": _f32_mean_py(d["soft_nls"]),
        "soft_v2": _f32_mean_py(d["soft"]),
        "soft_log_v1": _f32_mean_py(d["soft_log_nls"]),
        "soft_log_v2": _f32_mean_py(d["soft_log"]),
    }
