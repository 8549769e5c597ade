"""The encoder engines alone, and the job's DoFn alone: parts of `bench.tokenize_job` (its
`--encoders` and `--in_bundle` modes), not run on their own.

`encoders`: each engine over distinct documents (bench/exactness_corpus.py's bench corpus, or the
embedded sample), in the job's batches, tokens per CPU-second against raw tiktoken
(`encode_ordinary`) and against quicktok, measured in the same process on the same texts, three ways:
  cold   a fresh encoder on documents it has not seen (a new worker's first bundle)
  warm   a fresh encoder that has first encoded as many other documents (a worker's later
         bundles: gigatoken's pre-token cache holds the common words by then)
  hot    the same documents again (the cache holds every pre-token: an upper bound only)
and whether every document's ids equal tiktoken's. Engines without a cache read the same three ways.
"""

from __future__ import annotations

import os
import time

REFERENCE = "tiktoken encode_ordinary"


def _batches(texts: list[str], chars: int) -> list[list[str]]:
    out, cur, n = [], [], 0
    for t in texts:
        cur.append(t)
        n += len(t)
        if n >= chars:
            out.append(cur)
            cur, n = [], 0
    return out + ([cur] if cur else [])


def _rate(fn, batches) -> float:
    c, tokens = time.process_time(), 0
    for b in batches:
        tokens += fn(b)
    return tokens / (time.process_time() - c)


def _fresh(name: str):
    """A new engine object (for gigatoken: a new encoder, an empty cache) without get_engine's cache."""
    # lazy: --help imports nothing heavy (test_bench_package)
    from pipelines import dolma2_tokenizer as tk

    engine = tk.ENGINES[name](tk.DOLMA2)
    return lambda b: len(engine.encode_batch(b)[0])


def encoders(texts: list[str], engines: list[str], repeats: int) -> None:
    """Print the cold / warm / hot table (see the module's docstring) over `texts`, split in two
    halves (warm-up, measured); best of `repeats` per cell, cells interleaved."""
    import numpy as np  # lazy: --help imports nothing heavy (test_bench_package)

    from pipelines import dolma2_tokenizer as tk  # lazy: as above
    from pipelines.job import ENCODE_BATCH_CHARS  # lazy: as above

    half = len(texts) // 2
    warmup, measured = _batches(texts[:half], ENCODE_BATCH_CHARS), _batches(texts[half:], ENCODE_BATCH_CHARS)
    enc = tk.dolma2()
    best: dict[tuple[str, str], float] = {}
    for _ in range(repeats):
        best[REFERENCE, "cold"] = max(
            best.get((REFERENCE, "cold"), 0), _rate(lambda b: sum(len(enc.encode_ordinary(t)) for t in b), measured)
        )
        for name in engines:
            cells = {"cold": _fresh(name)}
            cold = _rate(cells["cold"], measured)
            warm_fn = _fresh(name)
            for b in warmup:
                warm_fn(b)
            warm = _rate(warm_fn, measured)
            hot = _rate(warm_fn, measured)
            for how, r in (("cold", cold), ("warm", warm), ("hot", hot)):
                best[name, how] = max(best.get((name, how), 0), r)
    exact = {}
    reference = tk.ordinary_ids(enc)
    want = [np.frombuffer(reference(t), np.uint32) for t in texts[half:]]
    for name in engines:
        ids, off = tk.get_engine(name).encode_batch(texts[half:])
        exact[name] = sum(not np.array_equal(ids[off[i] : off[i + 1]], w) for i, w in enumerate(want))
    chars = sum(map(len, texts[half:]))
    print(
        f"encoders alone: {len(texts) - half} documents measured ({chars / 1e6:.1f}M characters) after "
        f"{half} others; best of {repeats}; cpus={os.cpu_count()} load1={os.getloadavg()[0]:.1f}"
    )
    base, quick = best[REFERENCE, "cold"], "quicktok" in engines
    print(
        "| engine | documents differing from tiktoken | M tokens/CPU-s cold / warm / hot | × tiktoken cold / warm / hot"
        + (" | × quicktok cold / warm / hot |" if quick else " |")
    )
    print("|---|---|---|---|" + ("---|" if quick else ""))
    print(f"| {REFERENCE} | reference | {base / 1e6:.2f} | 1 |" + (" |" if quick else ""))
    for name in engines:
        rates = [best[name, h] for h in ("cold", "warm", "hot")]
        row = f"| {name} | {exact[name]} / {len(want)} | " + " / ".join(f"{r / 1e6:.2f}" for r in rates)
        row += " | " + " / ".join(f"{r / base:.1f}" for r in rates)
        if quick:
            row += " | " + " / ".join(f"{r / best['quicktok', h]:.2f}" for r, h in zip(rates, ("cold", "warm", "hot")))
        print(row + " |")


def in_bundle(paths: list[str], configs: list[tuple[str, str]], repeats: int, out_dir: str, size: int) -> None:
    """The worker's own work (TokenizeFile.process called directly: no Beam, no start-up) per
    engine and cross-check rate, interleaved, best of `repeats`."""
    from pipelines import dolma2_tokenizer as tk  # lazy: --help imports nothing heavy (test_bench_package)
    from pipelines.job import TokenizeFile  # lazy: as above

    fns = {}
    for engine, check in configs:
        fn = TokenizeFile(
            "dolma2",
            0.001,
            out_dir,
            8192,
            tk.EOS_ID,
            tk.PAD_ID,
            engine=engine,
            crosscheck=check if check == "all" else float(check),
        )
        fn.setup()
        fns[engine, check] = fn
    best, tokens = dict.fromkeys(fns, float("inf")), {}
    for _ in range(repeats):
        for key, fn in fns.items():
            c, n = time.process_time(), 0
            for i, p in enumerate(paths):
                n += sum(
                    o["tokens"] - o["documents"] for o in fn.process(("bench", p, i, len(paths))) if isinstance(o, dict)
                )
            best[key], tokens[key] = min(best[key], time.process_time() - c), n
    print(f"in bundle, {size} MiB, best of {repeats}; cpus={os.cpu_count()} load1={os.getloadavg()[0]:.1f}")
    print("| engine (cross-check) | tokens | CPU s | M tokens per CPU-second |")
    print("|---|---|---|---|")
    for (engine, check), cpu in best.items():
        print(
            f"| {engine} ({check}) | {tokens[engine, check] / 1e6:.1f}M | {cpu:.3f} | {tokens[engine, check] / cpu / 1e6:.2f} |"
        )
