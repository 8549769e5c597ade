"""The one-chip proxy recipes (trainer/configs/olmo3-7b-proxy-v5e*.yaml): valid configs of the 7B
layer widths in both head layouts with fp32 state, fed by a mixture whose tokenizer is the model's,
and memory arithmetic in their comments that matches model.flops."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import model
from trainer.config.schema import check_state_precision, load_config

ROOT = Path(__file__).resolve().parents[2]
STOCK = ROOT / "trainer/configs/olmo3-7b-proxy-v5e.yaml"
MXU = ROOT / "trainer/configs/olmo3-7b-proxy-v5e-mxu.yaml"
GiB = 2**30


@pytest.mark.parametrize("path, heads", [(STOCK, (32, 128)), (MXU, (16, 256))])
def test_the_proxy_recipes_are_the_7b_layers_with_fp32_state(path, heads):
    cfg = load_config(path)
    check_state_precision(cfg)  # fp32 Adam moments: no opt-in needed, none given
    assert not cfg.allow_low_precision_optimizer_state
    m = cfg.model_cfg()
    assert (m.n_heads, m.head_dim) == heads and m.q_width == 4096
    assert (m.d_model, m.mlp_hidden, m.vocab_size, m.param_dtype, m.compute_dtype) == (
        4096,
        11008,
        32768,
        "float32",
        "bfloat16",
    )
    assert (cfg.seq_len, cfg.global_batch_size) == (8192, 4)  # 4 x 8192 tokens per optimizer step
    assert (cfg.optimizer.mu_dtype, cfg.optimizer.nu_dtype) == ("float32", "float32")
    assert cfg.log.peak_tflops_per_device == "auto"


def test_the_proxy_data_is_tokenized_with_the_models_vocabulary():
    from contract import TokenizerInfo
    from pipelines.manifest_assembly import tokenizer_info
    from pipelines.mixture import load_mixture
    from trainer.data_contract import check_tokenizer_fits_model

    cfg = load_config(STOCK)
    assert cfg.data == ("out/sample-proxy/manifest.json",)
    mixture = load_mixture(str(ROOT / "data_manifests/mixtures/sample-proxy.yaml"))
    assert mixture.seq_len == cfg.seq_len and mixture.tokenizer == "dolma2-proxy32k"
    info = TokenizerInfo.from_json(tokenizer_info(mixture.tokenizer))
    check_tokenizer_fits_model(info, cfg.model_cfg(), "sample-proxy")


def test_the_recipes_memory_arithmetic_matches_the_accounting():
    """The parameter counts and the step-argument size (fp32 params + Adam moments, 12 B/P) written
    in the recipe's comments are model.count_params' (a change to the model or the proxy vocabulary
    must update them), and the layer count is the most whose fp32 state and gradients (20 B/P) fit."""
    from model.config import PROXY_LAYERS

    text = STOCK.read_text()
    counts = {}
    for layers in (1, 2, 3):
        counts[layers] = model.count_params(model.get_config("olmo3-7b-proxy", n_layers=layers))
        assert f"{counts[layers]:,}" in text, (layers, counts[layers])
    assert f"a layer is {counts[2] - counts[1]:,}" in text
    assert f"({PROXY_LAYERS} layers: {12 * counts[PROXY_LAYERS] / GiB:.2f} GiB)" in text
    hbm = 15.75
    assert 20 * counts[3] / GiB > hbm  # state + gradients of 3 layers alone do not fit a v5e chip ...
    assert 20 * counts[PROXY_LAYERS] / GiB < hbm  # ... the recipe's layer count leaves room for the rest
    assert f"as many layers as fit: {PROXY_LAYERS}" in text
    assert model.get_config("olmo3-7b-proxy").n_layers == PROXY_LAYERS


LONG_OPTIONS = {"remat", "seq_chunk", "splash_fused_bwd", "max_seq_len"}
# At 32,768 the kept gate/up projections fit (trainer.compile peak 14.15 GiB for v5e:1x1) and make the step faster
# on the chip (66.3% MFU against 63.5%); at 65,536 they would not fit.
KEEP_GATE_UP = {32768: True, 65536: False}


@pytest.mark.parametrize("base", [STOCK, MXU])
@pytest.mark.parametrize("length", [32768, 65536])
def test_the_long_recipes_are_the_proxy_with_only_the_length_and_memory_options_changed(base, length):
    """olmo3-7b-proxy-v5e{,-mxu}-{32k,65k}.yaml: the same model (layers, heads, splash blocks, dtypes),
    optimizer and libtpu flags as their 8k recipe; one sequence of `length` per update; only the
    memory options of issue 57 item 3 differ in the model (the gate/up projections kept at 32k only)."""
    long = base.with_name(f"{base.stem}-{ {32768: 32, 65536: 65}[length] }k.yaml")
    short_cfg, long_cfg = load_config(base), load_config(long)
    assert (long_cfg.seq_len, long_cfg.global_batch_size, long_cfg.microbatches) == (length, 1, 1)
    a, b = dataclasses.asdict(short_cfg.model_cfg()), dataclasses.asdict(long_cfg.model_cfg())
    keep = KEEP_GATE_UP[length]
    assert {k for k in a if a[k] != b[k]} == LONG_OPTIONS | ({"seq_chunk_keep_gate_up"} if keep else set())
    assert b["seq_chunk_keep_gate_up"] is keep
    assert (b["remat"], b["seq_chunk"], b["splash_fused_bwd"], b["max_seq_len"]) == (
        "save_attn_mlp_out",
        8192,
        False,
        length,
    )
    assert long_cfg.optimizer == short_cfg.optimizer and long_cfg.libtpu_flags == short_cfg.libtpu_flags
    assert long_cfg.loss_chunk == short_cfg.loss_chunk and long_cfg.fused_update == short_cfg.fused_update
