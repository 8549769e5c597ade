"""The long one-chip proxy recipes (olmo3-7b-proxy-v5e{,-mxu}-{32k,65k}.yaml) read data that a
shipped command builds: `make sample-proxy-long` tokenizes data_manifests/mixtures/sample-proxy-{32k,65k}.yaml
(the embedded sample, best-fit packed at the recipe's seq_len, the model's vocabulary) into the
folder the recipe names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainer.config.schema import load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["32k", "65k", "mxu-32k", "mxu-65k"])
def test_a_long_proxy_recipes_data_is_what_make_sample_proxy_long_builds(name):
    from contract import TokenizerInfo
    from pipelines.manifest_assembly import tokenizer_info
    from pipelines.mixture import load_mixture
    from trainer.data_contract import check_tokenizer_fits_model

    cfg = load_config(ROOT / f"trainer/configs/olmo3-7b-proxy-v5e-{name}.yaml")
    k = name.removeprefix("mxu-")
    out = f"out/sample-proxy-{k}"
    assert cfg.data == (f"{out}/manifest.json",)
    mixture_path = f"data_manifests/mixtures/sample-proxy-{k}.yaml"
    mixture = load_mixture(str(ROOT / mixture_path))
    assert mixture.seq_len == cfg.seq_len and mixture.packing is not None and mixture.packing.method == "best_fit"
    assert all(p.startswith("sample://") for s in mixture.sources for p in s.paths)  # the embedded sample
    check_tokenizer_fits_model(TokenizerInfo.from_json(tokenizer_info(mixture.tokenizer)), cfg.model_cfg(), name)
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^sample-proxy-long:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert target and f"--mixture {mixture_path} --output {out}\n" in target.group(1)
