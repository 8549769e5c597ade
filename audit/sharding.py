"""Check 4 — sharding proof for H hosts over S steps (default: one full epoch).

The argument (why this streams in O(H) memory, whatever the epoch size):
  * Global batch b is the positions [b·G, (b+1)·G) (`dataloader.hosts`); host h reads the
    interval [b·G + lo_h, b·G + hi_h) with (lo_h, hi_h) = `hosts.host_slice(G, h, H)`.
    If, sorted by lo, the H intervals tile [0, G) — first starts at 0, each starts where the
    previous stops, the last stops at G — then within every batch the hosts' positions are
    pairwise disjoint and cover the batch, and the batch itself does not depend on H.
  * Within epoch e, position p maps to a slot by the run's data order, injective per epoch:
    Grain's `index_shuffle_e(p mod N)`, a permutation of [0, N) (`dataloader.order`), or
    OLMo-core's `perm_e[p mod E]` with E = G·(N // G) positions per epoch, a prefix of a
    permutation of [0, N) (`dataloader.olmo_order`; its last N mod G slots are not read that
    epoch). Either way distinct positions of one epoch are distinct slots: position disjointness
    + coverage ⇒ slot disjointness (+ coverage of the epoch's E slots).
    Each slot names a (source, record) pair; two slots name the same record only where the
    plan repeats a source, which the plan counts (mixture check) and the run check verifies.
So the proof checks interval tiling (a step's slices are step 0's shifted by step·G, so tiling
holds at every step or at none: the first and the last block of batches are checked, O(H·block)
whatever S is; S·G past int64 is refused), spot-checks that the loader's per-step `host_positions`
equals its interval, and — when S·G is small enough — brute-forces the slots of every audited
position (only those: `--steps N` costs N steps, not the plan's size) to confirm that hosts never
share a slot within an epoch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from contract import INDEX_SHUFFLE, Order, Refused
from dataloader import hosts
from dataloader.olmo_order import order_functions
from dataloader.plan import Plan

from .checks import CheckResult, FailureList, result

NAME, TITLE = "sharding", "4. Sharding proof"
STEP_BLOCK = 1024  # batches checked per vectorised block: memory O(H·STEP_BLOCK), not O(epoch)
SPOT_CHECK_STEPS = 16  # steps at which host_positions() is compared with its interval
MATRIX_MAX_HOSTS = 64  # the H×H matrix is stored densely up to this H, sparsely above


@dataclasses.dataclass(frozen=True)
class ShardingConfig:
    hosts: int
    global_batch_size: int
    seed: int = 0
    steps: int | None = None  # None: one full epoch, ceil(N / G)
    brute_force_limit: int = 1 << 16  # brute-force the slots when S·G is at most this
    order: Order = INDEX_SHUFFLE  # the data order (position → slot) the proof replays


def host_intervals(global_batch_size: int, process_count: int) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) int64 [H]: each host's [lo, hi) row interval inside a global batch."""
    pairs = [hosts.host_slice(global_batch_size, h, process_count) for h in range(process_count)]
    arr = np.asarray(pairs, dtype=np.int64).reshape(process_count, 2)
    return arr[:, 0].copy(), arr[:, 1].copy()


def pairwise_overlaps(lo: np.ndarray, hi: np.ndarray) -> dict[tuple[int, int], int]:
    """{(i, j): |[lo_i,hi_i) ∩ [lo_j,hi_j)|} for i < j with a non-empty intersection.

    Sweep over intervals sorted by start: O(H log H + number of overlapping pairs).
    """
    idx = np.lexsort((hi, lo))
    out: dict[tuple[int, int], int] = {}
    active: list[int] = []
    for i in idx.tolist():
        active = [j for j in active if hi[j] > lo[i]]
        for j in active:
            n = int(min(hi[i], hi[j]) - lo[i])
            if n > 0:
                out[(min(i, j), max(i, j))] = n
        active.append(i)
    return out


MAX_POSITION = (1 << 63) - 1  # positions are int64 (the loader's and the data logs')


class StepsRefused(Refused, ValueError):
    """--steps × G past the int64 positions (one line, exit 2)."""


def check_steps(steps: int, global_batch_size: int) -> None:
    """S·G positions must be int64 numbers (StepsRefused otherwise): the loader's positions are."""
    if steps * global_batch_size > MAX_POSITION:
        raise StepsRefused(
            f"--steps {steps} × global batch {global_batch_size} = {steps * global_batch_size} positions: past "
            f"the int64 positions the loader counts in (at most {MAX_POSITION // global_batch_size} steps)"
        )


def straddling(positions: int, per_epoch: int, g: int) -> int:
    """Pure: how many of the epoch boundaries k·per_epoch (k = 1 .. (positions − 1) // per_epoch)
    fall inside a global batch of `g`, i.e. are not multiples of g. Closed form (no loop over the
    epochs): k·per_epoch ≡ 0 (mod g) exactly when k is a multiple of g / gcd(per_epoch, g)."""
    k = (positions - 1) // per_epoch if positions > 0 else 0
    return k - k // (g // math.gcd(per_epoch, g))


