"""Eval-leakage removal at tokenize time (the mixture's `decontaminate: {tasks, threshold, mode}`).

The job builds the index of the task folder once, on the launching machine (`prepare`), and
every TokenizeFile worker builds the detector from it (pipelines/leakage/detect.py, the audit's
check 8 detector). Each batch of encoded training documents is scored (`split_contaminated`): a
contaminated one is not packed but rejected, reason `contaminated:<task>` (the task of the first
instance found), counted like every other reject and written to DIR/rejects/<source>.jsonl. The
manifest's `mixture.decontaminate` records the index's sha256, the task folder's content hash, its
tasks and the detector settings (inside the fingerprint), so an audit with the same index and
settings proves the shards hold none of those instances. Held-out documents are not checked
(they are never trained on).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipelines import task_tokenizer
from pipelines.leakage import DECON, NGRAM13, Detector, DetectorConfig, LeakIndex, open_index
from pipelines.mixture import Mixture

PREFIX = "contaminated:"


def prepare(mixture: Mixture) -> tuple[tuple[LeakIndex, DetectorConfig] | None, dict[str, Any] | None]:
    """((index, detector settings) for the workers, the manifest's record), or (None, None)
    without `decontaminate`. Refuses (LeakIndexError, TaskTokenizerError: exit 2) a folder that cannot be read or was
    built with another tokenizer."""
    d = mixture.decontaminate
    if d is None:
        return None, None
    index = open_index(d.tasks)
    # the audit's and the trainer's check too: name, vocabulary, EOS, PAD, fingerprint
    entry = task_tokenizer.entry_of(d.tasks, index.meta["tokenizer"])
    task_tokenizer.check(f"decontaminate.tasks {d.tasks}", entry, mixture.tokenizer, "the mixture's")
    cfg = DetectorConfig(mode=d.mode, threshold=d.threshold)
    record = {
        "index_sha256": index.sha256,
        "tasks_content_hash": index.meta["tasks_content_hash"],
        "tasks": list(index.tasks),
        "detector": cfg.to_json(),
        "split": "train",
    }
    return (index, cfg), record


def reasons(mixture_record: dict[str, Any] | None) -> tuple[str, ...]:
    """The reject reasons a manifest's `mixture.decontaminate` record allows (one per task)."""
    if not mixture_record:
        return ()
    return tuple(PREFIX + t for t in mixture_record.get("tasks", []))


def split_contaminated(
    det: Detector, ids: np.ndarray, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:
    """A batch of encoded documents (ids, offsets [n + 1]) → (the clean documents' ids, their
    offsets, {document index: reason} of the contaminated ones). A document is contaminated when
    the configured mode flags it (both: either)."""
    cfg = det.cfg
    modes = {DECON, NGRAM13} if cfg.mode == "both" else {cfg.mode}
    out: dict[int, str] = {}
    for r in det.scan(ids, offsets[:-1], offsets[1:]):
        hits = [h for h in r.hits if h.mode in modes]
        if hits:
            out[r.doc] = PREFIX + det.index.tasks[int(det.index.item_task[hits[0].item])]
    if not out:
        return ids, offsets, out
    keep = np.ones(offsets.size - 1, bool)
    keep[list(out)] = False
    lengths = np.diff(offsets)[keep]
    kept = np.concatenate([ids[offsets[k] : offsets[k + 1]] for k in np.flatnonzero(keep).tolist()] or [ids[:0]])
    new_offsets = np.zeros(lengths.size + 1, offsets.dtype)
    np.cumsum(lengths, out=new_offsets[1:])
    return kept, new_offsets, out
