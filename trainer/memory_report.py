"""The figures of ``trainer.compile``: a step's per-device memory as the TPU compiler plans it,
the device's capacity as the compiler sees it, and the words that report them.

Pure helpers (the text, the verdict, the parsing of the compiler's out-of-memory message) and
thin wrappers around ``jax.jit(...).lower(...).compile()``.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.metadata
import math
import re
import time
from typing import Any

import numpy as np

GIB = 2**30
HBM_RESOLUTION = 2**20
HBM_SOURCE = (
    "the TPU compiler itself: the largest output a one-device probe program may have and still compile "
    "for this device kind (bisected to 1 MiB; the compiler's out-of-memory message calls it "
    "'available HBM')"
)
LEVERS = (
    "microbatches=N (gradient accumulation: same global batch and data, 1/N of the rows per device at a time)",
    "model_overrides.remat=true (recompute each block in the backward pass)",
    "loss_chunk=1024 (no full float32 [G, T, V] logits)",
    "model_overrides.attention_chunk=1024 (no full [T, T] attention scores)",
    "more devices: a larger topology or --num_slices N",
)


@dataclasses.dataclass(frozen=True)
class StepMemory:
    """One compiled step: ``bytes`` {arguments, outputs, temporaries, aliased, generated_code,
    peak} per device (None where the compiler refused it), compile ``seconds``, and the
    compiler's ``error`` text when it refused (RESOURCE_EXHAUSTED)."""

    bytes: dict[str, int] | None
    seconds: float
    error: str | None = None

    def fits(self, capacity: int) -> bool:
        return self.error is None and self.bytes is not None and self.bytes["peak"] <= capacity


def remat_name(value: Any) -> str:
    """The config's remat as the policy names say it: true/false are full/none."""
    return {True: "full", False: "none"}.get(value, str(value)) if isinstance(value, bool) else str(value)


def shard_bytes(tree: Any) -> int:
    """Bytes one device holds of a pytree of ShapeDtypeStructs with shardings (the largest shard)."""
    import jax  # JAX after trainer.compile's environment (it imports this module first)

    return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _resource_exhausted(e: Exception) -> bool:
    return "RESOURCE_EXHAUSTED" in str(e)


def compile_step(jitted: Any, args: tuple) -> StepMemory:
    """Lowers and compiles ``jitted`` for ``args`` (abstract, with shardings); a RESOURCE_EXHAUSTED
    from the compiler is a result (the step does not fit), any other error is raised."""
    from jax.errors import JaxRuntimeError  # JAX after trainer.compile's environment (it imports this module first)

    t0 = time.perf_counter()
    try:
        compiled = jitted.lower(*args).compile()
    except JaxRuntimeError as e:
        if not _resource_exhausted(e):
            raise
        return StepMemory(None, time.perf_counter() - t0, str(e))
    seconds = time.perf_counter() - t0
    m = compiled.memory_analysis()
    return StepMemory(
        {
            "arguments": m.argument_size_in_bytes,
            "outputs": m.output_size_in_bytes,
            "temporaries": m.temp_size_in_bytes,
            "aliased": m.alias_size_in_bytes,
            "generated_code": m.generated_code_size_in_bytes,
            "peak": m.peak_memory_in_bytes,
        },
        seconds,
    )


def compiler_hbm_bytes(device: Any) -> int:
    """The memory the TPU compiler lets one program use on ``device``'s kind (see HBM_SOURCE)."""
    import jax  # JAX after trainer.compile's environment (it imports this module first)
    import jax.numpy as jnp
    from jax.errors import JaxRuntimeError
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    sharding = NamedSharding(Mesh(np.asarray([device]), ("x",)), PartitionSpec())
    arg = jax.ShapeDtypeStruct((), jnp.uint8, sharding=sharding)

    def compiles(n: int) -> bool:
        try:
            jax.jit(lambda x: jnp.broadcast_to(x, (n,)) + 1, out_shardings=sharding).lower(arg).compile()
            return True
        except JaxRuntimeError as e:
            if _resource_exhausted(e):
                return False
            raise

    lo, hi = 0, 2**42  # 4 TiB: more than any TPU's HBM
    while hi - lo > HBM_RESOLUTION:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if compiles(mid) else (lo, mid)
    return lo


UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
DUMP_MODULES = "jit_(step_fn|eval_fn)"  # the train and eval steps (trainer.step)


def dump_flags(directory: str) -> str:
    """XLA_FLAGS that make the TPU compiler write its buffer assignment (with a memory-usage
    report) for the two steps only, into ``directory``."""
    return f"--xla_dump_to={directory} --xla_dump_hlo_module_re={DUMP_MODULES}"


def largest_buffers(report: str, n: int = 5) -> list[dict[str, Any]]:
    """The ``n`` largest allocations of the default memory space (HBM) from XLA's
    ``*memory-usage-report.txt``: [{"bytes", "shapes"}] (several values may share one allocation)."""
    out = []
    for line in report.split("Memory Space:")[1].splitlines() if "Memory Space:" in report else []:
        m = re.match(r"\s*[\d.]+\w+\(\s*\d+%\);\s*([\d.]+)(\w+);\s*\d+;\s*\d+;\s*(.+)$", line)
        if m and m.group(2) in UNITS:
            out.append({"bytes": int(float(m.group(1)) * UNITS[m.group(2)]), "shapes": m.group(3).strip()})
        elif out and not line.strip():
            break
        if len(out) == n:
            break
    return out