def tiling_errors(starts: np.ndarray, stops: np.ndarray, base: np.ndarray, size: int) -> np.ndarray:
    """starts/stops int64 [B, H] absolute intervals of B batches, base int64 [B] batch starts.

    Returns bool [B]: True where the H intervals do not tile [base, base + size) exactly.
    """
    order_ = np.argsort(starts, axis=1, kind="stable")
    s = np.take_along_axis(starts, order_, axis=1)
    e = np.take_along_axis(stops, order_, axis=1)
    bad = (s[:, 0] != base) | (e[:, -1] != base + size) | np.any(e < s, axis=1)
    if s.shape[1] > 1:
        bad |= np.any(s[:, 1:] != e[:, :-1], axis=1)
    return bad


def brute_force_slots(
    plan: Plan,
    cfg: ShardingConfig,
    steps: int,
    lo: np.ndarray,
    hi: np.ndarray,
    f: FailureList,
    tokens_of: Callable[[int, np.ndarray], int] | None = None,
) -> dict:
    """Computes the slot of every audited position and checks, per epoch, that no two positions
    (hence no two hosts) share a slot and that complete epochs cover the plan. Only the audited
    positions' slots are computed (the order maps each position on its own) and only the slots
    read so far in the epoch are kept: memory O(S·G), bounded by `brute_force_limit`, whatever
    the plan's size N."""
    n, g, H = plan.size, cfg.global_batch_size, cfg.hosts
    fns = order_functions(cfg.order, g)
    assert fns is not None  # called for a known order only
    per_epoch = fns.epoch_positions(n)  # positions (= distinct slots) of one epoch
    shared = np.zeros((H, H), np.int64)
    owner: dict[int, int] = {}  # slot → the host that read it in the current epoch (≤ S·G entries)
    epoch = 0
    seen = 0
    total = steps * g
    host_of_row = np.empty(g, np.int64)
    src_examples: dict[int, int] = {}
    src_tokens: dict[int, int] = {}
    for h in range(H):
        host_of_row[lo[h] : hi[h]] = h
    for step in range(steps):
        pos = np.arange(step * g, (step + 1) * g, dtype=np.int64)
        slots = fns.slots(pos, n, cfg.seed)
        src, rec = plan.locate(slots)
        for s_i in np.unique(src).tolist():
            sel = rec[src == s_i]
            src_examples[s_i] = src_examples.get(s_i, 0) + int(sel.size)
            src_tokens[s_i] = src_tokens.get(s_i, 0) + (tokens_of(s_i, sel) if tokens_of else 0)
        for p, slot, h in zip(pos.tolist(), slots.tolist(), host_of_row.tolist()):
            e = p // per_epoch
            if e != epoch:
                if seen != per_epoch:
                    f.add(f"epoch {epoch}: {seen} distinct slots read, the epoch has {per_epoch}")
                owner.clear()
                epoch, seen = e, 0
            if slot in owner:
                shared[owner[slot], h] += 1
                f.add(
                    f"step {step}: slot {slot} (position {p}, host {h}) was already read in epoch "
                    f"{e} by host {owner[slot]}"
                )
            else:
                owner[slot] = h
                seen += 1
    complete = total // per_epoch
    if complete and total % per_epoch == 0 and seen != per_epoch:
        f.add(f"epoch {epoch}: {seen} distinct slots read, the epoch has {per_epoch}")
    return {
        "positions": total,
        "shared_slots_matrix": shared.tolist() if H <= MATRIX_MAX_HOSTS else None,
        "shared_slots": int(shared.sum()),
        "source_examples": src_examples,
        "source_tokens": src_tokens,
    }


def _overlaps_and_tiling(lo: np.ndarray, hi: np.ndarray, steps: int, g: int, f: FailureList) -> tuple[dict, int]:
    """(the pairs of hosts whose slices overlap: rows of every global batch, the steps whose slices do
    not tile the global batch); each a finding in `f`."""
    overlaps = pairwise_overlaps(lo, hi)
    for (i, j), k in sorted(overlaps.items())[:10]:
        f.add(
            f"hosts {i} and {j} both read {k} rows of every global batch "
            f"(rows [{max(lo[i], lo[j])}, {min(hi[i], hi[j])})), first at step 0"
        )
    tiling_bad = False
    # A step's slices are step 0's shifted by step·G, so tiling holds at every step or at none:
    # the first and the last block are checked (the last: the largest positions), whatever S is.
    for b0 in sorted({0, max(0, steps - STEP_BLOCK)}):
        b = np.arange(b0, min(steps, b0 + STEP_BLOCK), dtype=np.int64)
        base = b * g
        bad = tiling_errors(base[:, None] + lo[None, :], base[:, None] + hi[None, :], base, g)
        if bad.any():
            tiling_bad = True
            first = int(b[np.argmax(bad)])
            f.add(
                f"step {first}: host slices do not tile global batch [{first * g}, {(first + 1) * g}) (overlap or gap)"
            )
    return overlaps, steps if tiling_bad else 0  # shift-invariant: every step fails when one does


