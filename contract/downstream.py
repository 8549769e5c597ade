"""Downstream task instances, frozen: the files `python -m pipelines.downstream_tasks` writes and
the trainer reads (standard library + numpy: reading them imports no torch and no olmo_eval).

Layout (FORMAT_VERSION 1)::

    DIR/manifest.json                 written last (below)
    DIR/<label>/<array>.npy           one folder per task, one .npy per array (ARRAYS)

Each task holds `olmo_eval.build_task(label, tokenizer, model_ctx_len)`'s instances in its order,
one row per instance: ragged token lists as a flat int32 array + int64 offsets [n + 1] (`query`:
ctx + continuation[:-1], left-truncated to model_ctx_len, as AI2's builder makes it;
`continuation`; `dc_query`), the per-instance integers of INT_FIELDS (int64 [n]), and `choices`
(int32 [n, max options], -1 where an instance has fewer; [n, 0] unless the task is a fast
multiple-choice one, which scores every option's single token from one query).

manifest.json: format ("olmax-downstream-tasks"), format_version, olmo_eval_version,
model_ctx_len, tokenizer {name, vocab_size, eos_id, pad_id, bos_id, fingerprint}, tasks {label:
{metric_type, fast_mc, instances, docs, query_tokens, max_query_len, max_sequence_length,
sha256}}, content_hash. A task's sha256 covers its arrays (name, dtype, shape, bytes, in ARRAYS
order); content_hash covers everything else in the manifest plus those, so two builds are the same
data exactly when their content_hash is. `load` recomputes both and refuses a mismatch.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import Refused
from .outputs import DOWNSTREAM_TASKS_FORMAT, write_atomic

FORMAT = DOWNSTREAM_TASKS_FORMAT  # "olmax-downstream-tasks" (contract.outputs tells the folder by it)
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
TOKEN_DTYPE = np.dtype("<i4")
INT_DTYPE = np.dtype("<i8")
RAGGED_FIELDS = ("query", "continuation", "dc_query")
INT_FIELDS = (
    "doc_id",
    "cont_id",
    "ctx_len",
    "dc_len",
    "cont_len",
    "cont_str_len",
    "cont_byte_len",
    "cont_str_len_no_leading_space",
    "cont_byte_len_no_leading_space",
    "label_id",
)
ARRAYS = tuple(a for f in RAGGED_FIELDS for a in (f, f"{f}_offsets")) + INT_FIELDS + ("choices",)
NO_CHOICE = -1  # choices padding (olmo_eval's collation pads them with -1 too)
TASK_META_KEYS = (
    "metric_type",
    "fast_mc",
    "instances",
    "docs",
    "query_tokens",
    "max_query_len",
    "max_sequence_length",
    "sha256",
)
METRIC_TYPES = ("acc", "len_norm", "pmi_dc", "ce_loss", "bpb", "f1")
CHOICE_METRICS = ("acc", "len_norm", "pmi_dc")  # label_id picks one of a document's options
# A task label is a folder name of DIR: olmo_eval's labels are [a-z0-9_]; '.' and '-' allowed, no
# '/', no leading '.', so that DIR/<label> is never outside DIR ('../x', '/abs', '.').
LABEL_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
TOKENIZER_KEYS = ("name", "vocab_size", "eos_id", "pad_id", "fingerprint")  # compared with the run's


# The keys downstream metrics are logged under (metrics.jsonl, TensorBoard, W&B): OLMo-core's, so an
# olmax run and AI2's sit under one name. The trainer writes them (trainer.downstream.metric),
# compare reads them back: both through these.
# OLMo-core 3.0.0, olmo_core/train/callbacks/evaluator_callback.py, DownstreamEvaluator
METRIC_LABELS: dict[str, str] = {  # the label of each metric in its key
    "f1_v1": "F1 score",
    "acc_v1": "accuracy",
    "len_norm_v1": "length-normalized accuracy",
    "pmi_dc_v1": "PMI-DC accuracy",
    "ce_loss_v1": "CE loss",
    "bpb_v1": "BPB",
    "soft_v1": "soft loss",
    "soft_log_v1": "log soft loss",
    "f1_v2": "F1 score v2",
    "acc_v2": "accuracy v2",
    "len_norm_v2": "length-normalized accuracy v2",
    "pmi_dc_v2": "PMI-DC accuracy v2",
    "ce_loss_v2": "CE loss v2",
    "bpb_v2": "BPB v2",
    "soft_v2": "soft loss v2",
    "soft_log_v2": "log soft loss v2",
}
METRIC_KEY_PREFIX = "eval/downstream"  # OLMo-core: f"{prefix}/{evaluator.name}/{name}", name "downstream"
CLEAN_SUFFIX = " clean"  # appended to a task's key for its metrics on its instances not found in training


def metric_key(label: str, metric_label: str, prefix: str = METRIC_KEY_PREFIX) -> str:
    """OLMo-core's key of one downstream value: ``'<prefix>/<label> (<metric label>)'``."""
    return f"{prefix}/{label} ({metric_label})"


