"""The start-up check of a recipe's downstream section: its frozen task files are there, hold the
tasks it names, and were built for this run (numpy only: no JAX, no torch).

    tasks = check_downstream(cfg.downstream, model_ctx_len=seq_len, tokenizer=manifests[0].tokenizer)

Returns None when downstream evaluation is off (every 0), else the loaded tasks
(contract.downstream.DownstreamTasks: every array checked against the manifest's sha256). Anything
else is a `DownstreamCheckError` (a ValueError: the start-up's exit 2) with one line that names the
folder and, where the files are missing, the command that builds them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from contract import TokenizerInfo
from contract import downstream as ds
from contract.errors import Refused
from pipelines import task_tokenizer
from trainer.config.schema import DownstreamConfig


class DownstreamCheckError(Refused, ValueError):
    """The downstream section cannot run as configured (one line)."""


def build_command(
    cfg: DownstreamConfig, model_ctx_len: int | None = None, tokenizer: TokenizerInfo | str | None = None
) -> str:
    """The command that writes `cfg.tasks_dir` for `cfg.tasks` (what the refusals suggest)."""
    cmd = f"python -m pipelines.downstream_tasks --tasks {','.join(cfg.tasks)} --out {cfg.tasks_dir}"
    if tokenizer:
        cmd += f" --tokenizer {tokenizer.name if isinstance(tokenizer, TokenizerInfo) else tokenizer}"
    if model_ctx_len:
        cmd += f" --model_ctx_len {model_ctx_len}"
    return cmd


def tokenizer_problem(files: dict[str, Any], run: TokenizerInfo) -> str | None:
    """How the task files' tokenizer entry differs from the run's (name, vocabulary size, EOS, PAD,
    and the fingerprint of its ids), None when it does not: the check the audit and the tokenize
    job make too (pipelines.task_tokenizer); DownstreamCheckError when the run's tokenizer is not
    one the builder encodes with."""
    try:
        return task_tokenizer.problem(files, run, "the run's data")
    except task_tokenizer.TaskTokenizerError as e:
        raise DownstreamCheckError(str(e)) from None


def check_downstream(
    cfg: DownstreamConfig, model_ctx_len: int | None = None, tokenizer: TokenizerInfo | str | None = None
) -> ds.DownstreamTasks | None:
    """model_ctx_len: the run's seq_len, and tokenizer: its
    manifests' tokenizer (both checked against the task files' manifest when given: the instances
    are built for one context length and one vocabulary). A TokenizerInfo is checked whole (name,
    vocabulary size, EOS, PAD and the fingerprint of its ids, `tokenizer_problem`); a name alone,
    by name."""
    if not cfg.every:
        return None
    root = Path(cfg.tasks_dir)
    build = build_command(cfg, model_ctx_len, tokenizer)
    if not (root / ds.MANIFEST_NAME).is_file():
        raise DownstreamCheckError(
            f"downstream.tasks_dir {root}: no {ds.MANIFEST_NAME} (downstream.every="
            f"{cfg.every}); build the task files with: {build}"
        )
    try:
        manifest = ds.load(root, labels=[])  # the manifest alone, checked
    except ds.DownstreamTasksError as e:
        raise DownstreamCheckError(f"downstream.tasks_dir: {e}") from None
    have = manifest.manifest["tasks"]
    missing = [x for x in cfg.labels if x not in have]
    if missing:
        raise DownstreamCheckError(
            f"downstream.tasks_dir {root} lacks {len(missing)} of the {len(cfg.labels)} "
            f"tasks named ({', '.join(missing)}); build them with: {build}"
        )
    m = manifest.manifest
    if model_ctx_len is not None and m["model_ctx_len"] != model_ctx_len:
        raise DownstreamCheckError(
            f"downstream.tasks_dir {root} was built for model_ctx_len {m['model_ctx_len']}, "
            f"the run's seq_len is {model_ctx_len}; rebuild with: {build}"
        )
    name = tokenizer.name if isinstance(tokenizer, TokenizerInfo) else tokenizer
    if name is not None and m["tokenizer"]["name"] != name:
        raise DownstreamCheckError(
            f"downstream.tasks_dir {root} was built with tokenizer {m['tokenizer']['name']!r}, "
            f"the run's data with {name!r}; rebuild with: {build}"
        )
    if isinstance(tokenizer, TokenizerInfo) and (problem := tokenizer_problem(m["tokenizer"], tokenizer)):
        raise DownstreamCheckError(
            f"downstream.tasks_dir {root} was built with another tokenizer than the run's data: {problem}; "
            f"rebuild with: {build}"
        )
    try:
        return ds.load(root, labels=cfg.labels)
    except ds.DownstreamTasksError as e:
        raise DownstreamCheckError(f"downstream.tasks_dir: {e}") from None