def _spot_check(lo: np.ndarray, hi: np.ndarray, steps: int, g: int, H: int, f: FailureList) -> list[int]:
    """The steps at which every host's hosts.host_positions() is compared with its slice's interval
    (a finding in `f` where it is not)."""
    spot = sorted({0, steps - 1, *np.linspace(0, steps - 1, SPOT_CHECK_STEPS).astype(int).tolist()})
    for step in spot:
        for h in range(H):
            got = hosts.host_positions(step, g, h, H)
            want_lo, want_hi = step * g + lo[h], step * g + hi[h]
            if got.size != want_hi - want_lo or (got.size and (got[0] != want_lo or np.any(np.diff(got) != 1))):
                f.add(
                    f"step {step}, host {h}: host_positions() is not the interval "
                    f"[{want_lo}, {want_hi}) of host_slice()"
                )
    return spot


def _overlap_matrix(lo: np.ndarray, hi: np.ndarray, steps: int, H: int, overlaps: dict) -> np.ndarray | None:
    """Positions read by host i and host j over the steps (the diagonal: what each host read); None
    past MATRIX_MAX_HOSTS hosts."""
    if H > MATRIX_MAX_HOSTS:
        return None
    matrix = np.diag((hi - lo) * steps)
    for (i, j), k in overlaps.items():
        matrix[i, j] = matrix[j, i] = k * steps
    return matrix


def check_sharding(
    plan: Plan, cfg: ShardingConfig, tokens_of: Callable[[int, np.ndarray], int] | None = None
) -> CheckResult:
    """Check 4 (module doc): the hosts' slices of S steps of G positions. Named steps: the topology
    and the order as the loader takes them, the overlaps and tiling (`_overlaps_and_tiling`), the
    spot check of host_positions (`_spot_check`), the overlap matrix, the slots brute-forced
    (brute_force_slots) within the budget."""
    g, H, n = cfg.global_batch_size, cfg.hosts, plan.size
    f = FailureList()
    try:
        lo, hi = host_intervals(g, H)
    except ValueError as e:
        f.add(f"topology G={g}, H={H} rejected by the loader: {e}")
        return result(NAME, TITLE, f, "", {"hosts": H, "global_batch_size": g})
    fns = order_functions(cfg.order, g)
    try:
        per_epoch = fns.epoch_positions(n) if fns else n  # unknown order: no slots to replay
    except ValueError as e:  # the olmo-core order needs N ≥ G
        f.add(f"the data order {cfg.order.name} cannot apply to this plan: {e}")
        return result(NAME, TITLE, f, "", {"hosts": H, "global_batch_size": g})
    steps = cfg.steps if cfg.steps is not None else -(-per_epoch // g)
    check_steps(steps, g)
    overlaps, uncovered = _overlaps_and_tiling(lo, hi, steps, g, f)
    spot = _spot_check(lo, hi, steps, g, H, f)
    matrix = _overlap_matrix(lo, hi, steps, H, overlaps)
    figures = {
        "hosts": H,
        "global_batch_size": g,
        "steps": steps,
        "positions": steps * g,
        "plan_size": n,
        "epochs": steps * g / per_epoch,
        "seed": cfg.seed,
        "order": {"name": cfg.order.name, "version": cfg.order.version},
        "overlapping_positions": int(sum(overlaps.values()) * steps),
        "uncovered_steps": uncovered,
        "steps_straddling_epochs": straddling(steps * g, per_epoch, g),
        "overlap_matrix": matrix.tolist() if matrix is not None else None,
        "overlap_pairs": [[i, j, k * steps] for (i, j), k in sorted(overlaps.items())[:100]],
        "spot_checked_steps": len(spot),
        "brute_force": None,
    }
    not_run = {}
    if fns is None:
        not_run["brute_force"] = (
            f"the data order {cfg.order.name} v{cfg.order.version} is unknown to this audit: slots cannot be replayed"
        )
    elif steps * g <= cfg.brute_force_limit:
        figures["brute_force"] = brute_force_slots(plan, cfg, steps, lo, hi, f, tokens_of)
    else:
        not_run["brute_force"] = (
            f"S·G = {steps * g} positions > brute_force_limit {cfg.brute_force_limit}: "
            f"slot disjointness rests on the order ({cfg.order.name}) being injective per epoch"
        )
    how = (
        "slots brute-forced: no slot read twice in an epoch"
        if figures["brute_force"]
        else f"slot disjointness follows from the order ({cfg.order.name}) being injective per epoch"
    )
    ok = (
        f"{H} hosts × {steps} steps ({steps * g} positions, {figures['epochs']:.3g} epochs): "
        f"0 overlapping positions, every global batch covered; {how}"
    )
    return result(NAME, TITLE, f, ok, figures, not_run=not_run)