def parse_metric_key(key: str, prefix: str = METRIC_KEY_PREFIX) -> tuple[str, str] | None:
    """(label, metric label) of a key ``metric_key`` made (the label may hold parentheses, the
    metric label none), None for any other key (a clean-subset key included)."""
    head = prefix + "/"
    if not key.startswith(head) or not key.endswith(")"):
        return None
    label, sep, metric = key[len(head) : -1].rpartition(" (")
    if not sep or not label or not metric or "(" in metric or ")" in metric:
        return None
    return label, metric


def label_problem(label: Any) -> str | None:
    """Why `label` cannot be a task folder's name (None when it can)."""
    if not isinstance(label, str) or not LABEL_RE.fullmatch(label) or ".." in label:
        return f"task label {label!r} is not a plain folder name ([A-Za-z0-9_.-], no '..', no '/')"
    return None


def tokenizer_entry(
    name: str, vocab_size: int, eos_id: int, pad_id: int, ranks_sha256: str, special_tokens: Mapping[str, int]
) -> dict[str, Any]:
    """The manifest's tokenizer entry of a cl100k-based vocabulary (pipelines.dolma2_tokenizer):
    `fingerprint` names the ids exactly (ranks, specials, EOS/PAD/BOS, the special-text rule), so
    the trainer can recompute it from the run's vocabulary and compare."""
    body = {
        "name": name,
        "vocab_size": vocab_size,
        "eos_id": eos_id,
        "pad_id": pad_id,
        "bos_id": None,
        "ranks_sha256": ranks_sha256,
        "special_tokens": dict(sorted(special_tokens.items(), key=lambda kv: kv[1])),
        "special_text": "allowed",
    }
    fp = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return {
        "name": name,
        "vocab_size": vocab_size,
        "eos_id": eos_id,
        "pad_id": pad_id,
        "bos_id": None,
        "fingerprint": fp,
    }


class DownstreamTasksError(Refused, ValueError):
    """A task folder that is not what the manifest says, or a manifest this reader refuses."""


@dataclass(frozen=True)
class TaskInstances:
    """One task's instances (arrays as in ARRAYS; `n` instances)."""

    label: str
    metric_type: str
    fast_mc: bool
    arrays: Mapping[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.arrays["doc_id"])

    def tokens(self, field: str, i: int) -> np.ndarray:
        """Instance i's ids of a ragged field ("query", "continuation", "dc_query")."""
        off = self.arrays[f"{field}_offsets"]
        return self.arrays[field][off[i] : off[i + 1]]

    def lengths(self, field: str) -> np.ndarray:
        return np.diff(self.arrays[f"{field}_offsets"])

    def choices(self, i: int) -> np.ndarray:
        row = self.arrays["choices"][i]
        return row[row != NO_CHOICE]

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]


