"""A real 2-process run on loopback: jax.distributed + CPU gloo collectives."""

import os
import socket
import subprocess
import sys

import numpy as np

from dataloader import LoaderConfig, make_loader
from dataloader.plan import RECORD_BITS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_guard_passes_and_gathered_batches_equal_single_process(manifest_path, tmp_path):
    port = free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT, "XLA_FLAGS": ""}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.dataloader.multiprocess_worker",
                str(port),
                str(i),
                manifest_path,
                str(tmp_path),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=TIMEOUT_S))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0 and "OK" in out, err[-3000:]

    single = make_loader(LoaderConfig(data=[manifest_path], global_batch_size=16, seed=21), 0, 1, start_step=2)
    ref = [next(single) for _ in range(3)]
    results = [np.load(tmp_path / f"result-{i}.npz") for i in range(2)]
    for r in results:  # both processes gathered the same thing: the single-process batches
        g_tokens, g_index = r["g_tokens"], r["g_index"]
        assert g_tokens.shape == (2, 3, 8, ref[0]["tokens"].shape[1])
        for s in range(3):
            assert np.array_equal(np.concatenate(list(g_tokens[:, s])), ref[s]["tokens"])
            assert np.concatenate(list(g_index[:, s])).tolist() == ref[s]["index"].tolist()
    for s in range(3):
        example = np.concatenate([results[0]["example"][s], results[1]["example"][s]])
        assert np.array_equal(example, ref[s]["example"])
    assert set((ref[0]["example"] >> RECORD_BITS).tolist()) <= {0, 1}
    for r in results:  # the double-sharded sampler was rejected on both hosts, hosts named
        caught = str(r["caught"])
        assert "start-up guard failed" in caught and "read by no host" in caught
        assert "host 0 reads positions" in caught and "host 1 reads positions" in caught
