"""Check 3 — mixture fidelity: per source, target weight vs planned share vs measured share of
training tokens, and repetition factors.

* target: the mixture weight, normalised over sources (what the researcher asked for);
* planned: the loader's plan (`dataloader.plan`): slots per epoch × non-PAD tokens per record;
* measured: non-PAD tokens actually consumed — from the run's data logs when `--run` is given,
  else from the positions the sharding proof brute-forced (if any). Tokens per example are
  exact: only the last record of a packing unit holds PAD, and the scan records those.
Fails when planned deviates from target by more than the rounding of whole records allows
(plus `tolerance`), when a source is repeated beyond its `max_repetition`, or when measured
deviates from planned beyond sampling noise (4σ of drawing that many examples) + tolerance.
"""

from __future__ import annotations

import dataclasses
import math

from dataloader.plan import Plan

from .checks import CheckResult, FailureList, result

NAME, TITLE = "mixture", "3. Mixture fidelity"
SIGMAS = 4.0  # measured-vs-planned allowance, in standard deviations of the sampling noise


@dataclasses.dataclass(frozen=True)
class MixtureConfig:
    tolerance: float = 0.005  # absolute share, on top of rounding / sampling allowances

    def __post_init__(self) -> None:
        if not 0 <= self.tolerance <= 1:  # NaN would pass every comparison: the gate switched off
            raise ValueError(f"mixture tolerance must be a finite share in [0, 1], got {self.tolerance!r}")


def planned_tokens(plan: Plan) -> list[float]:
    """Expected non-PAD tokens per epoch for each source: counts × mean tokens per record."""
    return [c * (s.tokens / s.records) if s.records else 0.0 for s, c in zip(plan.sources, plan.counts)]


def check_mixture(
    plan: Plan,
    cfg: MixtureConfig,
    measured_examples: dict[int, int] | None = None,
    measured_tokens: dict[int, int] | None = None,
    measured_from: str | None = None,
    seq_len: int | None = None,
) -> CheckResult:
    """measured_*: {source index in plan: examples / non-PAD tokens consumed}."""
    f = FailureList()
    total_w = sum(s.weight for s in plan.sources) or 1.0
    ptoks = planned_tokens(plan)
    ptotal = sum(ptoks) or 1.0
    mtotal = sum(measured_tokens.values()) if measured_tokens else 0
    n_examples = sum(measured_examples.values()) if measured_examples else 0
    rows = []
    for i, (s, count) in enumerate(zip(plan.sources, plan.counts)):
        target = s.weight / total_w
        planned = ptoks[i] / ptotal
        repetition = count / s.records if s.records else 0.0
        rounding = (s.tokens / s.records if s.records else 0) / ptotal  # one record's share
        if abs(planned - target) > rounding + cfg.tolerance:
            f.add(
                f"source {s.name}: planned share {planned:.4f} of training tokens differs from its "
                f"target weight {target:.4f} by more than one record's rounding + {cfg.tolerance}"
            )
        if repetition > s.max_repetition + 1e-12:
            f.add(f"source {s.name}: repeated {repetition:.3f}× per epoch, above max_repetition {s.max_repetition}")
        measured = None
        if measured_tokens is not None and mtotal:
            measured = measured_tokens.get(i, 0) / mtotal
            noise = math.sqrt(max(planned * (1 - planned), 0.0) / max(1, n_examples))
            allowed = SIGMAS * noise + cfg.tolerance
            if abs(measured - planned) > allowed:
                f.add(
                    f"source {s.name}: measured share {measured:.4f} ({measured_from}) differs from "
                    f"planned {planned:.4f} by more than {allowed:.4f} ({SIGMAS:g}σ sampling + "
                    f"{cfg.tolerance})"
                )
        rows.append(
            {
                "source": s.name,
                "target": target,
                "planned": planned,
                "measured": measured,
                "epoch_examples": int(count),
                "records": s.records,
                "repetition": repetition,
                "max_repetition": s.max_repetition,
                "measured_examples": (measured_examples or {}).get(i),
            }
        )
    src = f"; measured from {measured_from} ({n_examples} examples)" if measured_tokens else ""
    ok = (
        f"{len(rows)} sources: planned token shares match the target weights and repetition is "
        f"within max_repetition{src}"
    )
    not_run = {} if mtotal else {"measured_shares": "nothing measured: no run logs and no brute-forced positions"}
    return result(
        NAME,
        TITLE,
        f,
        ok,
        {"sources": rows, "plan_size": plan.size, "measured_from": measured_from, "measured_examples": n_examples},
        not_run=not_run,
    )
