"""The instances of each downstream task found in a run's training data, read from the audit's
check 8 (`python -m audit ... --eval-tasks DIR`: audit.json `checks.task_contamination`), for the
evaluator's clean-subset metrics (`downstream.clean_from`). The audit.json is read as the JSON file
it is (the trainer does not import the audit). Only an audit of the run's own data (its manifests'
fingerprints, audit.json `inputs`) and of the run's task files is taken: the instances another
dataset holds say nothing of what this run read."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from contract import downstream as ds


def audited_fingerprints(doc: Any) -> list[str] | None:
    """The fingerprints of the manifests an audit.json's audit read (``inputs.fingerprints``, or
    ``inputs.fingerprint`` when it read one), None when it records none."""
    inputs = doc.get("inputs") if isinstance(doc, dict) else None
    if not isinstance(inputs, dict):
        return None
    found = inputs.get("fingerprints") or ([inputs["fingerprint"]] if inputs.get("fingerprint") else None)
    return [str(x) for x in found] if isinstance(found, list) else None


def _short(fingerprints: Sequence[str] | None) -> str:
    return "none recorded" if not fingerprints else ", ".join(f"{f[:16]}…" for f in fingerprints)


def data_problem(doc: Any, fingerprints: Sequence[str], tasks_root: str) -> str | None:
    """Why the audit did not read the run's data (its manifests' fingerprints, as a set: the same
    manifests in another order are the same data), or None."""
    theirs = audited_fingerprints(doc)
    if theirs is not None and sorted(theirs) == sorted(fingerprints):
        return None
    return (
        f"the audit read other data than the run (manifest fingerprints {_short(theirs)}; the run's data "
        f"{_short(fingerprints)}), so the instances it found are not the ones this run trained on: audit the "
        f"run's data with `python -m audit --data MANIFEST... --eval-tasks {tasks_root} --out DIR`"
    )


def contaminated_instances(path: str, tasks: ds.DownstreamTasks, fingerprints: Sequence[str]) -> dict[str, set[int]]:
    """{task label: olmo_eval doc ids found in training by any of the audit's detectors} from an
    audit (its audit.json or --out folder) of the run's data (`fingerprints`: its manifests'). Refused (DownstreamTasksError, one
    line) when that audit did not run the check, read other data than the run's, or ran the check
    on other task files than `tasks` (its index names the tasks' content hash)."""
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
    if problem := data_problem(doc, fingerprints, str(tasks.root)):
        raise ds.DownstreamTasksError(f"downstream.clean_from {file}: {problem}")
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
