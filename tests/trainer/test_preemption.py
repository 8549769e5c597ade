"""SIGTERM on one host of several stops every host after the same step (orbax's reached_preemption,
JAX's preemption service), and the process that got it lives on to save."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.dataloader.test_multiprocess import ROOT, free_port

TIMEOUT_S = 120


def test_a_sigterm_on_one_process_stops_both_after_the_same_step(tmp_path):
    port = free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT, "XLA_FLAGS": ""}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.trainer.preemption_worker", str(port), str(i), str(tmp_path)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not all((tmp_path / f"pid-{i}").exists() for i in range(2)):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "workers did not start"
            time.sleep(0.1)
        time.sleep(0.5)
        procs[1].send_signal(signal.SIGTERM)
        outputs = [p.communicate(timeout=TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    stops = []
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0 and "STOP" in out, err[-3000:]
        stops.append(out.split("STOP")[1].split()[0])
    assert stops[0] == stops[1]  # both save the same step
