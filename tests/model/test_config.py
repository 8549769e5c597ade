"""Named configs keep OLMo 3's structure; bad configs fail loudly."""

from __future__ import annotations

import dataclasses

import pytest

import model


def test_olmo3_7b_full_attention_exactly_in_layers_3_7_to_31():
    cfg = model.get_config("olmo3-7b")
    full = [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"]
    assert full == list(range(3, 32, 4))
    assert cfg.sliding_window == 4096 and cfg.rope_theta == 500_000.0 and cfg.rms_norm_eps == 1e-6
    assert (cfg.d_model, cfg.n_layers, cfg.mlp_hidden, cfg.vocab_size) == (4096, 32, 11008, 100278)
    assert (cfg.compute_dtype, cfg.param_dtype) == ("bfloat16", "float32")


@pytest.mark.parametrize("n_layers", [1, 2, 5, 6])
def test_last_layer_is_always_full_attention(n_layers):
    types = model.get_config("olmo3-tiny", n_layers=n_layers).layer_types
    assert len(types) == n_layers and types[-1] == "full_attention"
    assert all(t == "full_attention" for i, t in enumerate(types) if (i + 1) % 4 == 0)
    assert all(t == "sliding_attention" for i, t in enumerate(types) if (i + 1) % 4 and i < n_layers - 1)


@pytest.mark.parametrize("name", ["olmo3-small", "olmo3-tiny"])
def test_small_configs_keep_sliding_and_full_layers(name):
    cfg = model.get_config(name)
    assert {"sliding_attention", "full_attention"} == set(cfg.layer_types)
    assert cfg.sliding_window < cfg.max_seq_len
    assert cfg.vocab_size == 100278


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(n_heads=6, n_kv_heads=4), "n_heads=6 is not a multiple of n_kv_heads=4"),
        (dict(head_dim=15), "head_dim=15 must be even"),
        (dict(layer_types=("sliding_attention",)), "layer_types has 1 entries for n_layers=4"),
        (dict(compute_dtype="int8"), "compute_dtype='int8'"),
        (dict(layer_types=("local",) * 4), r"unknown layer types \['local'\]"),
        (dict(sliding_window=0), "sliding_window must be a positive int"),
        (dict(n_layers=True), r"n_layers=True is not an int"),  # a bool is no size (True would be 1 layer)
        (dict(d_model=64.5), r"d_model=64.5 is not an int"),
        (dict(rope_theta="abc"), r"rope_theta='abc' is not a float"),
        (dict(rope_theta=False), r"rope_theta=False is not a float"),
        (dict(init_cutoff=0.0), r"init_cutoff=0.0 must be a finite number > 0"),  # every weight the same constant
        (dict(init_cutoff=-2), r"init_cutoff=-2 must be a finite number > 0"),
        (dict(init_std=0.0), r"init_std=0.0 must be a finite number > 0"),
        (dict(layer_types=("sliding_attention", 3, "x", "y")), r"layer_types=.* is not a list of str"),
    ],
)
def test_invalid_config_is_rejected(bad, message):
    with pytest.raises(ValueError, match=message):
        model.get_config("olmo3-tiny", **bad)


def test_int_fields_take_integral_floats_as_the_trainer_int_fields_do():
    """64.0 is the int 64 (as `global_batch_size=64.0` is for the trainer); 64.5 and True are refused."""
    cfg = model.get_config("olmo3-tiny", d_model=64.0, attention_chunk=32.0)
    assert cfg == model.get_config("olmo3-tiny", d_model=64, attention_chunk=32)
    assert type(cfg.d_model) is int and type(cfg.attention_chunk) is int


def test_float_fields_take_numbers_as_yaml_and_json_write_them():
    """YAML 1.1 (PyYAML) reads 1e-2 (no dot) as text, JSON writes 500000.0 as 500000: both are the
    number, so the config equals (and hashes as) the one written 0.01 / 500000.0."""
    cfg = model.get_config("olmo3-tiny", init_std="1e-2", rope_theta=500000, rms_norm_eps="1E-6")
    assert (cfg.init_std, cfg.rope_theta, cfg.rms_norm_eps) == (0.01, 500000.0, 1e-6)
    assert type(cfg.init_std) is float and type(cfg.rms_norm_eps) is float
    assert hash(cfg) == hash(model.get_config("olmo3-tiny", init_std=0.01, rope_theta=500000.0, rms_norm_eps=1e-6))
    assert cfg == model.get_config("olmo3-tiny", init_std=0.01, rope_theta=500000.0, rms_norm_eps=1e-6)
    with pytest.raises(ValueError, match=r"init_std='nan' is not a finite number"):
        model.get_config("olmo3-tiny", init_std="nan")


@pytest.mark.parametrize("name", sorted(model.config.NAMED_CONFIGS))
def test_every_named_config_constructs_with_its_declared_types(name):
    cfg = model.get_config(name)
    assert type(cfg.n_layers) is int and type(cfg.rope_theta) is float and type(cfg.init_cutoff) is float


def test_unknown_names_are_rejected():
    with pytest.raises(KeyError, match="unknown model config 'olmo3-70b'"):
        model.get_config("olmo3-70b")
    with pytest.raises(TypeError, match=r"unknown ModelConfig fields \['n_head'\] \(did you mean 'n_heads'\?\)"):
        model.get_config("olmo3-tiny", n_head=3)


def test_config_is_hashable_and_frozen():
    cfg = model.get_config("olmo3-tiny")
    assert hash(cfg) == hash(model.get_config("olmo3-tiny"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.d_model = 8
    assert cfg.d_model == 64


def test_default_vocabulary_is_dolma2():
    """The model's own vocabulary constants equal the tokenizer the pipeline writes with."""
    from model import config
    from pipelines import dolma2_tokenizer as tokenizer

    assert (config.DOLMA2_VOCAB_SIZE, config.DOLMA2_EOS_ID, config.DOLMA2_PAD_ID, config.DOLMA2_RANKS_SHA256) == (
        tokenizer.VOCAB_SIZE,
        tokenizer.EOS_ID,
        tokenizer.PAD_ID,
        tokenizer.CL100K_RANKS_SHA256,
    )
    cfg = model.ModelConfig()
    assert (cfg.vocab_size, cfg.eos_id, cfg.pad_id) == (tokenizer.VOCAB_SIZE, tokenizer.EOS_ID, tokenizer.PAD_ID)
    assert (
        tokenizer.PROXY32K.vocab_size,
        tokenizer.PROXY32K.eos_id,
        tokenizer.PROXY32K.pad_id,
        tokenizer.PROXY32K.ranks_sha256,
    ) == (
        config.PROXY32K_VOCAB_SIZE,
        config.PROXY32K_EOS_ID,
        config.PROXY32K_PAD_ID,
        config.PROXY32K_RANKS_SHA256,
    )
    # every named size speaks one of the pipeline's vocabularies: the proxies the 32k one, the rest dolma2
    known = {(v.vocab_size, v.eos_id, v.pad_id, v.ranks_sha256): v.name for v in tokenizer.VOCABULARIES.values()}
    for name in model.NAMED_CONFIGS:
        c = model.get_config(name)
        assert known.get((c.vocab_size, c.eos_id, c.pad_id, c.ranks_sha256)) == (
            "dolma2-proxy32k" if "proxy" in name else "dolma2"
        ), name
