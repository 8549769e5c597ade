"""Eval-leakage check, recall of the candidate check (DetectorConfig.candidate_share) against a task
folder of any size: the detector with the check (the default) and without it (candidate_share=0,
every sampled hit decoded and scored) on the same planted documents must flag the same documents.

    .venv/bin/python -m bench.eval_leakage_recall --tasks DIR [--items 300] [--seed 0]

Plants: `--items` indexed task instances drawn at random, each written into a document (400
characters of the embedded sample's prose on each side) as its passage + question + answer in six
ways: verbatim; reformatted (lower case, punctuation removed, double spaces, newlines to spaces);
UPPER CASE; Title Case; each sentence capitalized; newlines to spaces; and, with fillers of their
own, five whitespace ways (every whitespace run a tab, every one a newline, spaces as no-break
spaces, reformatted with tabs, UPPER CASE with tabs). Prints, per way, the
documents flagged with and without the check and the candidates of each, and whether the flagged
documents (and the items they name) are the same. Not a timed bench: the CPU of each scan is shown
for scale only.
"""

from __future__ import annotations

import argparse
import collections
import random
import re
import time

import numpy as np

from pipelines import sample
from pipelines.dolma2_tokenizer import dolma2
from pipelines.leakage import Detector, DetectorConfig, open_index

WAYS = {
    "verbatim": lambda t: t,
    "reformatted": lambda t: re.sub(r" ", "  ", re.sub(r"[^\w\s]", "", t.lower()).replace("\n", " ")),
    "upper": str.upper,
    "title": str.title,
    "sentence": lambda t: ". ".join(x.capitalize() for x in t.split(". ")),
    "one_line": lambda t: " ".join(t.split()),
}
# whitespace that decon's cleaning turns into a space and BPE does not (issue 55): planted with
# fillers drawn from their own generator, so the six ways above keep the plants of earlier rounds
WHITESPACE_WAYS = {
    "tabs": lambda t: re.sub(r"\s+", "\t", t),
    "newlines": lambda t: re.sub(r"\s+", "\n", t),
    "no_break_spaces": lambda t: t.replace(" ", "\xa0"),
    "reformatted_tabs": lambda t: re.sub(r"\s+", "\t", WAYS["reformatted"](t)),
    "upper_tabs": lambda t: re.sub(r"\s+", "\t", t.upper()),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", required=True, help="a task folder or an index file")
    p.add_argument("--items", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    index = open_index(a.tasks)
    checked = Detector(index, DetectorConfig())
    every = Detector(index, DetectorConfig(candidate_share=0))
    enc, rng = dolma2(), random.Random(a.seed)
    filler = [d["text"] for d in sample.prose_docs(120_000)]
    items = rng.sample(np.flatnonzero(checked.indexed).tolist(), min(a.items, int(checked.indexed.sum())))
    texts, labels = [], []
    other = random.Random(f"whitespace-{a.seed}")
    for ways, gen in ((WAYS, rng), (WHITESPACE_WAYS, other)):
        for i in items:
            p_, q, ans = (enc.decode(index.part(x, i).tolist()) for x in ("passage", "question", "answer"))
            for way, f in ways.items():
                texts.append(f"{gen.choice(filler)[:400]}\n\n{f(p_ + q + ans)}\n\n{gen.choice(filler)[:400]}")
                labels.append((way, i))
    ids = [np.asarray(enc.encode_ordinary(t), np.uint32) for t in texts]
    tokens = np.concatenate(ids)
    ends = np.cumsum([x.size for x in ids])
    starts = ends - np.array([x.size for x in ids])
    flagged, cands = {}, {}
    for name, det in (("without", every), ("with", checked)):
        t0 = time.process_time()
        flagged[name] = {r.doc: sorted(h.item for h in r.hits) for r in det.scan(tokens, starts, ends) if r.hits}
        cands[name] = set(det.candidate_docs(tokens, starts, ends).tolist())
        print(f"scan {name} the check: {time.process_time() - t0:.1f} s CPU for {len(texts)} documents")
    # decon itself (every document cleaned and re-tokenized, no pre-filter): what is there to find
    alone = [checked._decon_doc(c) for c in checked.clean_batch(texts)]
    rows: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for k, (way, i) in enumerate(labels):
        for name in ("without", "with"):
            rows[way][f"flagged {name}"] += i in flagged[name].get(k, [])
            rows[way][f"candidates {name}"] += k in cands[name]
        found = alone[k]
        rows[way]["decon"] += found is not None and i in {h.item for h in found.hits}
    print(f"{'way':16} planted  decon alone  flagged without / with  candidates without / with")
    for way in [*WAYS, *WHITESPACE_WAYS]:
        r = rows[way]
        print(
            f"{way:16} {len(items):7}  {r['decon']:11}  {r['flagged without']:15} / {r['flagged with']:<4}  "
            f"{r['candidates without']:18} / {r['candidates with']}"
        )
    same = flagged["without"] == flagged["with"]
    print(
        f"flagged documents and their items identical with and without the check: {same} ({len(flagged['with'])} flagged)"
    )


if __name__ == "__main__":
    main()
