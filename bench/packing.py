"""Padding and fragmentation of best-fit packing against concat-and-chunk (not a test).

    .venv/bin/python -m bench.packing [--seq_len 65536] [--docs 20000] [--window 256] [--seed 0]

Document lengths (tokens plus EOS) are drawn from a long-document sample: log-normal with a median
of `--median` tokens and sigma `--sigma` (the default, median 8,192 and sigma 1.5, puts about a
tenth of the documents above 65,536 tokens, like a long-context mix's books and papers). Both
packers are run on the same lengths in the same order, with one packing unit (shard) per
`--shard_docs` documents, and it prints, for each:
  padding       PAD tokens / record tokens
  truncated     tokens dropped (0 for both: long documents are split, OLMo-core's `fragment`;
                OLMo-core's default `truncate` would drop the share shown on the last line)
  docs split    documents whose tokens are in more than one record
  cut tokens    tokens that cannot attend to the start of their document (their segment in the
                record does not begin at the document's first token)
and the best-fit packer's speed on real uint32 ids (`BestFitPacker`, records built).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pipelines.bestfit import BestFitPacker, best_fit_decreasing, pieces


def concat_stats(lengths: np.ndarray, seq_len: int) -> dict[str, float]:
    """One unit of concat-and-chunk: documents back to back, cut every seq_len, last record PAD-filled."""
    ends = np.cumsum(lengths)
    starts = ends - lengths
    records = -(-int(ends[-1]) // seq_len)
    split = (starts // seq_len) != ((ends - 1) // seq_len)
    # tokens in records after the one the document starts in: they do not see its start
    cut = np.where(split, ends - (starts // seq_len + 1) * seq_len, 0)
    return {
        "records": records,
        "pad": records * seq_len - int(ends[-1]),
        "split": int(split.sum()),
        "cut": int(cut.sum()),
    }


def best_fit_stats(lengths: np.ndarray, seq_len: int, window: int) -> dict[str, float]:
    """One unit of best-fit packing over windows of `window` sequences (as `BestFitPacker`)."""
    records = cut = reference = 0  # reference: OLMo-core's rule without the one-continuation constraint
    split = int(np.count_nonzero(lengths > seq_len))
    start = 0
    while start < len(lengths):
        held, end = 0, start
        while end < len(lengths) and held < window * seq_len:
            held += int(lengths[end])
            end += 1
        parts = [pieces(n, seq_len) for n in lengths[start:end].tolist()]
        sizes = [p for ps in parts for p in ps]
        cont = [0 < k == len(ps) - 1 for ps in parts for k in range(len(ps))]
        records += len(best_fit_decreasing(sizes, seq_len, cont))
        reference += len(best_fit_decreasing(sizes, seq_len))
        cut += sum(max(0, n - seq_len) for n in lengths[start:end].tolist())
        start = end
    total = int(lengths.sum())
    return {"records": records, "pad": records * seq_len - total, "split": split, "cut": cut, "reference": reference}


def _report(name: str, s: dict[str, float], total: int, docs: int) -> None:
    pad = s["pad"] / (s["records"] * ARGS.seq_len)
    print(
        f"{name:12s} records {s['records']:8d}  padding {pad:7.3%}  truncated 0  "
        f"docs split {s['split'] / docs:6.2%}  cut tokens {s['cut'] / total:6.2%}"
        + (f"  (unconstrained best-fit: {s['reference']} records)" if "reference" in s else "")
    )


def main() -> None:
    rng = np.random.default_rng(ARGS.seed)
    lengths = np.maximum(1, rng.lognormal(np.log(ARGS.median), ARGS.sigma, ARGS.docs)).astype(np.int64) + 1
    total, L = int(lengths.sum()), ARGS.seq_len
    print(
        f"{ARGS.docs} documents, {total:,} tokens (median {int(np.median(lengths))}, "
        f"{np.mean(lengths > L):.1%} longer than {L}), units of {ARGS.shard_docs} documents"
    )
    units = [lengths[i : i + ARGS.shard_docs] for i in range(0, len(lengths), ARGS.shard_docs)]
    for name, fn in (
        ("concat", lambda u: concat_stats(u, L)),
        ("best_fit", lambda u: best_fit_stats(u, L, ARGS.window)),
    ):
        acc: dict[str, float] = {}
        for u in units:
            for k, v in fn(u).items():
                acc[k] = acc.get(k, 0) + v
        _report(name, acc, total, ARGS.docs)
    print(f"OLMo-core's truncate would drop {int(np.maximum(lengths - L, 0).sum()) / total:.2%} of the tokens")
    sample = lengths[: ARGS.speed_docs]
    packer = BestFitPacker(L, 1, 2, ARGS.window)
    docs = [rng.integers(3, 100_000, size=n - 1).astype(np.uint32) for n in sample.tolist()]
    t = time.perf_counter()
    n = sum(len(packer.add(d)) for d in docs) + len(packer.finish())
    dt = time.perf_counter() - t
    print(
        f"BestFitPacker: {int(sample.sum()):,} tokens into {n} records in {dt:.2f} s ({sample.sum() / dt / 1e6:.1f} M tokens/s)"
    )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seq_len", type=int, default=65536)
    p.add_argument("--docs", type=int, default=20000)
    p.add_argument("--shard_docs", type=int, default=5000)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--median", type=float, default=8192)
    p.add_argument("--sigma", type=float, default=1.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--speed_docs", type=int, default=2000)
    ARGS = p.parse_args()
    main()
