"""The instances of each downstream task found in a run's training data, read from the audit's
check 8 (`python -m audit ... --eval-tasks DIR`: audit.json `checks.task_contamination`), for the
evaluator's clean-subset metrics (`downstream.clean_from`). The audit.json is read as the JSON file
it is (the trainer does not import the audit)."""

from __future__ import annotations

import json
import os
from typing import Any

from contract import downstream as ds


def contaminated_instances(path: str, tasks: ds.DownstreamTasks) -> dict[str, set[int]]:
    """{task label: olmo_eval doc ids found in training by any of the audit's detectors} from an
    audit (its audit.json or --out folder). Refused (DownstreamTasksError, one line) when that audit did not run the check, or ran
    it on other task files than `tasks` (its index names the tasks' content hash)."""
    file = os.path.join(path, "audit.json") if os.path.isdir(path) else path
    try:
        with open(file, encoding="utf-8") as f:
            doc: Any = json.load(f)
        check = doc["checks"]["task_contamination"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ds.DownstreamTasksError(f"downstream.clean_from {file}: not an audit.json with check 8 ({e})") from None
    figures = check.get("figures") or {}
    if check.get("passed") is None or "index" not in figures:
        raise ds.DownstreamTasksError(
            f"downstream.clean_from {file}: the audit did not check eval leakage ({check.get('summary')})"
        )
    theirs, mine = figures["index"].get("tasks_content_hash"), tasks.manifest["content_hash"]
    if theirs != mine:
        raise ds.DownstreamTasksError(
            f"downstream.clean_from {file}: the audit checked task files with content hash {str(theirs)[:16]}…, "
            f"the run evaluates {mine[:16]}…: audit with --eval-tasks {tasks.root}"
        )
    # every detector the audit ran (decon's `instances`, the 13-gram cross-check's
    # `instances_ngram13`; None where it did not run): the union, so that the subset left out does
    # not depend on which detector found an instance, nor on whether decon found any
    found = [figures.get(key) or {} for key in ("instances", "instances_ngram13")]
    return {label: {int(d) for f in found for d in f.get(label, [])} for label in tasks.labels}
