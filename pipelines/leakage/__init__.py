"""The eval-leakage detector: is a training document a copy of a downstream task's instance?

One face for its two users, the audit's check 8 (`audit/eval_leakage.py`) and the tokenize job's
`decontaminate` step (`pipelines/decontaminate.py`): `build` (or `open_index`, which also reads an
index file) makes the `LeakIndex` of a task folder once, `ship`/`fetch` hand it to Beam workers,
and each worker scores documents with a `Detector` of a `DetectorConfig` (mode decon, ngram13 or
both). The rooms behind it: `index` (the index, `python -m pipelines.leakage.index`), `detect`
(the two detectors), `candidates`, `words` and `grams` (the pre-filter and candidate check, their
hashing), `kernels` (their numba kernels, imported only when a detector scores) and `spans` (the
training text a hit shows).
"""

from .detect import BOTH, DECON, MODES, NGRAM13, Detector, DetectorConfig
from .index import LeakIndex, LeakIndexError, build, fetch, open_index, ship

__all__ = [
    "BOTH",
    "DECON",
    "MODES",
    "NGRAM13",
    "Detector",
    "DetectorConfig",
    "LeakIndex",
    "LeakIndexError",
    "build",
    "fetch",
    "open_index",
    "ship",
]
