"""Runs every check over the manifests (and optionally a run) and writes report.html + audit.json.

The manifests are the run's `data` list, in its order (a trainer run may read several: the AI2
recipe keeps its held-out validation sets in a manifest of their own). Integrity, accounting and
statistics are checked per manifest; contamination checks every held-out document of every
manifest against every training document of every manifest; the mixture check, the sharding
proof and the run check use the plan built from all of them exactly as the loader builds it.
audit.json's `inputs.manifests` lists them all (`inputs.manifest`/`inputs.fingerprint` are kept,
as strings, when there is one).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from audit.shard_reader import load_manifest
from contract import (
    INDEX_SHUFFLE,
    OLMO_CORE,
    RUN_RECORD_NAME,
    Manifest,
    ManifestError,
    Order,
    RunDir,
    RunRecord,
    RunSummary,
    order_named,
    write_atomic,
)
from dataloader import olmo_order
from dataloader.plan import Plan, plan_from_manifests
from pipelines import task_tokenizer
from pipelines.leakage import open_index

from . import accounting, datachecks, eval_leakage, mixture_check, partial, report, rows, runlog, sharding
from .checks import CheckResult, combine, mark_not_run, not_run_list, skipped
from .contamination import DIGEST, ContaminationConfig
from .scan import load_decoder, scan

DEFAULT_GLOBAL_BATCH = 8  # the trainer's default global batch, used when neither flag nor run says
MAX_DEFAULT_HOSTS = 64  # default H: the largest divisor of G up to this
TRAIN_PADDING = "train_padding"  # audit.json: per manifest, source → {training record: PAD tokens}


@dataclasses.dataclass(frozen=True)
class AuditConfig:
    """data: a manifest path, or the run's list of them in its `data` order; None or empty: the
    run's run.json `data` (needs `run`)."""

    data: str | Sequence[str] | None
    out: str
    run: RunDir | None = None  # as the command line resolved it (contract.cli.run_dir)
    hosts: int | None = None
    steps: int | None = None
    global_batch_size: int | None = None
    seed: int | None = None
    weights: dict[str, float] | None = None
    order: str | None = None  # data order ("grain" | "olmo-core"); None: the run's, else grain
    contamination: ContaminationConfig = ContaminationConfig()
    mixture: mixture_check.MixtureConfig = mixture_check.MixtureConfig()
    brute_force_limit: int = sharding.ShardingConfig.brute_force_limit
    data_checks: datachecks.DataChecks = datachecks.DataChecks()  # run the shard checks now, reuse or skip them
    beam_args: tuple[str, ...] = ()  # Beam options of the shard pass (default: DirectRunner, one worker)
    eval_leakage: eval_leakage.EvalLeakageConfig = eval_leakage.EvalLeakageConfig()  # check 8 (tasks: None = off)


@dataclasses.dataclass(frozen=True)
class RunInputs:
    """What the audit knows of a run: its record (run.json; None when absent, `missing` says why)
    and its summary.json (None until the run finished)."""

    record: RunRecord | None
    summary: RunSummary | None
    missing: dict[str, str]


def read_run(run_dir: RunDir) -> RunInputs:
    """run_dir/run.json (the contract's run record) and summary.json (the contract's run summary).
    A damaged one raises RunRecordError / RunSummaryError naming the file (exit 2); a missing one is
    reported as parts of the run check that cannot run."""
    missing: dict[str, str] = {}
    path = str(run_dir.run_record)
    record = RunRecord.load(path) if os.path.exists(path) else None
    if record is None:
        why = f"{path} is missing (a run from before run.json, or not a trainer run_dir)"
        missing.update(fingerprint=why, hosts=why)
    spath = str(run_dir.summary)
    summary = RunSummary.load(spath) if os.path.exists(spath) else None
    if summary is None:
        missing["data_sha256"] = f"{spath} is missing (the run has not finished)"
    return RunInputs(record, summary, missing)


