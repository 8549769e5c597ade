"""The one check that a folder of frozen downstream tasks (or the eval-leakage index built from
one) holds the ids of the data's tokenizer: name, vocabulary size, EOS, PAD and the `fingerprint`
of its ids (contract.downstream.tokenizer_entry: ranks, special tokens, EOS/PAD/BOS). Ids of
another vocabulary score nothing (the trainer's downstream metrics) and match nothing (the
audit's eval-leakage check, the tokenize job's decontamination), silently: all three refuse the
folder with this check, in one line (exit 2) naming both fingerprints.

Here, not in contract: the expected entry is recomputed from the project's vocabulary of that
name (pipelines.vocabularies, data only: no tokenizer engine is imported), which the task builder
encodes with; the trainer, the audit and pipelines.tokenize all may import pipelines.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from contract import TokenizerInfo
from contract import downstream as ds
from contract.errors import Refused

from .vocabularies import VOCABULARIES

BUILD = "python -m pipelines.downstream_tasks"


class TaskTokenizerError(Refused, ValueError):
    """Task files built for another tokenizer than the data's, or for one no check can recompute."""


def expected_entry(run: TokenizerInfo | str) -> dict[str, Any]:
    """The tokenizer entry task files built for data of tokenizer `run` hold (a manifest's
    TokenizerInfo, or a vocabulary's name): the project's vocabulary of that name, whose ranks
    must be the manifest's; TaskTokenizerError otherwise."""
    name = run.name if isinstance(run, TokenizerInfo) else run
    v = VOCABULARIES.get(name)
    if v is None or (isinstance(run, TokenizerInfo) and v.ranks_sha256 != run.ranks_sha256):
        ranks = f" (ranks sha256 {str(run.ranks_sha256)[:16]}…)" if isinstance(run, TokenizerInfo) else ""
        raise TaskTokenizerError(
            f"the data's tokenizer {name!r}{ranks} is not one of the vocabularies the task builder encodes "
            f"with ({', '.join(sorted(VOCABULARIES))}): its task files cannot be checked"
        )
    return ds.tokenizer_entry(v.name, v.vocab_size, v.eos_id, v.pad_id, v.ranks_sha256, v.special_tokens)


def entry_of(tasks: str, index_tokenizer: Mapping[str, Any]) -> Mapping[str, Any]:
    """The tokenizer entry to check for `tasks`, a task folder or an index file: the folder's
    manifest entry (EOS and PAD included, so a refusal names them), else what the index records
    (name, vocab_size, fingerprint: the fingerprint covers EOS and PAD)."""
    path = os.path.join(tasks, ds.MANIFEST_NAME)
    if os.path.isdir(tasks) and os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as f:
                entry = json.load(f).get("tokenizer")
            if isinstance(entry, dict):
                return entry
        except (OSError, ValueError, AttributeError):
            pass  # the index was built from it: its own record then
    return index_tokenizer


def problem(entry: Mapping[str, Any], run: TokenizerInfo | str, whose: str = "the data's") -> str | None:
    """How a task folder's (or its index's) tokenizer `entry` differs from what data of tokenizer
    `run` needs, None when it does not. Every key of ds.TOKENIZER_KEYS the entry holds is compared
    (an index records name, vocab_size and the fingerprint, which covers EOS and PAD); the
    fingerprint always: an entry without one is refused."""
    want = expected_entry(run)
    keys = [k for k in ds.TOKENIZER_KEYS if k in entry or k == "fingerprint"]
    diff = [
        f"{k} {entry.get(k)!r} ({whose} {want[k]!r})" for k in keys if k != "fingerprint" and entry.get(k) != want[k]
    ]
    theirs = str(entry.get("fingerprint"))
    if diff or theirs != want["fingerprint"]:
        diff.append(f"fingerprint {theirs[:16]}… ({whose} {want['fingerprint'][:16]}…)")
        return ", ".join(diff)
    return None


def check(
    what: str, entry: Mapping[str, Any], run: TokenizerInfo | str, whose: str = "the data's", rebuild: str = ""
) -> None:
    """Refuses (TaskTokenizerError, one line) task files whose tokenizer `entry` is not the one
    `run` needs; `what` names them (the flag or key and its path), `rebuild` the command that
    builds the right ones (default: the builder with --tokenizer)."""
    found = problem(entry, run, whose)
    if found:
        name = run.name if isinstance(run, TokenizerInfo) else run
        cmd = rebuild or f"{BUILD} --tokenizer {name} (with the same --tasks and --model_ctx_len)"
        raise TaskTokenizerError(
            f"{what} was built with another tokenizer than {whose}: {found}; rebuild it with: {cmd}"
        )
