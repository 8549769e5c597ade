"""Which learning rate OLMo-core 3.0.0 uses after ``Trainer.load_checkpoint(STEP,
load_optim_state=True, load_trainer_state=False)`` when the new stage's config has another peak lr
than the checkpoint's param groups (``lr``/``initial_lr``): OLMo-core's own Trainer trains stage 1
at lr A and saves; stage 2 is configured with lr B and loads that step; the lr of each update is
read from OLMo-core's own metrics (bench.olmo_reference's table, column ``lr``).

``python -m bench.olmo_stage_lr --out DIR`` prints {"stage1_lr", "stage2_config_lr", "stage2_lrs",
"uses"} where "uses" is "checkpoint" or "config" (which peak the schedule scaled from).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

STAGE1, STAGE2 = 4, 4
A, B = 3e-3, 1e-3
NEXT = ["schedule.kind=linear", "schedule.warmup_steps=0", "schedule.final_lr_ratio=0.0", "seed=1337"]


def lrs(table: str) -> list[float]:
    from bench import olmo_reference as ref_lib  # JAX after JAX_PLATFORMS

    rows = [json.loads(line) for line in Path(table).read_text().splitlines() if line.strip()]
    return [float(r[ref_lib.LR]) for r in rows if ref_lib.LR in r]


def measure(root: Path) -> dict:
    from bench import olmo_reference as ref_lib  # JAX after JAX_PLATFORMS
    from bench import olmo_step_for_step as sfs
    from trainer.config.schema import load_config

    data = sfs.write_data(str(root / "data"), sfs.L)
    ref_lib.run(
        load_config(sfs.TINY, sfs.recipe(data, STAGE1, f"lr={A}")),
        str(root / "s1.jsonl"),
        str(root / "w1"),
        save_to=str(root / "olmo"),
    )
    step_dir = str(root / "olmo" / f"step{STAGE1}")
    cfg2 = load_config(sfs.TINY, sfs.recipe(data, STAGE2, f"lr={B}", *NEXT))
    ref_lib.run(cfg2, str(root / "s2.jsonl"), str(root / "w2"), start=step_dir)
    got = lrs(str(root / "s2.jsonl"))
    # linear, no warmup, to 0 over STAGE2 updates: the lr of update i (1-based) is peak * (1 - i/STAGE2)
    shape = [1 - i / STAGE2 for i in range(1, STAGE2 + 1)]
    uses = (
        "checkpoint"
        if len(got) == STAGE2 and all(abs(g - A * s) <= 1e-12 for g, s in zip(got, shape))
        else "config"
        if len(got) == STAGE2 and all(abs(g - B * s) <= 1e-12 for g, s in zip(got, shape))
        else "neither"
    )
    return {"stage1_lr": A, "stage2_config_lr": B, "stage2_lrs": got, "uses": uses}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True, help="a new folder for the runs")
    a = p.parse_args(argv)
    root = Path(a.out)
    root.mkdir(parents=True)
    print(json.dumps(measure(root)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
