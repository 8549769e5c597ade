"""A downstream metric lands in TensorBoard and in W&B under OLMo-core's exact key, spaces,
parentheses and slashes included, so an olmax run and AI2's sit under one name in both tools."""

from __future__ import annotations

import struct
from pathlib import Path
from types import SimpleNamespace

from contract.rundir import RunDir
from tests.trainer.test_eval_run import wandb_env
from trainer import trackers
from trainer.config.schema import WandbConfig
from trainer.downstream.metric import metric_key

KEYS = [
    metric_key("mmlu_stem_test_mc_5shot_fast", "len_norm_v2"),  # 'eval/downstream/... (length-normalized accuracy v2)'
    metric_key("hellaswag_bpb_5shot", "bpb_v2"),
    metric_key("copycolors_10way_fast", "acc_v1"),
]


def wandb_history(path: Path) -> list[dict[str, str]]:
    """The history rows of an offline W&B run file ({key: value_json}). Hand-written: wandb 0.30's
    Python package no longer ships a reader of its transaction log (its Go core writes it). The
    file: a 7-byte header (':W&B', magic, version), then LevelDB-log records (<crc32, length,
    type>, FULL=1 or FIRST=2/MIDDLE=3/LAST=4 pieces, 32 KiB blocks), each a wandb Record."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, head = path.read_bytes(), 32768, 7
    assert data[:4] == b":W&B"
    i, piece, rows = head, b"", []
    while i + head <= len(data):
        if block - i % block < head:  # a block's tail too short for a header is padding
            i += block - i % block
            continue
        _, n, kind = struct.unpack("<IHB", data[i : i + head])
        if kind == 0 and n == 0:
            break
        piece += data[i + head : i + head + n]
        i += head + n
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(piece)
            piece = b""
            if rec.WhichOneof("record_type") == "history":
                rows.append({it.key or "/".join(it.nested_key): it.value_json for it in rec.history.item})
    return rows


def test_a_downstream_row_lands_in_tensorboard_and_wandb_under_the_exact_key(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing import event_accumulator as ea

    for k, v in wandb_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    assert all(trackers.tag(k) == k for k in KEYS)
    row = {"step": 9, "loss": 3.25, **{k: 0.125 * (i + 1) for i, k in enumerate(KEYS)}}
    log_cfg = SimpleNamespace(tensorboard=True, wandb=WandbConfig(project="olmax-tests", mode="offline"))
    t = trackers.Trackers(log_cfg, RunDir(tmp_path), 0, lambda: [], {"steps": 10}, enabled=True)
    t.write(row)
    t.close()
    import wandb

    # finish() returned, but wandb-core may still hold the file's last records: its teardown (what a
    # trainer process's exit runs) waits for them (a read right after finish() once found no history)
    wandb.teardown()

    acc = ea.EventAccumulator(str(tmp_path / trackers.TENSORBOARD_DIR), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    assert set(KEYS) | {"train/CE loss"} == set(acc.Tags()["scalars"])
    for i, k in enumerate(KEYS):
        assert [(e.step, e.value) for e in acc.Scalars(k)] == [(9, 0.125 * (i + 1))]

    [run_file] = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    [logged] = wandb_history(run_file)
    assert logged["_step"] == "9" and logged["train/CE loss"] == "3.25"
    assert {k: float(logged[k]) for k in KEYS} == {k: 0.125 * (i + 1) for i, k in enumerate(KEYS)}
