"""Grain loader: mixture plan, global shuffle, disjoint host slices, O(1) exact resume.

from dataloader import LoaderConfig, make_loader
it = make_loader(LoaderConfig(data=["out/sample/manifest.json"], global_batch_size=8))
batch = next(it)   # tokens/segment_ids/positions/loss_mask int32 [G/H, T]; index/example int64 [G/H]
"""

from dataloader.loader import DataIterator, HostSliceSampler, LoaderConfig, batch_fields, make_loader

__all__ = ["DataIterator", "HostSliceSampler", "LoaderConfig", "batch_fields", "make_loader"]