def default_hosts(global_batch_size: int) -> int:
    return max(h for h in range(1, min(global_batch_size, MAX_DEFAULT_HOSTS) + 1) if global_batch_size % h == 0)


def _tokens_of(manifests: Sequence[Manifest], padding: Sequence[dict[str, dict[int, int]]]) -> Any:
    """Plan source ordinal (over all manifests, in order) + record ordinals → non-PAD tokens.
    padding: per manifest, source → {training record: PAD tokens} (a source not there: no PAD known)."""
    owners = [(name, m, pads) for m, pads in zip(manifests, padding) for name in m.source_names]

    def tokens_of(src: int, records: np.ndarray) -> int:
        name, m, pads = owners[src] if src < len(owners) else ("", manifests[0], {})
        padded = pads.get(name)
        if padded is None:
            return int(records.size) * m.seq_len
        return int(records.size) * m.seq_len - sum(padded.get(r, 0) for r in records.tolist())

    return tokens_of


def _data_side(
    cfg: AuditConfig, manifests: Sequence[Manifest], paths: Sequence[str]
) -> tuple[dict[str, CheckResult], list[dict[str, dict[int, int]]], dict[str, Any]]:
    """The shard checks as --data-checks says: (results by name, train padding per manifest,
    the record of what ran now and what was taken from where, for audit.json's inputs)."""
    dc = cfg.data_checks
    settings = dataclasses.asdict(cfg.contamination)
    leak_index = load_leak_index(cfg.eval_leakage, manifests) if dc.mode != datachecks.NONE else None
    leak_settings = cfg.eval_leakage.settings(leak_index)
    record: dict[str, Any] = {"mode": dc.mode, "ran_at": datachecks.now(), "contamination": settings}
    record[datachecks.TASK_CONTAMINATION] = leak_settings
    if dc.mode != datachecks.NONE:  # the digest that keyed the samples (a reused audit's is the same)
        record[datachecks.DOCUMENT_DIGEST] = DIGEST
    if dc.mode == datachecks.REUSE:
        assert dc.path is not None  # parse_data_checks gives REUSE its path
        fingerprints = [m.fingerprint for m in manifests]
        prev = datachecks.load_previous(dc.path, fingerprints, settings, DIGEST, leak_settings, dc.pin)
        results = {n: datachecks.reused(r, prev) for n, r in prev.results.items()}
        if datachecks.TASK_CONTAMINATION not in results:  # no --eval-tasks now: the three data checks only
            had = prev.task_contamination
            why = NO_EVAL_TASKS + (
                f"; the reused audit ran it (index {str(had.get('index_sha256'))[:12]}…): add --eval-tasks DIR "
                "with its task folder to take it too"
                if had
                else ""
            )
            results[datachecks.TASK_CONTAMINATION] = eval_leakage.not_run(why)
        padding = prev.train_padding
        record["reused_from"] = {"path": prev.path, "date": prev.date, datachecks.SHA256: prev.sha256}
    elif dc.mode == datachecks.NONE:
        why = "not checked: --data-checks none (the shards were not read)"
        results = {n: skipped(n, datachecks.TITLES[n], why) for n in datachecks.DATA_CHECKS}
        results[datachecks.TASK_CONTAMINATION] = eval_leakage.not_run(why)
        padding = [{} for _ in manifests]
    else:
        leak = (cfg.eval_leakage, leak_index) if leak_index is not None else None
        scanned = scan(manifests, cfg.contamination, paths, cfg.beam_args, leak)
        results = {
            "integrity": scanned.integrity,
            "contamination": scanned.contamination,
            "statistics": scanned.statistics,
            datachecks.TASK_CONTAMINATION: scanned.task_contamination or eval_leakage.not_run(NO_EVAL_TASKS),
        }
        padding = [
            {name: dict(st.padded) for (name, split), st in stats.items() if split == "train"}
            for stats in scanned.stats
        ]
    read_now = list(datachecks.DATA_CHECKS) + ([datachecks.TASK_CONTAMINATION] if leak_index is not None else [])
    record["ran_now"] = ["accounting"] + ([] if dc.mode != datachecks.ALL else read_now)
    record["taken_from_previous_audit"] = (
        sorted(r for r in results if r in read_now) if dc.mode == datachecks.REUSE else []
    )
    record["not_checked"] = sorted(r for r in results if r in read_now) if dc.mode == datachecks.NONE else []
    return results, padding, record


