"""The stage-3 recipe (trainer/configs/olmo3-7b-stage3.yaml) holds the values of AI2's
`OLMo-3-1025-7B-long-context.py` (allenai/OLMo-core, src/scripts/official/OLMo3/): against OLMo-core's
own config objects (ai2-olmo-core, installed) where the script builds them, else against the
script's constants, copied here (the script is not part of the installed package)."""

from __future__ import annotations

import math

import pytest
from jax.sharding import AbstractMesh

from tests.trainer.conftest import ROOT
from trainer import mesh as mesh_lib
from trainer import optim
from trainer.config.schema import load_config

STAGE3 = ROOT / "trainer" / "configs" / "olmo3-7b-stage3.yaml"
STAGE2 = ROOT / "trainer" / "configs" / "olmo3-7b-stage2.yaml"
# the script's module constants (DEFAULT_SEQUENCE_LENGTH, GLOBAL_BATCH_SIZE in tokens, LR)
SCRIPT_SEQ, SCRIPT_BATCH_TOKENS, SCRIPT_LR = 65536, 65536 * 64, 0.00020712352850360292
STEPS = 11921  # 50B tokens (the OLMo 3 report, issue 57): the recipe's one departure from the script


@pytest.fixture(scope="module")
def cfg():
    return load_config(STAGE3)


def test_stage3_recipe_sizes_data_and_checkpoint_are_the_scripts(cfg):
    assert cfg.seq_len == SCRIPT_SEQ and cfg.global_batch_size * cfg.seq_len == SCRIPT_BATCH_TOKENS
    assert cfg.lr == SCRIPT_LR and cfg.steps == STEPS == round(50e9 / SCRIPT_BATCH_TOKENS)
    assert cfg.seed == 34521 and cfg.data_order == "olmo-core" and cfg.document_masking  # generate_doc_lengths
    assert cfg.data == ("out/olmo3-stage3/manifest.json",)
    assert "--mixture data_manifests/mixtures/olmo3-stage3.yaml --output out/olmo3-stage3\n" in STAGE3.read_text()
    assert cfg.z_loss == 1e-5 and cfg.optimizer.clip_norm == 1.0
    assert cfg.checkpoint.every == 1000 and cfg.checkpoint.init_from.endswith("olmo3-7b-stage2/checkpoints/47684")
    assert cfg.eval.every == 0 and cfg.downstream.every == 0  # the script has no evaluator callback
    stage2 = load_config(STAGE2)
    assert cfg.checkpoint.init_from.endswith(f"/{stage2.steps}")  # stage 2's last step (AI2's step47684)
    assert set(cfg.checkpoint.init_from_allow_changes) == {"rope_scaling", "max_seq_len"}


def test_stage3_init_from_stage2_is_refused_only_where_allowed(cfg):
    """What `checkpoint.init_from` compares (trainer.checkpointing.resume): stage 2's recorded config
    against stage 3's differs in the model's rope_scaling and max_seq_len, both allowed by name;
    optimizer, skip step, z-loss and document masking are stage 2's (so its Adam state continues)."""
    from trainer.checkpointing.resume import init_from_changes

    stage2 = load_config(STAGE2)
    refused, allowed = init_from_changes(stage2.to_dict(), cfg, None, cfg.checkpoint.init_from_allow_changes)
    assert refused == []
    assert sorted(line.split(":")[0] for line in allowed) == ["model.max_seq_len", "model.rope_scaling"]
    refused, _ = init_from_changes(stage2.to_dict(), cfg, None, ())
    assert len(refused) == 2  # without the allowance, both are refused


def test_stage3_model_is_olmo_cores_olmo3_7b_with_the_scripts_yarn(cfg):
    from olmo_core.data import TokenizerConfig
    from olmo_core.nn.rope import YaRNRoPEScalingConfig
    from olmo_core.nn.transformer import TransformerConfig

    yarn = YaRNRoPEScalingConfig(factor=8, beta_fast=32, beta_slow=1, old_context_len=8192)
    theirs = TransformerConfig.olmo3_7B(vocab_size=TokenizerConfig.dolma2().padded_vocab_size()).with_rope_scaling(yarn)
    m = cfg.model_cfg()
    assert m.padded_vocab_size == theirs.vocab_size == 100352 and m.n_layers == theirs.n_layers
    assert (m.rope_scaling, m.yarn_factor, m.yarn_beta_fast, m.yarn_beta_slow, m.yarn_original_max_seq_len) == (
        "yarn",
        yarn.factor,
        yarn.beta_fast,
        yarn.beta_slow,
        yarn.old_context_len,
    )
    assert m.yarn_attention_factor is None and math.isclose(yarn.get_attention_rescale_factor(), 0.1 * math.log(8) + 1)
    scaled = sorted(i for i, b in (theirs.block_overrides or {}).items() if b.sequence_mixer.rope.scaling is not None)
    assert [i for i in range(m.n_layers) if m.yarn_in(i)] == scaled == list(range(3, 32, 4))
    assert m.rope_theta == theirs.block.sequence_mixer.rope.theta == 500_000 and m.max_seq_len == SCRIPT_SEQ


