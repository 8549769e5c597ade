"""bench.downstream_plan counts what the two ways of sizing downstream batches pad and compile."""

from __future__ import annotations

from bench.downstream_plan import figures
from contract import downstream as ds
from tests.trainer.downstream.synthetic import task, write_tasks


def test_fitting_a_batch_to_its_bucket_pads_no_more_and_counts_every_real_token(tmp_path):
    tasks = [task("small", "acc", False, seed=1, n=3, vocab=50), task("big", "acc", True, seed=2, n=300, vocab=50)]
    write_tasks(tmp_path, tasks, 50, 512)
    f = figures(ds.load(tmp_path), batch_tokens=8192, shards=1)
    real = sum(int(t.lengths("query").sum()) for t in tasks)
    assert f["fit"]["real"] == f["full"]["real"] == real
    assert real <= f["fit"]["padded"] < f["full"]["padded"]  # the 3-instance task is no longer 8192 // L rows
    assert f["fit"]["batches"] == f["full"]["batches"]