def pack_ragged(rows: list[list[int]] | list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Ragged int lists → (flat int32 ids, int64 offsets [n + 1])."""
    lengths = np.fromiter((len(r) for r in rows), dtype=INT_DTYPE, count=len(rows))
    offsets = np.zeros(len(rows) + 1, dtype=INT_DTYPE)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=TOKEN_DTYPE, count=int(offsets[-1]))  # 2x a genexpr
    return flat, offsets


def pad_choices(rows: list[list[int]], n: int) -> np.ndarray:
    width = max((len(r) for r in rows), default=0)
    out = np.full((n, width), NO_CHOICE, dtype=TOKEN_DTYPE)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def arrays_sha256(arrays: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in ARRAYS:
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{a.dtype.str}:{list(a.shape)}\n".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def content_hash(manifest: Mapping[str, Any]) -> str:
    """sha256 of the canonical manifest (sorted keys, no spaces, ASCII) without content_hash; the
    tasks' entries carry their arrays' sha256, so this covers the data too."""
    body = {k: v for k, v in manifest.items() if k != "content_hash"}
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    ).hexdigest()


def check_arrays(
    label: str,
    arrays: Mapping[str, np.ndarray],
    vocab_size: int,
    model_ctx_len: int | None = None,
    metric_type: str | None = None,
    fast_mc: bool | None = None,
) -> int:
    """The arrays' own consistency (shapes, dtypes, offsets, ids within the vocabulary, at least one
    instance); with `model_ctx_len`, every query and continuation fits it (`context_problem`); with
    `metric_type` and `fast_mc`, every label_id names one of its options. Returns n."""
    missing = [a for a in ARRAYS if a not in arrays]
    if missing:
        raise DownstreamTasksError(f"{label}: missing arrays {missing}")
    n = len(arrays["doc_id"])
    if n == 0:
        raise DownstreamTasksError(f"{label}: no instances (a task with nothing to score)")
    for f in INT_FIELDS:
        if arrays[f].dtype != INT_DTYPE or arrays[f].shape != (n,):
            raise DownstreamTasksError(f"{label}: {f} must be {INT_DTYPE.str} [{n}]")
    for f in RAGGED_FIELDS:
        flat, off = arrays[f], arrays[f"{f}_offsets"]
        if flat.dtype != TOKEN_DTYPE or flat.ndim != 1 or off.dtype != INT_DTYPE or off.shape != (n + 1,):
            raise DownstreamTasksError(
                f"{label}: {f} must be {TOKEN_DTYPE.str} ids with {INT_DTYPE.str} offsets [{n + 1}]"
            )
        if off[0] != 0 or off[-1] != len(flat) or np.any(np.diff(off) < 0):
            raise DownstreamTasksError(f"{label}: {f}_offsets are not 0 .. {len(flat)}, non-decreasing")
        if flat.size and (flat.min() < 0 or flat.max() >= vocab_size):
            raise DownstreamTasksError(f"{label}: {f} holds ids outside [0, {vocab_size})")
    ch = arrays["choices"]
    if ch.dtype != TOKEN_DTYPE or ch.ndim != 2 or ch.shape[0] != n:
        raise DownstreamTasksError(f"{label}: choices must be {TOKEN_DTYPE.str} [{n}, k]")
    if ch.size and (np.any(ch < NO_CHOICE) or ch.max() >= vocab_size):
        raise DownstreamTasksError(f"{label}: choices hold ids outside [0, {vocab_size}) (or -1 for none)")
    if np.any(arrays["cont_len"] != np.diff(arrays["continuation_offsets"])):
        raise DownstreamTasksError(f"{label}: cont_len differs from the continuations' lengths")
    if model_ctx_len is not None:
        problem = context_problem(arrays, model_ctx_len)
        if problem:
            raise DownstreamTasksError(f"{label}: {problem}")
    if metric_type in CHOICE_METRICS and fast_mc is not None:
        problem = label_problem_of(arrays, bool(fast_mc))
        if problem:
            raise DownstreamTasksError(f"{label}: {problem}")
    return n


def context_problem(arrays: Mapping[str, np.ndarray], model_ctx_len: int) -> str | None:
    """Why the instances do not fit `model_ctx_len` (None when they do): a query longer than it, or
    a continuation so long that olmo_eval's left-truncation leaves no context (ctx_len < 1: the
    scored positions would start before the row; AI2's evaluator crashes on it). The shortest
    model_ctx_len that holds every continuation is the longest one (one context token + its
    tokens but the last)."""
    qlen = np.diff(arrays["query_offsets"])
    ctx, cont = arrays["ctx_len"], arrays["cont_len"]
    short = np.flatnonzero(ctx < 1)
    if short.size:
        return (
            f"{short.size} of {len(ctx)} instances have a continuation longer than model_ctx_len {model_ctx_len} "
            f"holds (up to {int(cont.max())} tokens: no context token left); the shortest model_ctx_len that "
            f"holds every one is {int(cont.max())}"
        )
    if qlen.size and int(qlen.max()) > model_ctx_len:
        return f"a query of {int(qlen.max())} tokens is longer than model_ctx_len {model_ctx_len}"
    bad = np.flatnonzero(ctx + cont - 1 != qlen)
    if bad.size:
        i = int(bad[0])
        return (
            f"instance {i}: ctx_len {int(ctx[i])} + cont_len {int(cont[i])} - 1 is not its query's "
            f"{int(qlen[i])} tokens ({bad.size} such instances): its scored positions are not its continuation's"
        )
    return None


def label_problem_of(arrays: Mapping[str, np.ndarray], fast_mc: bool) -> str | None:
    """Why a label_id names no option of its document (None when each does): a fast multiple-choice
    instance's label indexes its choices, any other document's the continuations it holds
    (ICLMetric reads the log-likelihood at index label_id)."""
    lab = arrays["label_id"]
    if fast_mc:
        options = (arrays["choices"] != NO_CHOICE).sum(axis=1)
    else:
        docs, first, inverse = np.unique(arrays["doc_id"], return_index=True, return_inverse=True)
        per_doc = np.bincount(inverse.reshape(-1), minlength=len(docs))
        lab, options = lab[first], per_doc
    bad = np.flatnonzero((lab < 0) | (lab >= options))
    if bad.size:
        i = int(bad[0])
        return (
            f"label_id {int(lab[i])} of {'instance' if fast_mc else 'document'} {i} names none of its "
            f"{int(options[i])} options ({bad.size} such)"
        )
    return None


def task_meta(
    metric_type: str, fast_mc: bool, arrays: Mapping[str, np.ndarray], max_sequence_length: int
) -> dict[str, Any]:
    qlen = np.diff(arrays["query_offsets"])
    return {
        "metric_type": metric_type,
        "fast_mc": bool(fast_mc),
        "instances": int(len(qlen)),
        "docs": int(len(np.unique(arrays["doc_id"]))),
        "query_tokens": int(qlen.sum()),
        "max_query_len": int(qlen.max(initial=0)),
        "max_sequence_length": int(max_sequence_length),
        "sha256": arrays_sha256(arrays),
    }


def write_task(root: str | os.PathLike, label: str, arrays: Mapping[str, np.ndarray]) -> None:
    folder = Path(root) / label
    folder.mkdir(parents=True, exist_ok=True)
    for name in ARRAYS:
        np.save(folder / f"{name}.npy", np.ascontiguousarray(arrays[name]), allow_pickle=False)


def write_manifest(root: str | os.PathLike, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Adds format, format_version and content_hash; writes DIR/manifest.json (last, atomically)."""
    full = {"format": FORMAT, "format_version": FORMAT_VERSION, **manifest}
    full["content_hash"] = content_hash(full)
    write_atomic(Path(root) / MANIFEST_NAME, json.dumps(full, indent=1, sort_keys=True) + "\n")
    return full


