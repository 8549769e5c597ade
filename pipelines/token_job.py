"""The job graph's token-file branch (`format: tokens` sources; `pipelines.job.build` adds it).

No text, so no dedup: each task is one shard of its source, converted as it is by
`token_files.ConvertTokenFile` (one file → one shard, its instances in the source's split), or,
with best-fit packing (`packing: {group: G}`), by `token_bestfit.PackTokenFiles` (a group of G
consecutive files → one shard).
"""

from __future__ import annotations

from collections.abc import Sequence

import apache_beam as beam

from contract.manifest import TOKENS
from pipelines import token_bestfit
from pipelines import token_files as tokfiles
from pipelines.mixture import Mixture
from pipelines.read import REJECTS_TAG, TALLY_TAG
from pipelines.shards import DEFAULT_SHARD_COMPRESSION


def tasks(mixture: Mixture) -> list[tuple]:
    """(source, path, index, count) per token file (a plain `job.FileTask`), or with best-fit
    packing (source, the group's paths, group index, groups) per group of files."""
    group = mixture.packing.group if mixture.packing is not None else None
    units: Sequence[str | tuple[str, ...]]
    out: list[tuple] = []
    for s, files in zip(mixture.sources, mixture.files):
        if s.format != TOKENS:
            continue
        units = files if group is None else token_bestfit.groups(files, group)
        out.extend((s.name, unit, k, len(units)) for k, unit in enumerate(units))
    return out


def converter(mixture: Mixture, output: str, tok: dict, heldout: frozenset[str]) -> beam.DoFn:
    """The DoFn that writes the token files' shards: best-fit per group, or one file → one shard."""
    dtypes = {s.name: s.dtype for s in mixture.sources if s.format == TOKENS and s.dtype is not None}
    compression = mixture.shard_compression or DEFAULT_SHARD_COMPRESSION
    if mixture.packing is not None and mixture.packing.group is not None:
        ties = mixture.packing.ties or token_bestfit.TIES[0]
        return token_bestfit.PackTokenFiles(
            output, mixture.seq_len, tok["eos_id"], tok["vocab_size"], dtypes, tok["pad_id"], ties, compression
        )
    return tokfiles.ConvertTokenFile(
        output, mixture.seq_len, tok["eos_id"], tok["vocab_size"], dtypes, heldout, tok["pad_id"], compression
    )


def convert_token_files(
    p: beam.Pipeline, mixture: Mixture, output: str, tok: dict, heldout: frozenset[str]
) -> beam.pvalue.DoOutputsTuple | None:
    """The branch's outputs (main `shards`, REJECTS_TAG, TALLY_TAG); None for a mixture without
    token files (nothing is added to `p`)."""
    token_tasks = tasks(mixture)
    if not token_tasks:
        return None
    return (
        p
        | "TokenFiles" >> beam.Create(token_tasks)
        | "SpreadTokenFiles" >> beam.Reshuffle()
        | "ConvertTokenFiles"
        >> beam.ParDo(converter(mixture, output, tok, heldout)).with_outputs(REJECTS_TAG, TALLY_TAG, main="shards")
    )