NO_EVAL_TASKS = "no --eval-tasks given (a folder of frozen downstream tasks to check the training data against)"


def load_leak_index(
    cfg: eval_leakage.EvalLeakageConfig, manifests: Sequence[Manifest]
) -> eval_leakage.LeakIndex | None:
    """The eval-leakage index of cfg.tasks (None without one), built once here; refused (exit 2,
    pipelines.task_tokenizer) when its tokenizer is not the manifests' (ids of another vocabulary
    match nothing)."""
    if cfg.tasks is None:
        return None

    index = open_index(cfg.tasks)
    # the trainer's and the tokenize job's check too: name, vocabulary, EOS, PAD, fingerprint
    entry = task_tokenizer.entry_of(cfg.tasks, index.meta["tokenizer"])
    task_tokenizer.check(f"--eval-tasks {cfg.tasks}", entry, manifests[0].tokenizer)
    return index


def data_paths(data: str | Sequence[str] | None, rec: RunRecord | None, run_dir: RunDir | None) -> list[str]:
    """The manifests to audit: `data` (one path or a list), else the run's run.json `data`."""
    if isinstance(data, str):
        return [data]
    if data:
        return list(data)
    if rec is not None and rec.data:
        return list(rec.data)
    raise ManifestError(
        f"no manifest given (--data) and no run record naming one"
        f"{f' ({run_dir.run_record} is missing)' if run_dir else ' (no --run)'}"
    )


def load_manifests(paths: Sequence[str], rec: RunRecord | None, from_record: bool) -> list[Manifest]:
    """The manifests at `paths`; a broken one raises ManifestError naming its file. Paths taken
    from run.json (`from_record`) are as the trainer was given them: a relative one is relative
    to the directory the trainer ran in, which run.json does not record — when it cannot be read
    here, or reads a manifest other than the one recorded (another out/), the error says so."""
    manifests = []
    for i, path in enumerate(paths):
        hint = (
            (
                f"; {RUN_RECORD_NAME} records the relative path {path!r}, relative to the directory the trainer "
                f"ran in, not to this one ({os.getcwd()}): run the audit from that directory, or pass --data "
                "with the manifest's path"
            )
            if from_record and not os.path.isabs(path)
            else ""
        )
        try:
            m = load_manifest(path)
        except (ManifestError, OSError) as e:
            if not hint:
                raise
            raise ManifestError(f"{e}{hint}") from e
        recorded = rec.manifest_fingerprints[i] if rec and i < len(rec.manifest_fingerprints) else None
        if hint and recorded is not None and m.fingerprint != recorded:
            raise ManifestError(
                f"{os.path.abspath(path)} has fingerprint {m.fingerprint[:16]}…, the run trained on "
                f"{recorded[:16]}…{hint}"
            )
        manifests.append(m)
    return manifests