def test_stage3_optimizer_and_skip_step_are_the_scripts_skip_step_adamw(cfg):
    from olmo_core.optim import SkipStepAdamWConfig

    theirs = SkipStepAdamWConfig(lr=SCRIPT_LR, weight_decay=0.1, betas=(0.9, 0.95))
    o = cfg.optimizer
    assert (o.b1, o.b2, o.eps, o.weight_decay) == (*theirs.betas, theirs.eps, theirs.weight_decay)
    assert o.decay_exclude == ("embed",)  # OptimGroupOverride(params=["embeddings.weight"], weight_decay 0)
    assert cfg.skip_step.enabled and cfg.skip_step.sigma == theirs.sigma_factor
    assert cfg.skip_step.window == theirs.rolling_interval_length


def test_stage3_learning_rates_are_olmo_cores_linear_with_warmup(cfg):
    """LinearWithWarmup(warmup=200, alpha_f=0.0) over the recipe's 11,921 steps; OLMo-core sets
    update s's rate at its step s + 1 (step_offset 1). Bit for bit, float64."""
    from olmo_core.optim import LinearWithWarmup

    theirs = LinearWithWarmup(warmup=200, alpha_f=0.0)
    ours = optim.make_schedule(cfg)
    assert cfg.decay_steps == STEPS
    for s in (0, 1, 100, 198, 199, 200, 201, 5000, STEPS - 2, STEPS - 1):
        assert ours(s) == theirs.get_lr(cfg.lr, s + 1, STEPS), s
    assert float(ours(STEPS - 1)) == 0.0  # the last update's rate: the decay has reached 0


# v5p:4x4x4: 64 chips (16 hosts of 4), the slice tests/trainer/test_compile_context.py compiles the recipe for
V5P_64 = 64


def test_stage3_context_parallelism_is_the_scripts_one_sequence_per_rank_at_a_time(cfg):
    """cp_config=TransformerContextParallelConfig.llama3(degree=8, head_stride=4): 8 devices share each
    sequence (mesh.context); rank_microbatch_size=sequence_length ("for CP we want only 1 instance per
    rank"): on 64 chips (fsdp 8 x context 8) each context group takes one sequence a microbatch. (The
    script's llama3 load balancer gives rank i the i-th contiguous slice; olmax lays positions out
    zig-zag: the loss and gradients do not depend on the layout, tests/trainer/test_context_parallel_step.py.)"""
    from olmo_core.train.train_module import TransformerContextParallelConfig

    theirs = TransformerContextParallelConfig.llama3(degree=8, head_stride=4)
    assert cfg.mesh.context == theirs.degree == 8 and (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor) == (1, -1, 1)
    groups = V5P_64 // cfg.mesh.context  # data x fsdp: the data-parallel ranks of the script
    assert cfg.global_batch_size // groups // cfg.microbatches * SCRIPT_SEQ == SCRIPT_SEQ  # one instance a rank
    assert cfg.model_cfg().seq_chunk is None  # refused with context parallelism (each device: 8,192 positions)


def test_stage3_on_more_devices_than_its_rows_is_refused_in_one_line(cfg):
    """Every device reads whole rows under context parallelism: 64 sequences feed at most 64 chips with
    tensor 1. On v5p:8x8x8 (512 chips, 128 hosts: the slice 64 x 8 would need) the start-up check that
    trainer.main and trainer.compile run for every host refuses it, one line naming the way out."""
    shape = mesh_lib.resolve_context_shape(cfg.mesh, 8 * V5P_64)
    assert shape == (1, 64, 8, 1)
    mesh = AbstractMesh(shape, ("data", "fsdp", "context", "tensor"))
    with pytest.raises(mesh_lib.MeshError) as e:
        mesh_lib.check_host_rows(mesh, cfg.global_batch_size, cfg.seq_len, 0, 128)  # type: ignore[arg-type]
    assert str(e.value).count("\n") == 0 and "mesh size 512" in str(e.value) and "whole rows" in str(e.value)
    # 64 chips: 64 batch shards, one row each (the whole check there: tests/trainer/test_compile_context.py)
    assert cfg.global_batch_size % mesh_lib.batch_shards(AbstractMesh((1, 8, 8, 1), mesh.axis_names)) == 0  # type: ignore[arg-type]
