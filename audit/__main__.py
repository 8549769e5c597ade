"""`python -m audit --data DIR/manifest.json [DIR2/manifest.json ...] [--run RUN_DIR] [--hosts H --steps S] --out REPORT_DIR`

Writes REPORT_DIR/report.html and REPORT_DIR/audit.json (each atomically; --out is checked before
any work); exits 1 when any check fails, 2 on unusable input (one `error:` line), 3 when it stopped
(one `error:` line: an output that could not be written, or a pass that could not finish; never
read as a FAIL), so it can gate a launch. `--data` takes the run's manifests in its `data` order
(e.g. AI2's training token files and a held-out manifest); without it, the run's run.json names them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import TYPE_CHECKING

from contract import AUDIT_REPORT, ORDERS, STOPPED_BY_VERDICT_COMMAND, Refused, check_out_dir
from contract.cli import Parser, integer, run_dir, run_main, share
from contract.provenance import run_facts
from pipelines.leakage import MODES, DetectorConfig

from . import datachecks, partial, report
from .contamination import ContaminationConfig
from .eval_leakage import EvalLeakageConfig
from .mixture_check import MixtureConfig
from .sharding import ShardingConfig

if TYPE_CHECKING:
    from audit.runner import AuditConfig

# The runner, the shard pass and Beam's options import Apache Beam (seconds): imported where the
# audit runs, after its flags are parsed, so that `--help` and a usage error do without them.


def _weights(text: str) -> dict[str, float]:
    """--weights: a JSON object {source name: finite weight ≥ 0}."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict) or not all(
        type(w) in (int, float) and math.isfinite(w) and w >= 0 for w in value.values()
    ):
        raise argparse.ArgumentTypeError(f"must be a JSON object {{source: finite weight ≥ 0}}, got {text!r}")
    return {k: float(w) for k, w in value.items()}


positive, non_negative = integer(1), integer(0)


def _score(text: str) -> float:
    """A score threshold in (0, 1] (NaN, infinities, 0 and negatives exit 2)."""
    value = share(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text!r}")
    return value


def _data_checks(text: str) -> datachecks.DataChecks:
    try:
        return datachecks.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_args(argv: list[str] | None = None) -> AuditConfig:
    """The command line (module doc) → AuditConfig, in named steps: the inputs, the settings the plan
    is audited under, --out, the checks' options, the shard pass's; whatever is left is a Beam option
    of the shard pass (checked here, `_beam_args`)."""
    p = Parser("python -m audit", __doc__.splitlines()[0])
    _input_options(p)
    _plan_options(p)
    p.add_argument("--out", required=True, help="folder for report.html and audit.json")
    _check_options(p)
    _shard_pass_options(p)
    a, beam_args = p.parse_known_args(argv)
    if not a.data and not a.run:
        p.error("give --data MANIFEST [MANIFEST ...], or --run RUN_DIR whose run.json names them")
    _beam_args(p, beam_args)
    return _config(a, beam_args)


def _input_options(p: Parser) -> None:
    """What is audited: the manifests, the run."""
    p.add_argument(
        "--data",
        nargs="+",
        metavar="MANIFEST",
        help="the pipeline's manifest.json, or several in the trainer's `data` order "
        "(default: the run's run.json `data`)",
    )
    p.add_argument("--run", type=run_dir, help="a trainer run_dir (reads data_log/host-*.jsonl)")  # resolved once, here


def _plan_options(p: Parser) -> None:
    """The settings the plan is audited under (each defaults to the run's)."""
    p.add_argument(
        "--hosts",
        type=positive,
        help="H for the sharding proof (default: the run's if it "
        "had several hosts, else the largest divisor of G up to 64)",
    )
    p.add_argument("--steps", type=positive, help="S for the sharding proof (default: one full epoch)")
    p.add_argument("--global-batch-size", type=positive, help="G (default: the run's, else 8)")
    p.add_argument("--seed", type=non_negative, help="data-order seed (default: the run's, else 0)")
    p.add_argument("--weights", type=_weights, help="JSON {source: weight} overriding the mixture")
    p.add_argument("--order", choices=sorted(ORDERS), help="data order (default: the run's run.json, else grain)")


def _check_options(p: Parser) -> None:
    """The contamination sample, the mixture tolerance, the sharding proof's brute force."""
    p.add_argument(
        "--heldout-sample-docs",
        type=non_negative,
        default=ContaminationConfig.heldout_sample_docs,
        help="held-out documents sampled for the 13-gram overlap",
    )
    p.add_argument(
        "--train-sample-docs",
        type=non_negative,
        default=ContaminationConfig.train_sample_docs,
        help="training documents whose 13-grams the held-out sample is compared with",
    )
    p.add_argument(
        "--max-ngram-rate",
        type=share,
        default=None,
        help="fail when more than this fraction of sampled held-out documents share a 13-gram "
        "with training (default: report only)",
    )
    p.add_argument(
        "--mixture-tolerance",
        type=share,
        default=MixtureConfig.tolerance,
        help="share allowed on top of rounding and sampling noise, in [0, 1]",
    )
    p.add_argument(
        "--brute-force-limit",
        type=non_negative,
        default=ShardingConfig.brute_force_limit,
        help="brute-force the slots of every position when S·G is at most this",
    )


