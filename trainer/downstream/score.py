"""Downstream scoring in JAX: per-instance continuation log-likelihood sums of a task's frozen
instances, through the run's model, mesh and parameter shardings.

Only the scored positions go through the LM head. The model runs the whole ``[B, L]`` batch to
its final-norm hidden states (``model.final_hidden``: the layer stack the train and held-out eval
steps run); each row's scored columns (``cols [B, S]``: positions ctx_len-1 .. ctx_len+cont_len-2)
are gathered from them, in chunks of ``HEAD_ROWS`` positions at a time (``lax.scan``), through the
LM head in float32, log-softmax, and the log-probability of each target read (``targets [B, S, K]``:
the continuation's tokens, K = 1; or every option's token of a fast multiple-choice instance,
K options read at its one position). The largest head buffer is ``[HEAD_ROWS, vocab]`` float32,
never ``[B, L, vocab]``. Every array keeps its batch axis sharded over the mesh's batch axes.

Shapes are bucketed so that one pass compiles a bounded number of programs (``plan``): rows are
sorted by query length within a task (per-instance values do not depend on their batch: attention
is causal and the padding is on the right), each batch is padded to L = the first of
LENGTH_BUCKETS (128 · {1, 2, 3} · 2^k) holding its longest query (at most model_ctx_len), with
B = batch_tokens // L rows (a multiple of the batch shards; fewer when the bucket holds fewer
instances: the shards times a power of two), S and K to powers of two. The model
(``hidden_fn``) compiles once per (B, L): 21 programs for OLMo 3's 26 tasks at 8192 and
batch_tokens 32,768 (``python -m bench.downstream_plan``); the head (``head_fn``, a gather, one
matmul, a log-softmax) once per (B, L, S, K):
50-70 small programs. Log-likelihood sums come back as float64 sums of float32 log-probabilities; the
metric rounds them to bf16 (AI2's default) or keeps float32 (``metric.compute(dtype=...)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import model
from contract import downstream as ds
from trainer import mesh as mesh_lib
from trainer.downstream import batches as bt
from trainer.mesh import PyTree

HEAD_ROWS = 1024  # scored positions through the LM head at once: [1024, 100,278] float32 = 0.4 GB
# Row lengths: 128 · {1, 2, 3} · 2^k (steps of at most 1.5x). OLMo 3's 26 tasks at 8192: 10 lengths,
# 78% of the padded tokens real (powers of two alone: 6 lengths, 67%).
LENGTH_BUCKETS = tuple(sorted({m * bt.PAD_MULTIPLE << k for k in range(12) for m in (1, 2, 3)}))


def pow2_at_least(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


def length_bucket(max_query_len: int, model_ctx_len: int, buckets: Sequence[int] = LENGTH_BUCKETS) -> int:
    """A batch's row length: the first of ``buckets`` holding its longest query, at most
    model_ctx_len (always ≥ olmo_eval's own padded length, ``batches.padded_length``)."""
    return min(model_ctx_len, next((b for b in buckets if b >= max_query_len), model_ctx_len))


def runnable_buckets(model_cfg: model.ModelConfig, platform: str) -> tuple[int, ...]:
    """LENGTH_BUCKETS the model's attention runs on ``platform`` (pure): splash tiles a sequence
    only in whole blocks (1536 is no multiple of a 1024 block), the XLA path's attention_chunk
    likewise; a batch whose bucket is left out takes the next one (or model_ctx_len, which the
    run's start-up checked)."""
    impl = model.attention.resolve_impl(model_cfg.attention_impl, platform)
    out = []
    for length in LENGTH_BUCKETS:
        try:
            model.attention.check_seq_len(model_cfg, length, impl)
        except ValueError:
            continue
        out.append(length)
    return tuple(out)


def rows_for(length: int, batch_tokens: int, shards: int) -> int:
    """Rows of a batch of row length ``length``: batch_tokens // length, rounded down to a multiple
    of the mesh's batch shards, at least one row per shard."""
    return max(shards, (batch_tokens // length) // shards * shards)


def rows_needed(n: int, shards: int) -> int:
    """Rows of a batch that holds `n` instances: a multiple of the batch shards, the shards times a
    power of two (so that the programs compiled stay few), never more than `n` needs by 2x."""
    return shards * pow2_at_least(-(-n // shards))


@dataclass(frozen=True)
class Planned:
    rows: np.ndarray  # instance indices of the batch (≤ batch_rows of them)
    length: int  # L
    batch_rows: int  # B


def plan(
    query_lens: np.ndarray,
    batch_tokens: int,
    shards: int,
    model_ctx_len: int,
    buckets: Sequence[int] = LENGTH_BUCKETS,
) -> list[Planned]:
    """Batches of a task (pure; every instance in exactly one): instances sorted by query length
    (stable), grouped by their length bucket L, each group cut into batches of B(L) rows (only a
    group's last batch is short), B(L) no more than the group needs (`rows_needed`): a task of 3
    instances is not padded to batch_tokens // L rows."""
    order = np.argsort(np.asarray(query_lens), kind="stable")
    lengths = np.asarray([length_bucket(int(n), model_ctx_len, buckets) for n in np.asarray(query_lens)[order]])
    out: list[Any] = []
    for length in np.unique(lengths).tolist():
        group = order[lengths == length]
        b = min(rows_for(length, batch_tokens, shards), rows_needed(len(group), shards))
        out.extend(Planned(group[i : i + b], length, b) for i in range(0, len(group), b))
    return out


@dataclass(frozen=True)
class DeviceBatch:
    """One batch as the device program takes it (numpy), and how to read its answer back."""

    tokens: np.ndarray  # [B, L] int32, PAD-filled
    cols: np.ndarray  # [B, S] int32 scored columns (0 where padding)
    targets: np.ndarray  # [B, S, K] int32 target ids (0 where padding)
    batch: bt.EvalBatch  # OLMo-core's batch of the same instances (its reads, its entries)
    read_row: np.ndarray  # [T] where each of the batch's T reads lies in the answer [B, S, K]
    read_s: np.ndarray
    read_k: np.ndarray


def device_batch(
    task: Mapping[str, np.ndarray], p: Planned, fast_mc: bool, pad_id: int, model_ctx_len: int, num_options: int
) -> DeviceBatch:
    """``batches.build_batch``'s batch of ``p.rows`` (olmo_eval's collation and ICLMetric's reads),
    padded to the bucketed shapes and laid out per row."""
    eb = bt.build_batch(task, p.rows, fast_mc, pad_id, model_ctx_len)
    n, width = eb.tokens.shape
    tokens = np.full((p.batch_rows, p.length), pad_id, np.int32)
    tokens[:n, :width] = eb.tokens
    # position p of the batch: its row and its index within the row (positions are row by row)
    first = np.searchsorted(eb.score_row, np.arange(n), side="left")
    pos_s = np.arange(len(eb.score_row)) - first[eb.score_row]
    s_max = int(pos_s.max(initial=0)) + 1
    S = pow2_at_least(s_max)
    K = pow2_at_least(num_options) if fast_mc else 1
    cols = np.zeros((p.batch_rows, S), np.int32)
    cols[eb.score_row, pos_s] = eb.score_col
    # read t of the batch: at position target_pos[t]; its k = its rank among the reads there
    tp = eb.target_pos
    read_k = np.arange(len(tp)) - np.searchsorted(tp, tp, side="left")
    if len(tp) and (np.any(np.diff(tp) < 0) or read_k.max() >= K):
        raise ValueError("a batch's reads are not grouped by position, or exceed the options")
    targets = np.zeros((p.batch_rows, S, K), np.int32)
    read_row, read_s = eb.score_row[tp], pos_s[tp]
    targets[read_row, read_s, read_k] = eb.target_id
    return DeviceBatch(tokens, cols, targets, eb, read_row, read_s, read_k)


def head_chunk(batch_rows: int, s: int, head_rows: int = HEAD_ROWS) -> int:
    """Columns of each row per head step: B·C ≤ head_rows positions (C a power of two dividing S)."""
    c = 1 << max(0, math.floor(math.log2(max(1, head_rows // batch_rows))))
    return min(s, c)


def make_score_fns(
    model_cfg: model.ModelConfig,
    mesh: jax.sharding.Mesh,
    param_shardings: PyTree,
    sharding: model.ShardingConfig | None = None,
    head_rows: int = HEAD_ROWS,
    compiler_options: dict[str, Any] | None = None,
) -> tuple[Callable, Callable]:
    """Two jitted programs, so that the model compiles once per (B, L) and only the small head
    program once per (B, L, S, K) (``compiler_options``: jax.jit's, for both; the tests compile
    them at LLVM level 0):

    ``hidden_fn(params, tokens [B, L]) -> [B, L, D]`` final-norm hidden states (compute dtype);
    ``head_fn(lm_head params, hidden, cols [B, S], targets [B, S, K]) -> float32 [B, S, K]``: the
    log-probability of each target at its scored position, ``head_rows`` positions at a time."""
    sharding = sharding or model.ShardingConfig()
    vocab = model_cfg.scored_vocab_size  # AI2's unmasked padding: every row in the log-softmax

    def hidden(params: PyTree, tokens: jax.Array) -> jax.Array:
        return model.final_hidden(model_cfg, params, tokens, sharding=sharding, mesh=mesh)[0]

    def head(head_params: PyTree, hidden: jax.Array, cols: jax.Array, targets: jax.Array) -> jax.Array:
        B, S = cols.shape
        C = head_chunk(B, S, head_rows)
        n = S // C

        def step(_: None, xs: tuple[jax.Array, jax.Array]) -> tuple[None, jax.Array]:
            c, t = xs  # [B, C], [B, C, K]
            h = jnp.take_along_axis(hidden, c[..., None], axis=1)  # [B, C, D]
            logits = model.lm_head(model_cfg, {"lm_head": head_params}, h).astype(jnp.float32)  # [B, C, Vp]
            if logits.shape[-1] != vocab:
                logits = jnp.where(jnp.arange(logits.shape[-1]) < vocab, logits, -jnp.inf)
            return None, jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), t, axis=-1)  # [B, C, K]

        chunks = (jnp.moveaxis(cols.reshape(B, n, C), 1, 0), jnp.moveaxis(targets.reshape(B, n, C, -1), 1, 0))
        _, out = jax.lax.scan(step, None, chunks)  # [n, B, C, K]
        return jnp.moveaxis(out, 0, 1).reshape(B, S, -1)

    b2, b3 = mesh_lib.batch_sharding(mesh), mesh_lib.batch_sharding(mesh, 3)
    hidden_fn = jax.jit(hidden, in_shardings=(param_shardings, b2), out_shardings=b3, compiler_options=compiler_options)
    head_fn = jax.jit(
        head,
        in_shardings=(param_shardings["lm_head"], b3, b2, b3),
        out_shardings=mesh_lib.replicated(mesh),
        compiler_options=compiler_options,
    )
    return hidden_fn, head_fn


def to_global(x: np.ndarray, mesh: jax.sharding.Mesh) -> jax.Array:
    """A host array every process holds whole → a global array sharded over the batch axes (each
    process places only its devices' rows)."""
    sh = mesh_lib.batch_sharding(mesh, x.ndim)
    return jax.make_array_from_callback(x.shape, sh, lambda idx: x[idx])


def entry_loglik(db: DeviceBatch, logp: np.ndarray) -> np.ndarray:
    """[E] log-likelihood sums (float64 sums of the float32 reads, in token order) from the
    device answer [B, S, K] (pure: ``batches.entry_loglik`` with the reads laid out per row)."""
    reads = np.asarray(logp)[db.read_row, db.read_s, db.read_k].astype(np.float64)
    return np.bincount(db.batch.target_entry, weights=reads, minlength=db.batch.num_entries)


def shapes(
    task: Mapping[str, np.ndarray],
    fast_mc: bool,
    batch_tokens: int,
    shards: int,
    model_ctx_len: int,
    buckets: Sequence[int] = LENGTH_BUCKETS,
) -> set[tuple[int, int, int, int]]:
    """The (B, L, S, K) shapes a task's head program compiles (its model programs: the (B, L)
    pairs), without building the batches."""
    qlen, clen = np.diff(task["query_offsets"]), np.asarray(task["cont_len"])
    k = pow2_at_least(task["choices"].shape[1]) if fast_mc else 1
    return {
        (p.batch_rows, p.length, pow2_at_least(int(clen[p.rows].max())), k)
        for p in plan(qlen, batch_tokens, shards, model_ctx_len, buckets)
    }


class TaskScorer:
    """Scores tasks (contract.downstream.TaskInstances) with one jitted function for every shape."""

    def __init__(
        self,
        model_cfg: model.ModelConfig,
        mesh: jax.sharding.Mesh,
        param_shardings: PyTree,
        batch_tokens: int,
        model_ctx_len: int,
        pad_id: int,
        head_rows: int = HEAD_ROWS,
        compiler_options: dict[str, Any] | None = None,
    ):
        self.mesh, self.batch_tokens, self.model_ctx_len, self.pad_id = mesh, batch_tokens, model_ctx_len, pad_id
        self.shards = mesh_lib.batch_shards(mesh)
        self.hidden_fn, self.head_fn = make_score_fns(
            model_cfg, mesh, param_shardings, head_rows=head_rows, compiler_options=compiler_options
        )
        self.vocab_size = model_cfg.vocab_size
        self.buckets = runnable_buckets(model_cfg, model.attention.platform_of(mesh))

    def device_batches(self, task: ds.TaskInstances) -> Iterator[DeviceBatch]:
        options = task["choices"].shape[1]
        for p in plan(task.lengths("query"), self.batch_tokens, self.shards, self.model_ctx_len, self.buckets):
            yield device_batch(task.arrays, p, task.fast_mc, self.pad_id, self.model_ctx_len, options)

    def loglik(self, params: PyTree, task: ds.TaskInstances) -> np.ndarray:
        """The task's continuation log-likelihood sums: [n], or [n, options] for fast multiple
        choice (NaN where an instance has no such option); metric.entries' layout."""
        if task.metric_type == "pmi_dc":
            raise ValueError(f"{task.label}: pmi_dc (domain-conditional) scoring is not implemented")
        for name in ("query", "continuation") + (("choices",) if task.fast_mc else ()):
            ids = task[name]
            if ids.size and int(ids.max()) >= self.vocab_size:
                raise ValueError(
                    f"{task.label}: token id {int(ids.max())} is outside the model's "
                    f"vocabulary ({self.vocab_size}): tasks built for another tokenizer"
                )
        pending = []
        for db in self.device_batches(task):  # dispatched asynchronously; read back at the end
            hidden = self.hidden_fn(params, to_global(db.tokens, self.mesh))
            pending.append(
                (
                    db,
                    self.head_fn(
                        params["lm_head"], hidden, to_global(db.cols, self.mesh), to_global(db.targets, self.mesh)
                    ),
                )
            )
        parts = [(db.batch, entry_loglik(db, np.asarray(jax.device_get(out)))) for db, out in pending]
        return bt.task_loglik(len(task), task.fast_mc, task["choices"].shape[1], parts)