def dumped_report(directory: str, function: str) -> str:
    """The memory-usage report XLA dumped for the jitted ``function`` ("step_fn", "eval_fn"); "" if none."""
    paths = sorted(glob.glob(f"{directory}/*jit_{function}*memory-usage-report.txt"))
    return open(paths[-1]).read() if paths else ""


def required_from_error(error: str) -> str | None:
    """'18.50G' from the compiler's 'memory required for HLO temporaries (18.50G)'."""
    m = re.search(r"required for [^(]*\(([\d.]+[KMGT]?)\)", error)
    return m.group(1) if m else None


def scoped_vmem_from_error(error: str) -> tuple[str, str] | None:
    """('17.38M', '16.00M') from a kernel's scoped VMEM refusal ('Scoped allocation with size 17.38M
    and limit 16.00M', e.g. CompileTimeScopedVmemOom): on-chip scratch, not HBM."""
    m = re.search(r"[Ss]coped allocation with size ([\d.]+[KMGT]?) and limit ([\d.]+[KMGT]?)", error)
    return (m.group(1), m.group(2)) if m else None


VMEM_LEVERS = (
    "libtpu_flags: {xla_tpu_scoped_vmem_limit_kib: N} (raise the kernels' scoped VMEM limit above the "
    "allocation the compiler names)",
    "smaller splash blocks (model_overrides.splash_block_q / splash_block_kv)",
)


def gib(n: float | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f} GiB"


def not_fitting_message(r: dict[str, Any]) -> str:
    """One message: which step, peak vs capacity, the compiler's largest buffers, the levers."""
    cap = r["hbm_bytes_per_device"]
    parts = []
    vmem = False
    for name, key, err in (
        ("train", "per_device_bytes", "compiler_error"),
        ("eval", "eval_per_device_bytes", "eval_compiler_error"),
    ):
        scoped = scoped_vmem_from_error(r[err]) if r.get(err) else None
        if scoped:  # a kernel's on-chip scratch, not HBM: the HBM levers would not help
            vmem = True
            parts.append(
                f"a kernel of the {name} step needs {scoped[0]}iB of scoped VMEM (on-chip scratch, not HBM), "
                f"the compiler's limit is {scoped[1]}iB"
            )
        elif r.get(err):
            need = required_from_error(r[err])
            parts.append(
                f"the {name} step needs {need + 'iB' if need else 'more'} per device (the compiler's "
                f"RESOURCE_EXHAUSTED), capacity {gib(cap)}"
            )
            biggest = r.get(("" if name == "train" else "eval_") + "largest_buffers")
            if biggest:
                parts.append(
                    "largest buffers: " + "; ".join(f"{gib(b['bytes'])} {b['shapes'][:80]}" for b in biggest[:3])
                )
        elif r.get(key) and r[key]["peak"] > cap:
            parts.append(f"the {name} step's peak is {gib(r[key]['peak'])} per device, capacity {gib(cap)}")
    where = f"{r['topology']} x {r['num_slices']} slice(s), {r['devices']} x {r['device_kind']}"
    levers = VMEM_LEVERS if vmem else LEVERS
    return f"{r['model']} does not fit {where}: " + "; ".join(parts) + ". Levers: " + "; ".join(levers)


def table(r: dict[str, Any]) -> str:
    """The short human table printed by trainer.compile."""
    rows = ("arguments", "outputs", "temporaries", "aliased", "peak")
    steps = [("train step", r.get("per_device_bytes"), r.get("compile_seconds"))]
    if "eval_compile_seconds" in r:
        steps.append(("eval step", r.get("eval_per_device_bytes"), r.get("eval_compile_seconds")))
    head = (
        f"{r['model']} ({r['params'] / 1e9:.3f}B params) on {r['topology']} x {r['num_slices']} slice(s): "
        f"{r['devices']} devices ({r['device_kind']}), {r['hosts']} host(s), mesh {r['mesh']}\n"
        f"seq_len {r['seq_len']}, global batch {r['global_batch_size']} ({r['rows_per_device']:g} rows per "
        f"device in {r['microbatches']} microbatch(es)), attention {r['attention_impl']}, remat {r['remat']}, "
        f"attention_chunk {r['attention_chunk']}, loss_chunk {r['loss_chunk']}, {r['compute_dtype']} compute / "
        f"{r['param_dtype']} params"
    )
    lines = [head, f"{'per device':<22}" + "".join(f"{s[0]:>16}" for s in steps)]
    for k in rows:
        lines.append(f"{k:<22}" + "".join(f"{gib(s[1][k]) if s[1] else 'RESOURCE_EXH.':>16}" for s in steps))
    lines.append(f"{'compile':<22}" + "".join(f"{s[2]:>14.1f} s" for s in steps))
    st = r["state_bytes_per_device"]
    lines += [
        f"{'params + opt state':<22}{gib(st['params'] + st['optimizer_state']):>16}   (from shapes and shardings)",
        f"capacity {gib(r['hbm_bytes_per_device'])} per device (the TPU compiler's; see hbm_source)",
        f"model FLOPs per step {r['model_flops_per_step']:.4g} (model.flops)",
        f"fits: {'yes' if r['fits'] else 'NO'}",
    ]
    for name, key in (("train", "largest_buffers"), ("eval", "eval_largest_buffers")):
        if r.get(key):
            lines.append(f"largest {name}-step buffers (XLA's buffer assignment):")
            lines += [f"  {gib(b['bytes']):>12}  {b['shapes'][:100]}" for b in r[key]]
    return "\n".join(lines)


def libtpu_version() -> str:
    try:
        return importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def versions() -> dict[str, str]:
    import jax  # JAX after trainer.compile's environment (it imports this module first)

    return {"jax": jax.__version__, "libtpu": libtpu_version()}
