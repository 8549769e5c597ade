"""What context parallelism (``mesh.context`` > 1) cannot run: checked when a config loads."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from model import ModelConfig


def context_refusal(C: int, seq_len: int | None, loss_chunk: int, model: ModelConfig) -> str | None:
    """Why ``mesh.context`` cannot run this config (None: it can, or it is 1): a seq_len that does
    not cut into 2 x context chunks, the full-logits loss (``loss_chunk: 0``; the chunked loss runs
    over each device's own positions), the model's ``seq_chunk`` (its chunks would cut across the
    devices' positions), tokamax's splash kernel (context parallelism runs JAX's). ``C`` is
    ``mesh.context``; the config's fields come as values (the schema imports this module)."""
    if C == 1:
        return None
    if seq_len is not None and seq_len % (2 * C):
        return (
            f"mesh.context={C} needs seq_len divisible by 2 x context = {2 * C} (the zig-zag layout's chunks); "
            f"seq_len {seq_len} is not"
        )
    if not loss_chunk:
        return (
            f"mesh.context={C} runs the chunked loss: loss_chunk=0 (full logits) is not supported; set loss_chunk > 0"
        )
    if model.seq_chunk is not None:
        return (
            f"mesh.context={C} with model_overrides.seq_chunk={model.seq_chunk}: each device already holds "
            "seq_len / context positions; set model_overrides.seq_chunk=null"
        )
    if model.splash_kernel != "jax":
        return f"mesh.context={C} runs JAX's splash kernel: model_overrides.splash_kernel must be jax"
    return None