def other_data(rec: RunRecord | None, manifests: Sequence[Manifest], paths: Sequence[str]) -> str | None:
    """Why the run's logs cannot be checked against `manifests` (None when they can): its
    run.json records the fingerprints of the manifests it trained on, in order; example ids
    (source ordinal << 40 | record) of other manifests name other documents, or none."""
    if rec is None or tuple(rec.manifest_fingerprints) == tuple(m.fingerprint for m in manifests):
        return None
    ran = ", ".join(f"{p} ({f[:16]}…)" for p, f in zip(rec.data, rec.manifest_fingerprints))
    given = ", ".join(f"{p} ({m.fingerprint[:16]}…)" for p, m in zip(paths, manifests))
    return (
        f"the run trained on other manifests than the audited ones: its {RUN_RECORD_NAME} records {ran}; "
        f"audited: {given}. Audit the run on its own manifests (omit --data, or pass those)"
    )


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the plan is audited under: the global batch G, the seed, the mixture weights, the hosts H
    and the data order, each from the flag, else the run, else the default (`_settings`)."""

    global_batch_size: int
    seed: int
    weights: dict[str, float] | None
    hosts: int
    order: Order  # the data order (INDEX_SHUFFLE | OLMO_CORE)


def _settings(cfg: AuditConfig, rec: RunRecord | None) -> tuple[Settings, dict[str, Any]]:
    """(the settings, audit.json's inputs saying where each came from). --steps is checked here,
    before any check runs: S·G must be int64 positions."""
    logged_g = runlog.logged_global_batch(cfg.run) if cfg.run and not (cfg.global_batch_size or rec) else None
    g = int(cfg.global_batch_size or (rec and rec.global_batch_size) or logged_g or DEFAULT_GLOBAL_BATCH)
    if cfg.steps is not None:
        sharding.check_steps(cfg.steps, g)
    seed = int(cfg.seed if cfg.seed is not None else rec.seed if rec else 0)
    weights = cfg.weights if cfg.weights is not None else rec.weights if rec else None
    if rec:
        run_hosts = rec.hosts[-1].host_count
    else:
        run_hosts = runlog.latest_host_count(cfg.run) if cfg.run else 0
    # The run's topology when it had several hosts; a 1-host proof would be vacuous.
    H = int(cfg.hosts or (run_hosts if run_hosts > 1 else default_hosts(g)))
    hosts_from = (
        "--hosts"
        if cfg.hosts
        else f"the run's {run_hosts} hosts"
        if run_hosts > 1
        else f"the run had {run_hosts or 'no logged'} host(s), and a 1-host proof is vacuous: the "
        f"largest divisor of G={g} up to {MAX_DEFAULT_HOSTS} hosts, so that every host boundary is exercised"
    )
    data_order = order_named(cfg.order) if cfg.order else rec.order if rec else INDEX_SHUFFLE
    g_from = (
        "--global-batch-size"
        if cfg.global_batch_size
        else f"the run's {RUN_RECORD_NAME}"
        if rec
        else "the run's data logs"
        if logged_g
        else "the default"
    )
    seed_from = "--seed" if cfg.seed is not None else f"the run's {RUN_RECORD_NAME}" if rec else "the default"
    said = {"hosts_from": hosts_from, "global_batch_size_from": g_from, "seed_from": seed_from}
    return Settings(g, seed, weights, H, data_order), said


def _inputs_meta(
    cfg: AuditConfig,
    paths: Sequence[str],
    manifests: Sequence[Manifest],
    rec: RunRecord | None,
    s: Settings,
    said: dict[str, Any],
) -> dict[str, Any]:
    """audit.json's inputs: the manifests (the single-manifest keys as before when there is one),
    where the data came from, the settings and where each came from, the run's record."""
    meta: dict[str, Any] = {"manifests": [os.path.abspath(p) for p in paths]}
    if len(paths) == 1:  # the single-manifest keys, as before
        meta.update(manifest=os.path.abspath(paths[0]), fingerprint=manifests[0].fingerprint)
    else:
        meta["fingerprints"] = [m.fingerprint for m in manifests]
    meta["data_from"] = "--data" if cfg.data else f"the run's {RUN_RECORD_NAME}"
    meta.update(
        {
            "seq_len": manifests[0].seq_len,
            "run": str(cfg.run) if cfg.run else None,
            "global_batch_size": s.global_batch_size,
            "seed": s.seed,
            "hosts": s.hosts,
            "hosts_from": said["hosts_from"],
            "weights": s.weights,
        }
    )
    meta["global_batch_size_from"] = said["global_batch_size_from"]
    meta["seed_from"] = said["seed_from"]
    if rec:
        meta["run_record"] = rec.to_json()
    return meta


def _plan(manifests: Sequence[Manifest], paths: Sequence[str], s: Settings) -> tuple[Plan | None, str]:
    """(the loader's plan of the manifests in the data order, "") or (None, why it cannot plan)."""
    try:
        if s.order == OLMO_CORE:  # every instance once per epoch, in listed order
            return olmo_order.plan_from_manifests([m.raw for m in manifests], [m.fingerprint for m in manifests]), ""
        return plan_from_manifests([m.raw for m in manifests], "train", s.weights), ""
    except (ValueError, KeyError) as e:
        return None, f"the loader cannot plan {'this manifest' if len(paths) == 1 else 'these manifests'}: {e}"


def _run_check(
    cfg: AuditConfig,
    run: RunInputs,
    plan: Plan,
    s: Settings,
    other: str | None,
    tokens_of: Any,
) -> runlog.RunFindings:
    """The run check (audit.runlog) of cfg.run's data logs against the plan; `other`: why the run's
    record names other data than the audited manifests (None: the same)."""
    assert cfg.run is not None
    rec, summary = run.record, run.summary
    run_cfg = runlog.RunConfig(
        s.global_batch_size,
        s.seed,
        rec.loader_fingerprint if rec else None,
        summary.data_sha256 if summary else None,
        summary.step if summary else None,
        rec.hosts if rec else None,
        s.order,
        run.missing,
        other,
    )
    return runlog.check_run(cfg.run, plan, run_cfg, tokens_of)


def _mixture(
    cfg: AuditConfig,
    plan: Plan,
    sh: CheckResult,
    found: runlog.RunFindings | None,
    seq_len: int,
) -> CheckResult:
    """The mixture check (audit.mixture_check) with the shares measured on the run's data logs, else on
    the sharding proof's audited positions; none measured under --data-checks none (the PAD in each
    record, so the non-PAD tokens consumed, are unknown: said so)."""
    measured: tuple[Any, Any, str | None] = (None, None, None)
    if found is not None and found.source_examples:
        measured = (found.source_examples, found.source_tokens, "the run's data logs")
    bf = sh.figures.get("brute_force")
    if measured[0] is None and bf:
        measured = (bf["source_examples"], bf["source_tokens"], "the audited positions")
    if cfg.data_checks.mode == datachecks.NONE:  # PAD per record unknown: consumed non-PAD tokens are too
        measured = (None, None, None)
    mix = mixture_check.check_mixture(plan, cfg.mixture, *measured, seq_len=seq_len)
    if cfg.data_checks.mode == datachecks.NONE:
        why = (
            "--data-checks none: the training shards were not read, so the PAD in each record, and "
            "the non-PAD tokens consumed, are not known"
        )
        if "measured_shares" in mix.not_run:
            mix.not_run["measured_shares"] = why
        else:
            mark_not_run(mix, "measured_shares", why)
    return mix


def _plan_checks(
    cfg: AuditConfig,
    run: RunInputs,
    plan: Plan,
    s: Settings,
    manifests: Sequence[Manifest],
    paths: Sequence[str],
    tokens_of: Any,
) -> list[CheckResult]:
    """The checks of the plan: mixture, the sharding proof, the run check (skipped with no --run)."""
    sharding_cfg = sharding.ShardingConfig(
        hosts=s.hosts,
        global_batch_size=s.global_batch_size,
        seed=s.seed,
        steps=cfg.steps,
        brute_force_limit=cfg.brute_force_limit,
        order=s.order,
    )
    sh = sharding.check_sharding(plan, sharding_cfg, tokens_of)
    found = _run_check(cfg, run, plan, s, other_data(run.record, manifests, paths), tokens_of) if cfg.run else None
    mix = _mixture(cfg, plan, sh, found, manifests[0].seq_len)
    return [mix, sh, found.result if found else skipped(runlog.NAME, runlog.TITLE, "no --run given")]


def run_audit(cfg: AuditConfig) -> tuple[list[CheckResult], dict[str, Any]]:
    """Every check → (the results in the report's order, audit.json's inputs). Named steps: the
    settings (`_settings`), the inputs (`_inputs_meta`), the shard checks (`_data_side`), the plan
    (`_plan`) and its checks (`_plan_checks`), the partial marks (audit.partial), the samples."""
    run = read_run(cfg.run) if cfg.run else RunInputs(None, None, {})
    rec = run.record
    paths = data_paths(cfg.data, rec, cfg.run)
    manifests = load_manifests(paths, rec, from_record=not cfg.data)
    s, said = _settings(cfg, rec)
    meta = _inputs_meta(cfg, paths, manifests, rec, s, said)
    data_results, padding, meta["data_checks"] = _data_side(cfg, manifests, paths)
    meta[TRAIN_PADDING] = padding
    tokens_of = _tokens_of(manifests, padding)
    meta["order"] = s.order.to_json()
    plan, plan_error = _plan(manifests, paths, s)
    results = [data_results["integrity"], combine([accounting.check_accounting(m) for m in manifests], paths)]
    if plan is None:
        results.append(CheckResult(mixture_check.NAME, mixture_check.TITLE, False, plan_error))
        results.append(skipped(sharding.NAME, sharding.TITLE, plan_error))
        results.append(skipped(runlog.NAME, runlog.TITLE, plan_error))
    else:
        meta["plan_size"] = plan.size
        results += _plan_checks(cfg, run, plan, s, manifests, paths, tokens_of)
    results += [data_results["contamination"], data_results["statistics"], data_results[datachecks.TASK_CONTAMINATION]]
    results = partial.apply(results)  # a check that read a shard which failed integrity: never a plain pass
    if cfg.data_checks.mode == datachecks.NONE:
        meta[rows.SAMPLES] = {"not_run": "--data-checks none: the shards were not read"}
    else:  # a bounded prefix of the shards (audit.rows), whatever their size
        meta[rows.SAMPLES] = rows.collect(manifests, *load_decoder(manifests[0]))
    return results, meta


def write_outputs(results: list[CheckResult], meta: dict[str, Any], out: str) -> tuple[str, str]:
    """meta: audit.json's inputs (and the report's), apart from TRAIN_PADDING, which goes to the
    top level of audit.json only (for a later --data-checks reuse). A data audit (the shards read
    now) records its datachecks.results_digest in inputs.data_checks.sha256. Both files written
    atomically (contract.write_atomic: WriteFailed, a Stopped, when one cannot be)."""
    passed = all(r.passed is not False for r in results)
    padding, samples = meta.get(TRAIN_PADDING), meta.get(rows.SAMPLES)
    meta = {k: v for k, v in meta.items() if k not in (TRAIN_PADDING, rows.SAMPLES)}
    doc = {
        "passed": passed,
        "inputs": meta,
        "checks": {r.name: r.to_json() for r in results},
        "not_run": not_run_list(results),
    }
    if samples is not None:  # documents to look at (audit.rows): a view, not a verdict
        doc[rows.SAMPLES] = samples
    if padding is not None:
        doc[TRAIN_PADDING] = [
            {src: {str(r): n for r, n in sorted(recs.items())} for src, recs in m.items()} for m in padding
        ]
    doc = json.loads(json.dumps(doc, default=_jsonable))  # as a reader will parse it
    block = doc["inputs"].get("data_checks")
    if isinstance(block, dict) and block.get("mode") == datachecks.ALL:
        block[datachecks.SHA256] = datachecks.results_digest(doc)
        meta["data_checks"][datachecks.SHA256] = block[datachecks.SHA256]  # the caller's record too
    json_path, html_path = os.path.join(out, "audit.json"), os.path.join(out, "report.html")
    write_atomic(html_path, report.render(results, meta, rows.render(samples)))
    write_atomic(json_path, json.dumps(doc, indent=1, sort_keys=True) + "\n")  # the verdict: last
    return html_path, json_path


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    if isinstance(v, np.ndarray):
        return v.tolist()
    raise TypeError(f"not JSON-able: {type(v)}")
