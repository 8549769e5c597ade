"""Golden values of everything that defines the data stream, and the start-up self-check.

The stream is a pure function of (plan, seed, position): plan counts (`plan.epoch_counts`), slot →
record (`Plan.locate`), position → slot (`order`) and host slices (`hosts`). One of those is a
library's: the training order is Grain's `index_shuffle`, and a Grain release that changed it
would change the data under an unchanged config. So the plan fingerprint names the order and the
plan rule with their versions (`order.TRAIN_ORDER`, `plan.PLAN_RULE`), and before a loader starts
or a checkpoint's data state is accepted, `check_stream` recomputes the few values below. If any
differs, this code no longer computes the stream its fingerprints name (resuming would silently
read other data), and it raises `StreamChangedError` saying what changed.

The values were computed once (grain 0.2.18) and are the contract; tests/dataloader/test_golden.py
pins more of them. A deliberate change of any function above is a new stream: give it a new
version (a new `Order` or `PLAN_RULE` version) and golden values of its own.
"""

from __future__ import annotations

import functools
from importlib import metadata

import numpy as np

from contract import OLMO_CORE
from contract.errors import Refused
from dataloader import hosts, olmo_order, order
from dataloader import plan as plan_lib
from dataloader.plan import PLAN_RULE, SourceSpec

# order → ((N, seed, positions, slots), ...): positions in epoch 0, across an epoch boundary,
# far ahead (seek), and with the per-epoch seed wrapping around 2**32.
ORDER_GOLDEN: dict[order.Order, tuple[tuple[int, int, tuple[int, ...], tuple[int, ...]], ...]] = {
    order.TRAIN_ORDER: (
        (997, 5, (0, 1, 996, 997, 10**12), (544, 964, 910, 782, 603)),
        (1_000_003, 2**32 - 1, (0, 1_000_003, 123_456_789_012), (646826, 645888, 35909)),
        (724_000_000, 42, (0, 723_999_999, 5_000_000_000), (439108928, 552837252, 218783048)),
    ),
    order.HELDOUT_ORDER: ((5, 0, (0, 4, 5, 99), (0, 4, -1, -1)),),
}

# AI2's order (dataloader.olmo_order): numpy's PCG64 + Generator.shuffle, which numpy may change
# between releases like any library's. (N, seed, epoch) → (first 5, last 2) of the epoch's permutation.
OLMO_GOLDEN = (
    (10, 0, 1, (8, 4, 7, 0, 1), (6, 3)),
    (1000, 34521, 1, (905, 250, 414, 554, 333), (567, 787)),
    (1000, 34521, 2, (586, 379, 498, 271, 249), (289, 42)),
    (1_000_003, 7, 3, (566764, 871260, 286693, 276189, 24820), (821037, 731544)),
)

_INF = float("inf")
# A mixture whose counts need every part of the rule: one source read exactly once, fractional
# repetitions, a largest-remainder round-up, a zero-weight source, partial passes spread evenly.
PLAN_SOURCES = (
    SourceSpec("web", 0, 1000, 7_000_000, 0.6, _INF),
    SourceSpec("code", 1, 300, 2_000_000, 0.3, 4.0),
    SourceSpec("math", 2, 7, 50_000, 0.1, 100.0),
    SourceSpec("off", 3, 5, 100, 0.0, _INF),
)
PLAN_COUNTS = (1000, 525, 163, 0)
PLAN_SLOTS = (0, 999, 1000, 1299, 1300, 1301, 1524, 1525, 1531, 1532, 1687)
PLAN_LOCATED = ((0, 0), (0, 999), (1, 0), (1, 299), (1, 0), (1, 1), (1, 298), (2, 0), (2, 6), (2, 0), (2, 3))
# (step, G, h, H) → positions host h reads.
HOST_GOLDEN = (((5, 12, 2, 3), (68, 69, 70, 71)), ((0, 8, 0, 1), tuple(range(8))))


class StreamChangedError(Refused, RuntimeError):
    """This code (or a library it uses) no longer computes the data stream its fingerprints name."""


def _grain_version() -> str:
    try:
        return metadata.version("grain")
    except metadata.PackageNotFoundError:  # pragma: no cover - grain is a dependency
        return "unknown"


def stream_differences(spec: order.Order) -> list[str]:
    """What differs from the golden values, one line each (empty when nothing does)."""
    diffs = []
    if spec == OLMO_CORE:
        for n, seed, epoch, head, tail in OLMO_GOLDEN:
            perm = olmo_order.permutation(n, seed, epoch)
            got = (tuple(perm[: len(head)].tolist()), tuple(perm[-len(tail) :].tolist()))
            if got != (head, tail):
                diffs.append(
                    f"order {spec.to_json()} (numpy {np.__version__}): N={n}, seed={seed}, epoch={epoch} "
                    f"permutation starts {list(got[0])}, ends {list(got[1])}; expected {list(head)} … {list(tail)}"
                )
    elif spec not in ORDER_GOLDEN:
        return [f"order {spec.to_json()} has no golden values: its stream cannot be checked"]
    for n, seed, positions, expected in ORDER_GOLDEN.get(spec, ()):
        got = order.slots(spec, np.asarray(positions, np.int64), n, seed).tolist()
        if got != list(expected):
            diffs.append(
                f"order {spec.to_json()} (grain {_grain_version()}): N={n}, seed={seed}, "
                f"positions {list(positions)} give slots {got}, expected {list(expected)}"
            )
    counts = plan_lib.epoch_counts(PLAN_SOURCES)
    if counts != PLAN_COUNTS:
        diffs.append(f"plan rule {PLAN_RULE}: golden mixture counts {list(counts)}, expected {list(PLAN_COUNTS)}")
    else:
        src, rec = plan_lib.make_plan(PLAN_SOURCES, ["golden"]).locate(np.asarray(PLAN_SLOTS, np.int64))
        located = tuple(zip(src.tolist(), rec.tolist()))
        if located != PLAN_LOCATED:
            diffs.append(
                f"plan rule {PLAN_RULE}: slots {list(PLAN_SLOTS)} locate to (source, record) "
                f"{list(located)}, expected {list(PLAN_LOCATED)}"
            )
    for args, expected in HOST_GOLDEN:
        got = hosts.host_positions(*args).tolist()
        if got != list(expected):
            diffs.append(f"host slice (step, G, h, H)={args}: positions {got}, expected {list(expected)}")
    return diffs


@functools.cache
def check_stream(spec: order.Order = order.TRAIN_ORDER) -> None:
    """Raise StreamChangedError unless the golden values of `spec`, the plan rule and the host
    slices still hold (cached: once per process and order)."""
    diffs = stream_differences(spec)
    if diffs:
        raise StreamChangedError(
            "the data stream this code computes is not the one its plan fingerprints name, so "
            "resuming (or comparing with an earlier run) would silently read other data:\n  "
            + "\n  ".join(diffs)
            + "\nInstall the versions the golden values were made with (see pyproject.toml's pin on "
            "grain), or, for a deliberate change, give the order/plan rule a new version "
            "(dataloader/order.py, dataloader/plan.py) and golden values of its own."
        )