@dataclass(frozen=True)
class DownstreamTasks:
    """A loaded folder: the manifest and its tasks (sorted by label: the order OLMo-core evaluates
    them in, and the manifest's, whose keys are written sorted)."""

    root: Path
    manifest: Mapping[str, Any]
    tasks: Mapping[str, TaskInstances]

    @property
    def labels(self) -> list[str]:
        return list(self.tasks)


def _is_int(v: Any, least: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


_TOKENIZER_TYPES = {"name": str, "vocab_size": 1, "eos_id": 0, "pad_id": 0, "fingerprint": str}
_TASK_TYPES = {
    "metric_type": str,
    "fast_mc": bool,
    "instances": 0,  # (0: check_arrays refuses the task, naming it)
    "docs": 0,
    "query_tokens": 0,
    "max_query_len": 0,
    "max_sequence_length": 1,
    "sha256": str,
}


def _field_problem(obj: Mapping[str, Any], types: Mapping[str, Any]) -> str | None:
    """The first field of `obj` not of its type in `types` (a type, or the least int allowed)."""
    for key, want in types.items():
        v = obj.get(key)
        ok = isinstance(v, want) if isinstance(want, type) else _is_int(v, want)
        if not ok:
            what = want.__name__ if isinstance(want, type) else f"an integer ≥ {want}"
            return f"{key} is {v!r}, not {'a ' + what if isinstance(want, type) else what}"
    return None


def _check_manifest(m: Any, where: str) -> None:
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise DownstreamTasksError(f"{where}: not an {FORMAT} manifest")
    if m.get("format_version") != FORMAT_VERSION:
        raise DownstreamTasksError(
            f"{where}: format_version {m.get('format_version')!r}, this reader reads {FORMAT_VERSION}"
        )
    for key in ("olmo_eval_version", "model_ctx_len", "tokenizer", "tasks", "content_hash"):
        if key not in m:
            raise DownstreamTasksError(f"{where}: no {key!r}")
    if not _is_int(m["model_ctx_len"], 1):
        raise DownstreamTasksError(f"{where}: model_ctx_len is {m['model_ctx_len']!r}, not an integer ≥ 1")
    if not isinstance(m["tokenizer"], dict) or (problem := _field_problem(m["tokenizer"], _TOKENIZER_TYPES)):
        raise DownstreamTasksError(
            f"{where}: tokenizer: {problem if isinstance(m['tokenizer'], dict) else 'not an object'}"
        )
    if not isinstance(m["tasks"], dict):
        raise DownstreamTasksError(f"{where}: tasks is {m['tasks']!r}, not an object {{label: task}}")
    if not isinstance(m["content_hash"], str) or m["content_hash"] != content_hash(m):
        raise DownstreamTasksError(f"{where}: content_hash does not match the manifest")
    for label, meta in m["tasks"].items():
        if problem := label_problem(label):
            raise DownstreamTasksError(f"{where}: {problem}")
        if not isinstance(meta, dict) or set(meta) != set(TASK_META_KEYS):
            raise DownstreamTasksError(f"{where}: task {label!r} must have exactly {list(TASK_META_KEYS)}")
        if problem := _field_problem(meta, _TASK_TYPES):
            raise DownstreamTasksError(f"{where}: task {label!r}: {problem}")
        if meta["metric_type"] not in METRIC_TYPES:
            raise DownstreamTasksError(f"{where}: task {label!r} has metric_type {meta['metric_type']!r}")


def load(root: str | os.PathLike, labels: list[str] | None = None) -> DownstreamTasks:
    """Read DIR (all its tasks, or `labels`), checking every field of the manifest's type, every
    label a plain folder name of DIR, and every array against the manifest (`check_arrays`: ids,
    context length, labels)."""
    root = Path(root)
    where = str(root / MANIFEST_NAME)
    try:
        manifest = json.loads((root / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DownstreamTasksError(f"{where}: {e}") from None
    _check_manifest(manifest, where)
    vocab_size = int(manifest["tokenizer"]["vocab_size"])
    wanted = list(manifest["tasks"]) if labels is None else labels
    for lb in wanted:
        if problem := label_problem(lb):
            raise DownstreamTasksError(f"{where}: {problem}")
    unknown = [lb for lb in wanted if lb not in manifest["tasks"]]
    if unknown:
        raise DownstreamTasksError(f"{where}: no task {unknown} (it holds {sorted(manifest['tasks'])})")
    tasks: dict[str, TaskInstances] = {}
    for label in wanted:
        meta = manifest["tasks"][label]
        try:
            arrays = {a: np.load(root / label / f"{a}.npy", allow_pickle=False) for a in ARRAYS}
        except (OSError, ValueError) as e:
            raise DownstreamTasksError(f"{root / label}: {e}") from None
        n = check_arrays(
            label, arrays, vocab_size, int(manifest["model_ctx_len"]), meta["metric_type"], meta["fast_mc"]
        )
        if n != meta["instances"] or arrays_sha256(arrays) != meta["sha256"]:
            raise DownstreamTasksError(f"{root / label}: arrays differ from the manifest (sha256 or count)")
        tasks[label] = TaskInstances(label, meta["metric_type"], bool(meta["fast_mc"]), arrays)
    return DownstreamTasks(root, manifest, tasks)


# OLMo 3's in-loop tasks (OLMo-core's FAST_TASKS, olmo_core/eval/task_groups.py, which the OLMo 3 7B
# stage-1 scripts log every 10,000 steps), in that order.
OLMO3_FAST_TASKS = (
    "arc_challenge_test_bpb_5shot",
    "arc_challenge_test_mc_5shot_fast",
    "arc_easy_test_bpb_5shot",
    "arc_easy_test_mc_5shot_fast",
    "hellaswag_bpb_5shot",
    "mmlu_humanities_test_bpb_5shot",
    "mmlu_humanities_test_mc_5shot_fast",
    "mmlu_other_test_bpb_5shot",
    "mmlu_other_test_mc_5shot_fast",
    "mmlu_social_sciences_test_bpb_5shot",
    "mmlu_social_sciences_test_mc_5shot_fast",
    "mmlu_stem_test_bpb_5shot",
    "mmlu_stem_test_mc_5shot_fast",
    "basic_skills_arithmetic_rc_5shot",
    "basic_skills_coding_rc_5shot",
    "basic_skills_common_knowledge_rc_5shot",
    "basic_skills_logical_reasoning_rc_5shot",
    "basic_skills_pattern_rc_5shot",
    "basic_skills_string_operations_rc_5shot",
    "codex_humaneval_gold_bpb_3shot",
    "codex_mbpp_gold_bpb_3shot",
    "minerva_math_500_gold_bpb_0shot",
    "mt_mbpp_cpp_gold_bpb_3shot",
    "mt_mbpp_java_gold_bpb_3shot",
    "mt_mbpp_rust_gold_bpb_3shot",
    "copycolors_10way_fast",
)
PRESETS: dict[str, tuple[str, ...]] = {"olmo3-fast": OLMO3_FAST_TASKS}


def task_labels(spec: str) -> list[str]:
    """A preset name or comma-separated labels (presets may be mixed in) → labels, first-seen order."""
    out: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        for label in PRESETS.get(part, (part,) if part else ()):
            if label not in out:
                out.append(label)
    return out
