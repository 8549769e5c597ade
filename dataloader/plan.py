"""The mixture plan: how many examples each source contributes per epoch (pure, no I/O).

A plan is a list of N slots; slot `i` names one (source, record) pair. It is never
materialised: sources own contiguous slot ranges `[offsets[s], offsets[s+1])`, so
slot → (source, record) is a binary search over S+1 offsets plus integer arithmetic.

Per-epoch counts (`counts[s]`): each source's share of *tokens* (non-PAD tokens, the
manifest's `tokens.<split>`) matches its normalised weight. The epoch is as short as
possible while every source with a positive weight is read at least once in full: the
source with the largest tokens/weight ratio is read exactly once and the others are
repeated by `weight/tokens` in proportion — up to their `max_repetition`, beyond which
the weights cannot be met and `make_plan` raises. Exact rational arithmetic
(`fractions.Fraction`) plus the largest-remainder rule make the rounding deterministic
and make the counts sum exactly to the rounded total.

Within a source, slot k (0 ≤ k < counts[s]) reads record `k mod R` for the whole passes
(`counts[s] // R` of them) and, for the final partial pass of `q = counts[s] mod R`
records, the evenly spread records `(k' * R) // q` so that a partial pass samples the
whole source rather than its first shards.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from fractions import Fraction

import numpy as np

from contract import SPLITS
from dataloader import order as order_lib

# `example` ids pack (source ordinal, record ordinal) as `source << RECORD_BITS | record`.
RECORD_BITS = 40
# The rule of `epoch_counts` and `Plan.locate` (token shares, largest remainder, evenly spread
# partial pass), recorded in the fingerprint: bump the version whenever their output changes.
PLAN_RULE = {"algorithm": "token-share/largest-remainder/spread-partial-pass", "version": 1}
DEFAULT_ORDERS = {"train": order_lib.TRAIN_ORDER, "heldout": order_lib.HELDOUT_ORDER}


@dataclasses.dataclass(frozen=True)
class SourceSpec:
    """One source of one split, as the plan sees it (read from a manifest).

    ordinal: the source's position over all manifests, in `LoaderConfig.data` order and
      each manifest's source order (the `source_ordinal` of `example` ids).
    records: examples of this split in the source's shards.
    tokens: non-PAD tokens in those examples.
    """

    name: str
    ordinal: int
    records: int
    tokens: int
    weight: float
    max_repetition: float


@dataclasses.dataclass(frozen=True)
class Plan:
    """Per-epoch slot counts of each source; `size` slots in all.

    order: the position → slot function the stream uses (part of the fingerprint).
    offsets: int64 [S+1], offsets[s] = first slot of source s, offsets[S] = size.
    """

    sources: tuple[SourceSpec, ...]
    counts: tuple[int, ...]
    split: str
    fingerprint: str
    order: order_lib.Order = order_lib.TRAIN_ORDER
    offsets: np.ndarray = dataclasses.field(repr=False, compare=False, default=None)  # type: ignore[arg-type]  # __post_init__ sets it

    def __post_init__(self) -> None:
        offsets = np.zeros(len(self.counts) + 1, dtype=np.int64)
        np.cumsum(np.asarray(self.counts, dtype=np.int64), out=offsets[1:])
        object.__setattr__(self, "offsets", offsets)

    @property
    def size(self) -> int:
        return int(self.offsets[-1])

    def locate(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Slot ids int64 [n] → (source index int64 [n], record ordinal int64 [n])."""
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size and (slots.min() < 0 or slots.max() >= self.size):
            raise IndexError(f"plan slot out of range [0, {self.size})")
        src = np.searchsorted(self.offsets, slots, side="right") - 1
        k = slots - self.offsets[src]
        records = np.array([s.records for s in self.sources], dtype=np.int64)[src]
        counts = np.asarray(self.counts, dtype=np.int64)[src]
        whole = (counts // records) * records  # slots covered by whole passes
        rem = np.maximum(counts - whole, 1)  # size of the partial pass (guarded)
        in_whole = k < whole
        rec = np.where(in_whole, k % records, ((k - whole) * records) // rem)
        return src, rec

    def example_ids(self, src: np.ndarray, rec: np.ndarray) -> np.ndarray:
        """(source index, record) → int64 `source_ordinal << 40 | record`."""
        ordinals = np.array([s.ordinal for s in self.sources], dtype=np.int64)[src]
        return (ordinals << RECORD_BITS) | rec


def _max_repetition(value: float | None) -> float:
    """The mixture's max_repetition; absent/None means unlimited."""
    return float("inf") if value is None else float(value)


def _check_name(weights: Mapping[str, float], names: Sequence[str]) -> None:
    unknown = sorted(set(weights) - set(names))
    if unknown:
        raise ValueError(f"weights name unknown sources {unknown}; sources are {list(names)}")


def sources_from_manifests(
    manifests: Sequence[Mapping], split: str, weights: Mapping[str, float] | None = None
) -> tuple[SourceSpec, ...]:
    """Manifests (parsed JSON, in `data` order) → the split's sources with their weights.

    Weights come from each manifest's `mixture.sources[].weight`; `weights` overrides
    them by source name. Raises on duplicate names, unknown override names, mismatched
    seq_len/tokenizer between manifests, or a manifest/mixture source mismatch.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not manifests:
        raise ValueError("no manifests given (LoaderConfig.data is empty)")
    first = manifests[0]
    specs: list[SourceSpec] = []
    for m in manifests:
        for key in ("seq_len", "tokenizer"):
            if m[key] != first[key]:
                raise ValueError(f"manifests disagree on {key}: {m[key]!r} vs {first[key]!r}")
        mixture = {s["name"]: s for s in m.get("mixture", {}).get("sources", [])}
        for name, entry in m["sources"].items():
            if any(s.name == name for s in specs):
                raise ValueError(f"source {name!r} appears in more than one manifest")
            if name not in mixture:
                raise ValueError(f"manifest source {name!r} is missing from its mixture")
            split_info = entry["splits"][split]
            # a `split: heldout` source is never trained on: weight 0 in the training plan
            heldout_only = split == "train" and mixture[name].get("split") == "heldout"
            specs.append(
                SourceSpec(
                    name=name,
                    ordinal=len(specs),
                    records=int(split_info["examples"]),
                    tokens=int(entry["tokens"][split]),
                    weight=0.0 if heldout_only else float(mixture[name]["weight"]),
                    max_repetition=_max_repetition(mixture[name].get("max_repetition")),
                )
            )
    if weights is not None:
        _check_name(weights, [s.name for s in specs])
        specs = [dataclasses.replace(s, weight=float(weights.get(s.name, s.weight))) for s in specs]
    for s in specs:
        if s.weight < 0 or s.max_repetition <= 0:
            raise ValueError(
                f"source {s.name!r}: weight must be ≥ 0 and max_repetition > 0 (got {s.weight}, {s.max_repetition})"
            )
        if s.records and s.records >= 1 << RECORD_BITS:
            raise ValueError(f"source {s.name!r} has more than 2**{RECORD_BITS} records")
    return tuple(specs)


def _fingerprint(
    data_fingerprints: Sequence[str],
    split: str,
    sources: Sequence[SourceSpec],
    counts: Sequence[int],
    order: order_lib.Order,
) -> str:
    """sha256 of what defines the stream: data, split, per-source counts, and the versioned rules
    that turn them into examples (plan rule, order algorithm)."""
    blob = json.dumps(
        {
            "data": list(data_fingerprints),
            "split": split,
            "counts": [[s.name, int(n)] for s, n in zip(sources, counts)],
            "plan": PLAN_RULE,
            "order": order.to_json(),
        },
        sort_keys=True,
    ).encode()
    return hashlib.sha256(blob).hexdigest()


def epoch_counts(sources: Sequence[SourceSpec]) -> tuple[int, ...]:
    """Per-source examples per epoch (see module docstring). Raises when impossible."""
    active = [s for s in sources if s.weight > 0]
    if not active:
        raise ValueError("every source has weight 0: nothing to train on")
    for s in active:
        if s.records == 0 or s.tokens == 0:
            raise ValueError(f"source {s.name!r} has weight {s.weight} but no examples/tokens in this split")
    total_w = sum(Fraction(s.weight) for s in active)
    share = {s.name: Fraction(s.weight) / total_w for s in active}
    # Epoch token budget: the smallest one that reads every weighted source at least once.
    anchor = max(active, key=lambda s: (Fraction(s.tokens) / share[s.name], -s.ordinal))
    budget = Fraction(anchor.tokens) / share[anchor.name]
    exact: list[Fraction] = []
    for s in sources:
        if s.weight <= 0:
            exact.append(Fraction(0))
            continue
        repetition = budget * share[s.name] / s.tokens
        if s.max_repetition != float("inf") and repetition > Fraction(s.max_repetition):
            raise ValueError(
                f"cannot meet weight {s.weight} of source {s.name!r}: it would have to be repeated "
                f"{float(repetition):.3f}× per epoch but its max_repetition is {s.max_repetition} "
                f"(the epoch is sized so that {anchor.name!r}, {anchor.tokens} tokens at share "
                f"{float(share[anchor.name]):.4f}, is read once). Lower its weight, raise its "
                f"max_repetition, or add data."
            )
        exact.append(repetition * s.records)
    total = int(sum(exact) + Fraction(1, 2))  # round half up
    counts = [int(x) for x in exact]  # floor (all non-negative)
    order = sorted(range(len(sources)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return tuple(counts)


def make_plan(
    sources: Sequence[SourceSpec],
    data_fingerprints: Sequence[str],
    split: str = "train",
    order: order_lib.Order | None = None,
) -> Plan:
    """Sources → Plan. Train: weighted counts; heldout: every record exactly once, weights ignored.
    `order` defaults to the split's (`DEFAULT_ORDERS`)."""
    sources = tuple(sources)
    if split == "train":
        counts = epoch_counts(sources)
    elif split == "heldout":
        counts = tuple(s.records for s in sources)
        if sum(counts) == 0:
            raise ValueError("the held-out split has no examples")
    else:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    order = DEFAULT_ORDERS[split] if order is None else order
    return Plan(
        sources=sources,
        counts=counts,
        split=split,
        order=order,
        fingerprint=_fingerprint(data_fingerprints, split, sources, counts, order),
    )


def plan_from_manifests(
    manifests: Sequence[Mapping], split: str = "train", weights: Mapping[str, float] | None = None
) -> Plan:
    """Parsed manifests (in `data` order) + optional weight overrides → Plan."""
    sources = sources_from_manifests(manifests, split, weights)
    return make_plan(sources, [str(m.get("fingerprint", "")) for m in manifests], split)
