"""SIGTERM on one host of several stops every host after the same step (orbax's reached_preemption,
JAX's preemption service), and the process that got it lives on to save."""

from __future__ import annotations

import signal
import time

from tests.processes import TIMEOUT_S, outputs_ok, workers


def test_a_sigterm_on_one_process_stops_both_after_the_same_step(tmp_path):
    with workers("tests.trainer.preemption_worker", str(tmp_path)) as procs:
        deadline = time.monotonic() + TIMEOUT_S
        while not all((tmp_path / f"pid-{i}").exists() for i in range(2)):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "workers did not start"
            time.sleep(0.1)
        time.sleep(0.5)
        procs[1].send_signal(signal.SIGTERM)
        outs = outputs_ok(procs, "STOP")
    stops = [out.split("STOP")[1].split()[0] for out in outs]
    assert stops[0] == stops[1]  # both save the same step
