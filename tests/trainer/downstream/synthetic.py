"""Synthetic frozen tasks (contract.downstream arrays) for scoring tests that need no olmo_eval."""

from __future__ import annotations

import numpy as np

from contract import downstream as ds


def task_arrays(
    seed: int, n: int, vocab: int, fast_mc: bool, max_ctx: int = 300, max_cont: int = 20, options: int = 4
) -> dict[str, np.ndarray]:
    """n instances with random contexts (1..max_ctx tokens) and continuations (1..max_cont, or one
    token with `options` choices, some absent, for fast multiple choice); query = ctx + cont[:-1]."""
    rng = np.random.default_rng(seed)
    queries, conts, choices = [], [], []
    ints = {f: [] for f in ds.INT_FIELDS}
    for i in range(n):
        ctx = rng.integers(0, vocab, rng.integers(1, max_ctx + 1)).tolist()
        cont = rng.integers(0, vocab, 1 if fast_mc else rng.integers(1, max_cont + 1)).tolist()
        queries.append(ctx + cont[:-1])
        conts.append(cont)
        if fast_mc:
            k = int(rng.integers(2, options + 1))
            choices.append(rng.integers(0, vocab, k).tolist())
        for f, v in (
            ("doc_id", i),
            ("cont_id", 0),
            ("ctx_len", len(ctx)),
            ("dc_len", 1),
            ("cont_len", len(cont)),
            ("cont_str_len", 3 * len(cont)),
            ("cont_byte_len", 3 * len(cont) + 1),
            ("cont_str_len_no_leading_space", 3 * len(cont) - 1),
            ("cont_byte_len_no_leading_space", 3 * len(cont)),
            ("label_id", 0),
        ):
            ints[f].append(v)
    arrays = {}
    for name, rows in (("query", queries), ("continuation", conts), ("dc_query", [[0]] * n)):
        arrays[name], arrays[f"{name}_offsets"] = ds.pack_ragged(rows)
    for f, v in ints.items():
        arrays[f] = np.asarray(v, ds.INT_DTYPE)
    arrays["choices"] = ds.pad_choices(choices if fast_mc else [[]] * n, n)
    ds.check_arrays("synthetic", arrays, vocab)
    return arrays


def task(label: str, metric_type: str, fast_mc: bool, **kw) -> ds.TaskInstances:
    return ds.TaskInstances(label, metric_type, fast_mc, task_arrays(fast_mc=fast_mc, **kw))


def write_tasks(
    root,
    tasks: list[ds.TaskInstances],
    vocab: int,
    model_ctx_len: int,
    pad_id: int = 1,
    tokenizer_name: str = "synthetic",
) -> dict:
    """A task folder as pipelines.downstream_tasks writes it: the tokenizer entry of the project's
    vocabulary `tokenizer_name` when it is one (as the builder writes it), else a synthetic one."""
    from pipelines.dolma2_tokenizer import VOCABULARIES

    for t in tasks:
        ds.write_task(root, t.label, t.arrays)
    tokenizer = {
        "name": tokenizer_name,
        "vocab_size": vocab,
        "eos_id": 0,
        "pad_id": pad_id,
        "bos_id": None,
        "fingerprint": "0" * 64,
    }
    v = VOCABULARIES.get(tokenizer_name)
    if v is not None:
        assert (vocab, pad_id) == (v.vocab_size, v.pad_id), "a synthetic task of a real vocabulary keeps its ids"
        tokenizer = ds.tokenizer_entry(v.name, v.vocab_size, v.eos_id, v.pad_id, v.ranks_sha256, v.special_tokens)
    return ds.write_manifest(
        root,
        {
            "olmo_eval_version": "synthetic",
            "model_ctx_len": model_ctx_len,
            "tokenizer": tokenizer,
            "tasks": {t.label: ds.task_meta(t.metric_type, t.fast_mc, t.arrays, model_ctx_len) for t in tasks},
        },
    )
