"""OLMo-core mix files (`olmo_core/data/mixes/*.txt`) → an olmax mixture of `format: tokens` sources.

A mix file has one `label,relative/path/{TOKENIZER}/…/NNNNNN.npy` per line (`#` comments, blank
lines skipped), as OLMo-core's `DataMix.build` reads it. Each label becomes a source, in order of
first appearance, with its files in line order: the mixture then lists every file in the mix
file's line order, which is the order OLMo-core numbers its instances in (`data_order:
olmo-core`). A label whose lines are not contiguous would reorder files, so it is an error.

    python -m pipelines.mixture from-olmo-mix MIX.txt --root URI [--tokenizer allenai/dolma3-tokenizer]
        [--name NAME] [--seq-len 8192] [--split heldout]
        [--source-permutation-seed N] [--packing best_fit --group G] > mixture.yaml

MIX.txt may be a bare name of a mix that ships with ai2-olmo-core (`olmo_core/data/mixes/`). The
output's header echoes the whole command (every option), so re-running it gives the same bytes.
"""

from __future__ import annotations

import importlib.util
import os
import random
from typing import Any

import yaml

from contract.errors import Refused
from contract.manifest import DEFAULT_TOKEN_FILE_DTYPE, SOURCE_SPLITS, TOKENS, valid_source_name

TOKENIZER_FIELD = "{TOKENIZER}"
DEFAULT_TOKENIZER_ID = "allenai/dolma3-tokenizer"  # OLMo 3's files (same ids as dolma2)
DEFAULT_SEQ_LEN = 8192


class OlmoMixError(Refused, ValueError):
    """A mix file line is malformed (the message names the line)."""


def parse_olmo_mix(text: str, where: str = "<mix>") -> list[tuple[str, str]]:
    """Mix file text → [(label, path template)] in line order."""
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(",")
        if len(parts) != 2 or not all(parts):
            raise OlmoMixError(f"{where}:{n}: expected 'label,path', got {line!r}")
        label, path = parts
        if TOKENIZER_FIELD not in path:
            raise OlmoMixError(f"{where}:{n}: path has no {TOKENIZER_FIELD} field: {path!r}")
        if not valid_source_name(label):  # labels become source names: the mixture's rule, in full
            raise OlmoMixError(f"{where}:{n}: label {label!r} is not a valid source name (or is reserved)")
        out.append((label, path))
    if not out:
        raise OlmoMixError(f"{where}: no entries")
    return out


def group_by_label(entries: list[tuple[str, str]], where: str = "<mix>") -> list[tuple[str, list[str]]]:
    """[(label, path)] → [(label, [paths])] in order; a label must occupy one run of lines."""
    groups: list[tuple[str, list[str]]] = []
    for label, path in entries:
        if groups and groups[-1][0] == label:
            groups[-1][1].append(path)
        elif any(g[0] == label for g in groups):
            raise OlmoMixError(
                f"{where}: label {label!r} appears in more than one run of lines; as one "
                "source its files would change order (OLMo-core's instance numbering)"
            )
        else:
            groups.append((label, [path]))
    return groups


def mixture_from_olmo_mix(
    text: str,
    root: str,
    *,
    tokenizer_id: str = DEFAULT_TOKENIZER_ID,
    name: str = "olmo-mix",
    seq_len: int = DEFAULT_SEQ_LEN,
    seed: int = 0,
    split: str | None = None,
    where: str = "<mix>",
    permutation_seed: int | None = None,
    packing: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The mixture (a dict ready for YAML) of a mix file's text, files under `root`. `split`:
    None (training files) or "heldout" (every source `split: heldout`, e.g. OLMo-core's
    validation mixes such as `v3-small-ppl-validation.txt`). `permutation_seed`: the files in
    the order OLMo-core's `source_permutation_seed` gives them (`permute`). `packing`: the
    mixture's `packing` mapping (e.g. best-fit in groups of files, as OLMo 3's stage 3)."""
    if split not in (None, *SOURCE_SPLITS):
        raise OlmoMixError(f"split must be one of {SOURCE_SPLITS}, got {split!r}")
    root = root.rstrip("/") + "/"
    entries = parse_olmo_mix(text, where)
    if permutation_seed is not None:
        entries = permute(entries, permutation_seed)
    groups = group_by_label(entries, where)
    sources = [
        {
            "name": label,
            "format": TOKENS,
            "dtype": DEFAULT_TOKEN_FILE_DTYPE,
            **({"split": split} if split else {}),
            "weight": 1.0,
            "paths": [root + p.replace(TOKENIZER_FIELD, tokenizer_id) for p in paths],
        }
        for label, paths in groups
    ]
    return {
        "name": name,
        "tokenizer": "dolma2",
        "seq_len": seq_len,
        "seed": seed,
        "heldout_fraction": 0.0,
        "dedup": False,
        "sources": sources,
        **({"packing": dict(packing)} if packing else {}),
    }


def permute(entries: list[tuple[str, str]], seed: int) -> list[tuple[str, str]]:
    """The mix's lines in the order OLMo-core's `NumpyDatasetConfig(source_permutation_seed=seed)`
    puts its paths (`random.Random(seed).shuffle` of their indices), before it groups them."""
    order = list(range(len(entries)))
    random.Random(seed).shuffle(order)
    return [entries[i] for i in order]


def installed_mixes_dir() -> str | None:
    """`olmo_core/data/mixes/` of the installed ai2-olmo-core (found without importing it), or None."""
    spec = importlib.util.find_spec("olmo_core")
    locations = list(spec.submodule_search_locations or []) if spec else []
    return os.path.join(locations[0], "data", "mixes") if locations else None


def locate_mix(arg: str) -> str:
    """The mix file a command line names: a path as given, or a bare file name that is not a file
    here (e.g. `OLMo-mix-0625-official.txt`, `v3-small-ppl-validation.txt`) from the mixes that ship
    with the installed ai2-olmo-core (so that a generated header's command runs anywhere)."""
    if os.path.exists(arg) or os.path.dirname(arg):
        return arg
    mixes = installed_mixes_dir()
    return os.path.join(mixes, arg) if mixes else arg


def to_yaml(mixture: dict[str, Any], header: str = "") -> str:
    body = yaml.safe_dump(mixture, sort_keys=False, width=1000)
    return "".join(f"# {line}\n".replace("# \n", "#\n") for line in header.splitlines()) + body
