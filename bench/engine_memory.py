"""One encoder's memory over a long stream of distinct text (issue 60 item 3; not a test).

    .venv/bin/python -m bench.engine_memory --engine gigatoken [--gb 2] [--recycle_mib 256] [--every_mib 128]

Streams `--gb` GiB of the bench corpus's distinct documents (bench/exactness_corpus.py: a
Zipf-sampled vocabulary that keeps growing, 2% stress documents) through one engine in the job's
batches (`pipelines.job.ENCODE_BATCH_CHARS`), in this process, and prints one JSON line per
`--every_mib` MiB of text: the process's RSS (VmRSS) and peak (VmHWM), and for gigatoken how many
encoders were built. `--recycle_mib 0`: gigatoken's encoder is never rebuilt (its cache grows
unbounded); otherwise it is rebuilt after that many MiB of characters (the engine's default is
`pipelines.dolma2_tokenizer.GIGATOKEN_RECYCLE_CHARS`).
"""

from __future__ import annotations

import argparse
import json
import time


def status() -> dict[str, float]:
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {k: int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", default="gigatoken")
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--recycle_mib", type=int, default=None, help="gigatoken only; 0: never (default: the engine's)")
    ap.add_argument("--every_mib", type=int, default=128)
    ap.add_argument("--seed", type=int, default=60)
    args = ap.parse_args()
    # lazy: --help imports nothing heavy (test_bench_package)
    from bench.exactness_corpus import base_vocabulary, bench_docs, repo_texts, sample_texts
    from pipelines import dolma2_tokenizer as tk
    from pipelines.job import ENCODE_BATCH_CHARS

    if args.engine == "gigatoken" and args.recycle_mib is not None:
        engine = tk._gigatoken_engine(recycle_chars=(args.recycle_mib << 20) or 1 << 62)
    else:
        engine = tk.get_engine(args.engine)
    base = base_vocabulary(repo_texts() + sample_texts())
    docs = bench_docs(args.seed, base)
    total, batch, chars, next_report = 0, [], 0, args.every_mib << 20
    t0, cpu0, enc_cpu, tokens = time.perf_counter(), time.process_time(), 0.0, 0
    print(json.dumps({"mib": 0, **status()}), flush=True)
    while total < args.gb * (1 << 30):
        text = next(docs)["text"]
        batch.append(text)
        chars += len(text)
        if chars >= ENCODE_BATCH_CHARS:
            c = time.process_time()
            ids, _ = engine.encode_batch(batch)
            enc_cpu += time.process_time() - c
            tokens += len(ids)
            total += chars
            batch, chars = [], 0
            if total >= next_report:
                next_report += args.every_mib << 20
                row = {"mib": round(total / (1 << 20)), **status(), "tokens_per_cpu_s": round(tokens / enc_cpu)}
                if args.engine == "gigatoken":
                    row["encoders_built"] = engine.encode_batch.__self__.builds  # type: ignore[attr-defined]
                print(json.dumps(row), flush=True)
    print(json.dumps({"done_s": round(time.perf_counter() - t0), "cpu_s": round(time.process_time() - cpu0)}))


if __name__ == "__main__":
    main()
