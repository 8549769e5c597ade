"""`python -m bench.attention --tiny` runs every section end to end on CPU (splash interpreted) and
writes the JSON the chip run writes; the timings themselves are not asserted (CPU, tiny shapes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import fast_compile

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.ci_extra  # a minute of make test's 12: CI runs it in make test-extra
@pytest.mark.slow
def test_attention_benchmark_runs_every_section_and_writes_json(tmp_path):
    out = tmp_path / "attention.json"
    env = fast_compile.env({**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"})  # structure only
    proc = subprocess.run(
        [sys.executable, "-m", "bench.attention", "--tiny", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    sections = result["sections"]
    assert set(sections) == {"attention", "sweep", "model", "scan"}
    # --tiny has one head layout: causal (today's xla, splash) + window (today's xla, sliced xla, splash)
    assert len(sections["attention"]) == 5 and len(sections["sweep"]) == 2 * 2  # 2 masks x 2 block sizes
    assert [(r["impl"], r["remat"]) for r in sections["model"]] == [
        ("xla", "full"),
        ("splash", "full"),
        ("splash", "dots_with_no_batch_dims_saveable"),
    ]
    assert {r["design"] for r in sections["scan"]} == {"group", "switch"}
    for rows in sections.values():
        for row in rows:
            assert "error" not in row and row["ms"] > 0 and row["compile_s"] > 0, row
    for header in (
        "### attention",
        "| heads | mask | impl | ms (fwd+bwd) | × today's xla |",
        "### sweep",
        "### model",
        "| heads | attention | remat | ms | TFLOP/s | MFU | peak HBM GiB | compile s |",
        "### scan",
    ):
        assert header in proc.stdout


@pytest.mark.ci_extra  # a minute of make test's 12: CI runs it in make test-extra
@pytest.mark.slow
def test_unknown_section_is_refused():
    proc = subprocess.run(
        [sys.executable, "-m", "bench.attention", "--sections", "attention,bogus"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "error: unknown sections ['bogus']" in proc.stderr
