"""Eval batches of the frozen downstream instances as OLMo-core builds them, and the index arrays
that let only the scored positions go through the LM head (numpy, no torch, no JAX).

OLMo-core's DownstreamEvaluator feeds olmo_eval's `collate_fn` batches of consecutive instances
(DataLoader, no shuffle, no drop_last) to the model: `input_ids` = each query (ctx +
continuation[:-1], already left-truncated to model_ctx_len by the builder) right-padded with PAD to
the batch's longest query rounded up to a multiple of 128, but never past model_ctx_len (or to
model_ctx_len exactly with fixed_ctx_len). ICLMetric then reads the logits of positions
ctx_len-1 .. ctx_len+cont_len-2 of each row against the continuation's tokens; a fast
multiple-choice instance (cont_len 1) reads one position against every option's token.

`EvalBatch` says which positions those are (`score_row`, `score_col`: P positions) and which
log-probabilities to add up (`target_pos` into the P positions, `target_id`, `target_entry`: T
reads), so a model computes hidden states for the whole [B, L] batch but the LM head and
log-softmax on the P scored positions only; `entry_loglik` is the reduction, in numpy, that a JAX
version must equal. Entries are (instance, option) pairs in ICLMetric's order, for metric.entries.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

PAD_MULTIPLE = 128  # olmo_eval's collate_fn pads queries to a multiple of 128


@dataclass(frozen=True)
class EvalBatch:
    tokens: np.ndarray  # [B, L] int32: the queries, right-padded with PAD (OLMo-core's input_ids)
    instance: np.ndarray  # [B] int64: the task instance of each row
    score_row: np.ndarray  # [P] int32: batch row of each scored position
    score_col: np.ndarray  # [P] int32: its column (the logits there predict the next token)
    target_pos: np.ndarray  # [T] int32: index into the P scored positions
    target_id: np.ndarray  # [T] int32: the token whose log-probability is read there
    target_entry: np.ndarray  # [T] int32: the entry it adds to
    entry_instance: np.ndarray  # [E] int64: each entry's instance
    entry_option: np.ndarray  # [E] int64: its option (0 unless fast multiple choice)

    @property
    def num_entries(self) -> int:
        return len(self.entry_instance)


def padded_length(max_query_len: int, model_ctx_len: int, fixed_ctx_len: bool = False) -> int:
    """olmo_eval collate_fn's row length: the longest query rounded up to a multiple of 128, cut
    back to model_ctx_len (its pad_tokens_until_max), or model_ctx_len with fixed_ctx_len."""
    if fixed_ctx_len:
        return model_ctx_len
    return min(PAD_MULTIPLE * math.ceil(max_query_len / PAD_MULTIPLE), model_ctx_len)


def instances_per_batch(batch_tokens: int, task_max_sequence_length: int) -> int:
    """OLMo-core's rank batch size in instances for a token-denominated eval batch
    (EvalBatchSizeUnit.tokens, not fixed length): batch tokens // the task's max_sequence_length."""
    return max(1, batch_tokens // task_max_sequence_length)


def build_batch(
    task: Mapping[str, np.ndarray],
    rows: np.ndarray,
    fast_mc: bool,
    pad_id: int,
    model_ctx_len: int,
    fixed_ctx_len: bool = False,
) -> EvalBatch:
    """The batch of instances `rows` (indices into the task's arrays, contract.downstream layout)."""
    rows = np.asarray(rows, dtype=np.int64)
    q_off, c_off = task["query_offsets"], task["continuation_offsets"]
    qlen = q_off[rows + 1] - q_off[rows]
    if qlen.size and qlen.max() > model_ctx_len:
        raise ValueError(f"a query of {int(qlen.max())} tokens is longer than model_ctx_len {model_ctx_len}")
    length = padded_length(int(qlen.max(initial=1)), model_ctx_len, fixed_ctx_len)
    tokens = np.full((len(rows), length), pad_id, dtype=np.int32)
    score_row: list[int] = []
    score_col: list[int] = []
    target_pos: list[int] = []
    target_id: list[int] = []
    target_entry: list[int] = []
    entry_instance: list[int] = []
    entry_option: list[int] = []
    for b, i in enumerate(rows.tolist()):
        tokens[b, : qlen[b]] = task["query"][q_off[i] : q_off[i + 1]]
        ctx_len, cont_len = int(task["ctx_len"][i]), int(task["cont_len"][i])
        first = len(score_row)
        cols = np.arange(ctx_len - 1, ctx_len + cont_len - 1)
        score_row.extend([b] * cont_len)
        score_col.extend(cols.tolist())
        if fast_mc:
            choices = task["choices"][i]
            for option, token in enumerate(choices.tolist()):
                if token == -1:  # ICLMetric skips an absent option
                    continue
                target_pos.append(first)
                target_id.append(token)
                target_entry.append(len(entry_instance))
                entry_instance.append(i)
                entry_option.append(option)
        else:
            target_pos.extend(range(first, first + cont_len))
            target_id.extend(task["continuation"][c_off[i] : c_off[i + 1]].tolist())
            target_entry.extend([len(entry_instance)] * cont_len)
            entry_instance.append(i)
            entry_option.append(0)
    i32 = np.int32
    return EvalBatch(
        tokens,
        rows,
        np.asarray(score_row, i32),
        np.asarray(score_col, i32),
        np.asarray(target_pos, i32),
        np.asarray(target_id, i32),
        np.asarray(target_entry, i32),
        np.asarray(entry_instance, np.int64),
        np.asarray(entry_option, np.int64),
    )


def batches(
    task: Mapping[str, np.ndarray],
    batch_size: int,
    fast_mc: bool,
    pad_id: int,
    model_ctx_len: int,
    fixed_ctx_len: bool = False,
) -> Iterator[EvalBatch]:
    """Consecutive batches of `batch_size` instances, the last one shorter (OLMo-core's DataLoader:
    no shuffle, no drop_last, one data-parallel rank)."""
    n = len(task["doc_id"])
    for start in range(0, n, batch_size):
        yield build_batch(
            task, np.arange(start, min(start + batch_size, n)), fast_mc, pad_id, model_ctx_len, fixed_ctx_len
        )


def entry_loglik(batch: EvalBatch, logprobs_at_scored: np.ndarray) -> np.ndarray:
    """[E] continuation log-likelihood sums from the log-softmax at the P scored positions
    ([P, V]): each entry's target log-probabilities added in token order."""
    reads = logprobs_at_scored[batch.target_pos, batch.target_id].astype(np.float64)
    return np.bincount(batch.target_entry, weights=reads, minlength=batch.num_entries)


def task_loglik(
    num_instances: int, fast_mc: bool, num_options: int, parts: list[tuple[EvalBatch, np.ndarray]]
) -> np.ndarray:
    """Scatter the batches' entry log-likelihoods into metric.entries' layout: [n], or [n, options]
    for fast multiple choice (NaN where an instance has no such option)."""
    out = np.full((num_instances, num_options) if fast_mc else (num_instances,), np.nan)
    for batch, ll in parts:
        if fast_mc:
            out[batch.entry_instance, batch.entry_option] = ll
        else:
            out[batch.entry_instance] = ll
    return out