def _shard_pass_options(p: Parser) -> None:
    """What the shard pass runs: the shard checks (now, reused, none) and check 8's eval leakage."""
    p.add_argument(
        "--data-checks",
        type=_data_checks,
        default="all",
        metavar="all|none|reuse:PATH",
        help="the checks that read every shard (integrity, contamination, statistics): all = now; "
        "reuse:PATH = take them from a previous audit (its audit.json or --out folder) "
        "of the same manifests; none = not checked",
    )
    p.add_argument(
        "--eval-tasks",
        metavar="DIR",
        help="check 8, eval leakage: a folder of frozen downstream tasks (python -m pipelines.downstream_tasks) "
        "whose instances are looked for in every training document, in the same shard pass (default: not run)",
    )
    p.add_argument(
        "--eval-leakage-mode",
        choices=MODES,
        default=DetectorConfig.mode,
        help="decon: AI2 decon's detector; ngram13: the exact word 13-gram cross-check "
        "(datatrove's NGramsDecontFilter); both",
    )
    p.add_argument(
        "--eval-leakage-threshold",
        type=_score,
        default=DetectorConfig.threshold,
        help="decon's contamination score threshold, in (0, 1] (decon's)",
    )


def _beam_args(p: Parser, beam_args: list[str]) -> None:
    """What parse_args did not know: each must be a Beam option of the shard pass (--runner,
    --direct_num_workers, …); anything else is a usage error (one `error:` line, exit 2)."""
    from audit.engine import AUDIT_FLAGS  # Beam: after parsing (see the imports)
    from pipelines.beam_options import OptionsError, pipeline_options

    try:
        pipeline_options(beam_args, AUDIT_FLAGS, own=p._option_string_actions)
    except OptionsError as e:
        p.error(str(e))


def _config(a: argparse.Namespace, beam_args: list[str]) -> AuditConfig:
    """The parsed flags as the runner's AuditConfig."""
    from audit.runner import AuditConfig  # Beam: after parsing (see the imports)

    return AuditConfig(
        data=tuple(a.data or ()),
        out=a.out,
        run=a.run,
        hosts=a.hosts,
        steps=a.steps,
        global_batch_size=a.global_batch_size,
        seed=a.seed,
        weights=a.weights,
        order=a.order,
        contamination=ContaminationConfig(a.heldout_sample_docs, a.train_sample_docs, a.max_ngram_rate),
        mixture=MixtureConfig(a.mixture_tolerance),
        brute_force_limit=a.brute_force_limit,
        data_checks=a.data_checks,
        beam_args=tuple(beam_args),
        eval_leakage=EvalLeakageConfig(
            a.eval_tasks, DetectorConfig(mode=a.eval_leakage_mode, threshold=a.eval_leakage_threshold)
        ),
    )


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    cfg = parse_args(argv)
    return run_main(lambda: _main(cfg, started, argv), STOPPED_BY_VERDICT_COMMAND)


def _main(cfg: AuditConfig, started: float | None = None, argv: list[str] | None = None) -> int:
    from audit.engine import DryRun  # Beam (see the imports)
    from audit.runner import run_audit, write_outputs

    check_out_dir(cfg.out, own=AUDIT_REPORT)  # before any work: an audit that cannot write its report does not run
    try:
        results, meta = run_audit(cfg)
    except DryRun as e:
        print(e)
        return 0
    except Refused:
        raise
    except OSError as e:  # a file missing, unreadable, or a directory where a file belongs
        raise InputError(f"cannot read the input: {e}") from None
    meta["run_facts"] = run_facts("audit", started if started is not None else time.time(), argv)
    html_path, json_path = write_outputs(results, meta, cfg.out)
    for r in results:
        print(f"[{r.status:>7}] {r.title}: {r.summary}")
        for part, why in r.not_run.items():
            if part != r.name:
                print(f"{'':>10}not run: {part}: {why}")
    for _, title, reason, number in report.info_rows(results):  # reported, not gated: said so
        print(f"[{'info':>7}] {title}: {number}; {reason}")
    failed = [r.name for r in results if r.passed is False]
    print(f"report: {html_path}\nverdicts: {json_path}")
    block = meta.get("data_checks") or {}
    if block.get(datachecks.SHA256):  # what a later --data-checks reuse:PATH@SHA256 can pin
        print(f"data checks sha256: {block[datachecks.SHA256]}")
    elif block.get("reused_from"):
        src = block["reused_from"]
        print(f"data checks taken from {src['path']} (sha256 {src[datachecks.SHA256]})")
    if next_step := partial.next_command(results, meta["run_facts"].get("command")):
        print(next_step)
    if failed:
        print(f"audit FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


class InputError(Refused, OSError):
    """An input file the audit could not read (one line, exit 2)."""


if __name__ == "__main__":
    sys.exit(main())
