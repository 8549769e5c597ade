"""Grain loader: mixture plan, global shuffle, disjoint host slices, O(1) exact resume.

from dataloader import LoaderConfig, make_loader
it = make_loader(LoaderConfig(data=["out/sample/manifest.json"], global_batch_size=8))
batch = next(it)   # tokens/segment_ids/positions/loss_mask int32 [G/H, T]; index/example int64 [G/H]

Importing a submodule (``dataloader.plan``, ``.hosts``, ``.olmo_order``: what the audit and
``compare`` read) does not import the loader: its names below are loaded on first use
(PEP 562), so that Grain and the JAX it imports stay out of a command that only needs the plan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dataloader.loader import DataIterator, HostSliceSampler, LoaderConfig, batch_fields, make_loader

__all__ = ["DataIterator", "HostSliceSampler", "LoaderConfig", "batch_fields", "make_loader"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from dataloader import loader  # Grain and JAX on first use, not with every submodule (the docstring)

        return getattr(loader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
