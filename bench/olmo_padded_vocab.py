"""`python -m bench.olmo_padded_vocab --out DIR` — AI2's padded vocabulary against OLMo-core.

OLMo-core's OLMo 3 has `padded_vocab_size()` embedding and LM-head rows (100,352 for dolma2's
100,278 ids) and its softmax and z-loss run over all of them; olmax's `vocab_padding: unmasked`
is that. Here the toy tokenizer's 512 ids are padded to 640 rows (`vocab_pad_multiple: 640`) and
scenario a's recipe (bench.olmo_step_for_step: float32, AI2's batch order, the skip step) trains
PAD_STEPS updates on both sides: olmax unmasked against OLMo-core (its model built with the 640
rows, the weights carried with every row by `trainer.convert.olmo_core_names`), and olmax masked
(the padded logits at −inf, olmax's default) against the same reference: at step 0 the masked
loss is lower by about ln(640 / 512) = 0.2231 nats, the log-normaliser's 128 rows fewer (at
initialisation the logits are nearly equal: std ~0.16). Writes DIR/figures.json and prints it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from bench import olmo_reference as ref_lib
from bench import olmo_step_for_step as sfs
from trainer.config.schema import load_config

VOCAB, PADDED = sfs.VOCAB, 640
PAD_STEPS = 20
UNMASKED = [f"model_overrides.vocab_pad_multiple={PADDED}", "model_overrides.vocab_padding=unmasked"]
MASKED = [f"model_overrides.vocab_pad_multiple={PADDED}", "model_overrides.vocab_padding=masked"]
STEP0_GAP = math.log(PADDED / VOCAB)  # masked − unmasked loss at initialisation, about −this


def scenarios(root: Path, data: str) -> dict[str, tuple[str, list[str], int]]:
    """{name: (olmax run dir, its overrides on tiny.yaml, updates)}; both compare to `unmasked`'s reference."""
    return {
        name: (str(root / "runs" / name), sfs.recipe(data, PAD_STEPS, *extra), PAD_STEPS)
        for name, extra in (("unmasked", UNMASKED), ("masked", MASKED))
    }


def build(root: Path) -> dict:
    """The data, both olmax runs (one process beside this one) and OLMo-core's reference."""
    root = Path(root)
    data = sfs.write_data(str(root / "data"), sfs.L)
    runs = scenarios(root, data)
    proc = sfs.start_olmax(root / "olmax", [spec[:2] for spec in runs.values()])
    try:
        out, state = str(root / "ref_unmasked.jsonl"), str(root / "ref_unmasked.npz")
        ref_lib.run(load_config(sfs.TINY, runs["unmasked"][1]), out, str(root / "work"), state)
        sfs.wait_olmax(root / "olmax", proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return {"runs": runs, "refs": {"unmasked": (out, state), "masked": (out, state)}, "data": data}


def figures(built: dict) -> dict:
    """sfs.figures of the unmasked run, and the masked run's step-0 loss gap to the reference."""
    unmasked = sfs.figures({"runs": {"unmasked": built["runs"]["unmasked"]}, "refs": built["refs"]})
    d = sfs.differences(built["runs"]["masked"][0], built["refs"]["masked"][0])
    return {
        **unmasked,
        "masked": {
            "step0_loss_gap": float(d["loss"][0]),
            "expected": -STEP0_GAP,
            "loss_gap_by_step": [float(x) for x in np.round(d["loss"], 6)],
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.olmo_padded_vocab", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for the data, the runs and figures.json (must not exist)")
    out = Path(p.parse_args(argv).out)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # olmax's init runs here too: on the CPU, as the reference
    if out.exists():
        print(f"error: --out {out} exists; choose a new folder", file=sys.stderr)
        return 2
    result = figures(build(out))
    (out / "figures.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
