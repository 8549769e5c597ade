"""The dense bf16 peak of the chip the run is on: the denominator of MFU (``log.peak_tflops_per_device``).

``auto`` (the default) looks the device up by ``jax.Device.device_kind`` in ``CHIPS``, whose figures
are Google Cloud's published per-chip peaks, each with the page it comes from. A device may be a
whole chip or one of its TensorCores: v5p's two TensorCores form one JAX device ("megacore"), an
Ironwood (TPU7x) chip shows as two devices. The per-device peak is therefore the chip's peak times
the share of the chip's TensorCores the device spans (``jax.Device.num_cores``). A kind that is
not in the table (a CPU, a GPU, a TPU generation added after this table) gives no MFU, with the
reason logged at start-up: never a guessed number. An explicit number in the config overrides the
lookup (0 = no MFU).

Pure functions (no JAX import): the trainer passes the device's ``device_kind`` and ``num_cores``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class ChipPeak:
    """A chip's published dense bf16 peak and how many TensorCores it has."""

    name: str
    tflops_per_chip: float
    tensorcores_per_chip: int
    source: str


# device_kind, as JAX reports it (jax._src.pallas.mosaic.tpu_info.chip_version_from_device_kind
# lists the same strings; libtpu's topologies name them so: "TPU v5 lite" for v5e:2x2, ...).
CHIPS: dict[str, ChipPeak] = {
    "TPU v5 lite": ChipPeak(
        "TPU v5e", 197.0, 1, "https://cloud.google.com/tpu/docs/v5e (Peak compute per chip (bf16))"
    ),
    "TPU v5": ChipPeak(
        "TPU v5p",
        459.0,
        2,
        "https://cloud.google.com/tpu/docs/v5p (Peak compute per chip (bf16); 2 TensorCores per chip)",
    ),
    "TPU v6 lite": ChipPeak(
        "TPU v6e (Trillium)", 918.0, 1, "https://cloud.google.com/tpu/docs/v6e (Peak compute per chip (bf16))"
    ),
    "TPU7x": ChipPeak(
        "TPU7x (Ironwood)",
        2307.0,
        2,
        "https://cloud.google.com/tpu/docs/tpu7x (Peak compute per chip (BF16); each chip contains two TensorCores)",
    ),
}


@dataclasses.dataclass(frozen=True)
class Peak:
    """The resolved denominator: ``tflops`` per device, or None with ``why`` (the start-up line)."""

    tflops: float | None
    why: str


def lookup(device_kind: str, cores_per_device: int | None) -> Peak:
    """The per-device dense bf16 peak of a device of this kind spanning ``cores_per_device``
    TensorCores (``jax.Device.num_cores``; None if the device does not say)."""
    chip = CHIPS.get(device_kind)
    if chip is None:
        return Peak(
            None,
            f"MFU not reported: device kind {device_kind!r} is not in trainer/peak.py's table of "
            f"published peaks ({', '.join(sorted(CHIPS))}); set log.peak_tflops_per_device to "
            "your chip's dense bf16 TFLOP/s per device",
        )
    if chip.tensorcores_per_chip == 1:
        cores = 1
    elif cores_per_device is None or not 1 <= cores_per_device <= chip.tensorcores_per_chip:
        return Peak(
            None,
            f"MFU not reported: a {chip.name} chip has {chip.tensorcores_per_chip} TensorCores and "
            f"the device does not say how many it spans (num_cores={cores_per_device!r}); set "
            "log.peak_tflops_per_device",
        )
    else:
        cores = cores_per_device
    tflops = chip.tflops_per_chip * cores / chip.tensorcores_per_chip
    share = (
        "" if cores == chip.tensorcores_per_chip else f" x {cores}/{chip.tensorcores_per_chip} TensorCores per device"
    )
    return Peak(
        tflops,
        f"MFU against {tflops:g} TFLOP/s per device: {chip.name}, {chip.tflops_per_chip:g} "
        f"TFLOP/s dense bf16 per chip{share} ({chip.source})",
    )


def resolve(setting: float | str, device_kind: str, cores_per_device: int | None) -> Peak:
    """``log.peak_tflops_per_device`` → the MFU denominator: a number > 0 as given, 0 = none, 'auto' = lookup."""
    if setting == AUTO:
        return lookup(device_kind, cores_per_device)
    value = float(setting)
    if value <= 0:
        return Peak(None, "MFU not reported: log.peak_tflops_per_device is 0")
    return Peak(value, f"MFU against {value:g} TFLOP/s per device (log.peak_tflops_per_device, as configured)")


def device_peak(setting: float | str, device: Any) -> Peak:
    """``resolve`` for a ``jax.Device`` (its kind and, on TPUs, its TensorCore count)."""
    return resolve(setting, str(getattr(device, "device_kind", "unknown")), getattr(device, "num_cores", None))


def mfu(tflops_per_device: float, peak: Peak) -> float | None:
    return None if peak.tflops is None else tflops_per_device / peak.tflops
