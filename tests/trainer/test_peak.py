"""log.peak_tflops_per_device: auto: the chip's published dense bf16 peak per device, looked up by
JAX's device_kind; an unknown kind gives no MFU and says why; a number overrides the table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer import peak
from trainer.config.schema import load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "kind, cores, tflops",
    [
        ("TPU v5 lite", 1, 197.0),  # v5e: one TensorCore per chip, one device per chip
        ("TPU v5", 2, 459.0),  # v5p: megacore, both TensorCores in one device
        ("TPU v5", 1, 229.5),  # v5p in split mode: a device is half a chip
        ("TPU v6 lite", 1, 918.0),  # v6e (Trillium)
        ("TPU7x", 1, 1153.5),  # Ironwood: 2,307 per chip, two devices per chip
    ],
)
def test_the_peak_per_device_is_the_chips_published_peak_over_its_devices(kind, cores, tflops):
    got = peak.lookup(kind, cores)
    assert got.tflops == tflops
    assert "https://cloud.google.com/tpu/docs/" in got.why and f"{tflops:g} TFLOP/s per device" in got.why


def test_an_unknown_device_gives_no_mfu_and_says_why():
    for kind in ("cpu", "NVIDIA H100 80GB HBM3", "TPU v9 turbo"):
        got = peak.lookup(kind, 1)
        assert got.tflops is None and repr(kind) in got.why and "log.peak_tflops_per_device" in got.why
        assert peak.mfu(100.0, got) is None
    unsure = peak.lookup("TPU7x", None)  # a two-core chip whose device does not say what it spans
    assert unsure.tflops is None and "num_cores" in unsure.why


def test_the_cpu_backend_has_no_peak_and_a_number_overrides_the_table():
    import jax

    cpu = peak.device_peak("auto", jax.devices("cpu")[0])
    assert cpu.tflops is None and "device kind 'cpu'" in cpu.why
    assert peak.resolve(250, "cpu", None).tflops == 250.0
    assert peak.resolve(100.0, "TPU v5 lite", 1).tflops == 100.0  # explicit beats the table
    assert peak.resolve(0.0, "TPU v5 lite", 1).tflops is None  # 0: no MFU
    assert peak.mfu(98.5, peak.lookup("TPU v5 lite", 1)) == 0.5


def test_auto_is_the_default_and_anything_but_auto_or_a_number_is_refused():
    assert load_config(None).log.peak_tflops_per_device == "auto"
    assert load_config(None, ["log.peak_tflops_per_device=197"]).log.peak_tflops_per_device == 197.0
    with pytest.raises(ValueError, match=r"log.peak_tflops_per_device='fast'; must be 'auto'"):
        load_config(None, ["log.peak_tflops_per_device=fast"])


def test_the_table_agrees_with_jaxs_own_chip_table():
    """JAX's Pallas TPU info (per TensorCore, internal) against the published per-chip figures:
    within 0.3% (JAX rounds v6e to 920 and TPU7x to 1155 per core)."""
    tpu_info = pytest.importorskip("jax._src.pallas.mosaic.tpu_info")
    for kind, chip in peak.CHIPS.items():
        version = tpu_info.chip_version_from_device_kind(kind)
        assert version is not None, kind
        assert version.num_physical_tensor_cores_per_chip == chip.tensorcores_per_chip, kind
        jax_chip = tpu_info._get_tpu_info_impl(version, 1).bf16_ops_per_second * chip.tensorcores_per_chip / 1e12
        assert jax_chip == pytest.approx(chip.tflops_per_chip, rel=3e-3), kind


LIBTPU_DEVICES = """
import json
from jax.experimental import topologies
out = {}
for name in ("v5e:2x2", "v5p:2x2x1", "v6e:2x2", "tpu7x:2x2x1"):
    d = topologies.get_topology_desc(topology_name=name, platform="tpu").devices
    out[name] = [len(d), d[0].device_kind, d[0].num_cores]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_libtpu_names_its_chips_as_the_table_does():
    """The device kinds and per-device TensorCores libtpu reports for real topologies (compiled
    against on the CPU machine, no chip needed): each kind is in the table, and per-device peaks
    times devices per chip give the chip's peak."""
    pytest.importorskip("libtpu", reason="the .[tpu] extra (libtpu) is not installed")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", LIBTPU_DEVICES], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    chips = {"v5e:2x2": 4, "v5p:2x2x1": 4, "v6e:2x2": 4, "tpu7x:2x2x1": 4}
    for name, (devices, kind, cores) in got.items():
        per_device = peak.lookup(kind, cores).tflops
        assert per_device * devices == pytest.approx(peak.CHIPS[kind].tflops_per_chip * chips[name]), name
    assert got["tpu7x:2x2x1"][:2] == [8, "TPU7x"] and got["v5e:2x2"][1] == "TPU v5 lite"
