"""Where a training step's device time goes, by phase, from a ``jax.profiler`` trace.

    python -m bench.mfu --profile DIR     # prints this table per config (and puts it in --out)

A trace's op events are named by their HLO instruction (``fusion.123``, ``convolution.4``); the
compiled step's HLO text gives each instruction the JAX name stack it came from
(``metadata={op_name="jit(step_fn)/…/transpose(jvp(Transformer))/…/Block/mlp/…/dot_general"}``).
The step opens a name scope per phase (``trainer.step``: ``lm_head_loss``, ``grad_accumulate``,
``optimizer_update``; ``model.attention``: ``attention_core``), autodiff keeps them on the
backward ops (inside ``transpose(…)``), and Flax puts the module path in: so each op's phase is a
pure function of its name stack (``phase_of``), and the table a sum (``phase_table``). The host gap
is the traced steps' wall time less the device's busy time (its ``XLA Modules`` line where the trace
has one, else the sum of op time).

Hand-written: the profiler hands out the events and the stacks (``jax.profiler.ProfileData``,
``Compiled.as_text``), and nothing in JAX, XProf or TensorBoard groups them into a training step's
phases programmatically (XProf's op profile needs its UI and groups by HLO category, not by phase).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

# The phases, in the order the table lists them.
PHASES = (
    "attention fwd",
    "attention bwd",
    "layer matmuls fwd",
    "layer matmuls bwd",
    "LM head + loss",
    "LM head + loss bwd",
    "gradient accumulation",
    "optimizer update",
    "embedding",
    "other layer ops fwd",
    "other layer ops bwd",
    "other",
)
HOST_GAP = "host gap (device idle)"

_INSTRUCTION = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*?metadata=\{[^}]*?op_name="([^"]*)"', re.M)
_MATMUL = re.compile(r"dot_general|einsum|->")
_EVENT_NAME = re.compile(r"^\s*%?([\w.\-]+)\s*=")
# ops whose events hold other ops' events (a loop, a branch, a call): counting them would count
# their bodies twice (the skip step's conditional, the microbatch and loss-chunk loops)
_CONTAINER = re.compile(r"[\]})]\s+(?:while|conditional|call)\(")


def event_op(event_name: str) -> tuple[str, bool]:
    """(HLO instruction name, whether it only contains other ops) of a trace event, whose name is
    the instruction's name (CPU traces) or its whole text, ``%fusion.7 = bf16[…] fusion(…), …`` (TPU)."""
    m = _EVENT_NAME.match(event_name)
    return (m.group(1) if m else event_name), bool(_CONTAINER.search(event_name))


def hlo_op_names(hlo_text: str) -> dict[str, str]:
    """{HLO instruction name: the JAX name stack (``op_name``) of its metadata} of a compiled module's
    text; instructions without metadata are left out."""
    return {m.group(1): m.group(2) for m in _INSTRUCTION.finditer(hlo_text)}


def phase_of(op_name: str, event_name: str = "") -> str:
    """The phase of an op from its name stack (and, failing that, its event name): pure.

    Scopes win over module paths (the loss and the optimizer hold dots too); ``transpose(`` in the
    stack marks autodiff's backward pass; a custom kernel named splash is attention wherever it sits."""
    stack = op_name or ""
    bwd = "transpose(" in stack
    if "optimizer_update" in stack:
        return "optimizer update"
    if "grad_accumulate" in stack:
        return "gradient accumulation"
    if "lm_head_loss" in stack:
        return "LM head + loss bwd" if bwd else "LM head + loss"
    kernel = event_name.lower()
    if "attention_core" in stack or "splash" in kernel or "splash" in stack.lower():
        # splash's backward kernels: splash_mqa_dkv_… (fused: dq too), splash_mqa_dq_…
        return "attention bwd" if bwd or any(k in kernel for k in ("bwd", "_dkv", "_dq")) else "attention fwd"
    if "/embed/" in stack or stack.endswith("/embed"):
        return "embedding"
    if "Block/" in stack or "/Transformer" in stack or "jvp(Transformer)" in stack:
        if _MATMUL.search(stack.rsplit("/Block/", 1)[-1]):
            return "layer matmuls bwd" if bwd else "layer matmuls fwd"
        return "other layer ops bwd" if bwd else "other layer ops fwd"
    return "other"


def phase_table(
    events: Iterable[tuple[str, float, str]],
    op_names: Mapping[str, str],
    steps: int,
    wall_ns: float | None = None,
    busy_ns: float | None = None,
) -> list[dict]:
    """Rows (phase, ms per step, share of the step) from op events ``(name, duration ns, detail)``
    of ``steps`` traced steps. With ``wall_ns`` (the traced steps' wall time) the shares are of the
    wall time and a host-gap row is added: ``wall − busy`` (``busy_ns``: the device's module time,
    else the ops' sum); without it, shares of the ops' sum."""
    totals = dict.fromkeys(PHASES, 0.0)
    for event_name, ns, _ in events:
        name, container = event_op(event_name)
        if not container:
            totals[phase_of(op_names.get(name, ""), name)] += ns
    op_sum = sum(totals.values())
    busy = op_sum if busy_ns is None else busy_ns
    ms = {p: totals[p] / steps / 1e6 for p in PHASES}
    if wall_ns is not None:
        ms[HOST_GAP] = max(wall_ns - busy, 0.0) / steps / 1e6
    whole = (wall_ns if wall_ns is not None else op_sum) / steps / 1e6 or 1.0
    return [{"phase": p, "ms_per_step": t, "share": t / whole} for p, t in ms.items()]


def format_table(rows: list[dict]) -> str:
    """The Markdown table bench/RESULTS.md records."""
    lines = ["| phase | ms / step | share |", "|---|---|---|"]
    lines += [f"| {r['phase']} | {r['ms_per_step']:.1f} | {r['share']:.1%} |" for r in rows if r["ms_per_step"] > 0]
    return "\n".join(lines)
