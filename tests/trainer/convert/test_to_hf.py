"""python -m trainer.convert to-hf: an olmax step exported to Hugging Face is the same model in
transformers (logits within 1e-5, fp32; YaRN and a padded vocabulary included), HF → olmax → HF
gives back the same tensors byte for byte, dolma2 runs get a tokenizer that encodes as dolma2
does, and every refusal is one line with nothing written."""

from __future__ import annotations

import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors import safe_open

import model
from contract.rundir import RunDir
from tests.trainer.checkpoint_fixtures import Loader
from trainer import optim
from trainer.checkpointing.checkpoints import Checkpoints
from trainer.config.schema import CheckpointConfig, load_config
from trainer.convert.__main__ import main
from trainer.convert.to_hf import chunk_boxes

# a padded vocabulary (500 ids in 512 rows) and YaRN on the full-attention layers only
SMALL = model.get_config(
    "olmo3-tiny",
    vocab_size=500,
    vocab_pad_multiple=128,
    eos_id=498,
    pad_id=499,
    ranks_sha256=None,
    compute_dtype="float32",
    rope_scaling="yarn",
    yarn_factor=4.0,
    yarn_original_max_seq_len=64,
    yarn_full_attn_layers_only=True,
)


def save_step(run_dir, cfg, params, step=5):
    """An olmax checkpoint step as the trainer writes one (params, Adam state, meta with the model)."""
    tx = optim.make_optimizer(load_config(None, ["skip_step.enabled=true"]))
    ckpt = Checkpoints(RunDir(run_dir.absolute()), CheckpointConfig())
    meta = {"step": step, "model_resolved": dataclasses.asdict(cfg)}
    ckpt.save(step, params, tx.init(params), Loader(step), meta)
    ckpt.close()
    return run_dir / "checkpoints" / str(step)


def tensors(folder):
    files = sorted(folder.glob("*.safetensors"))
    out = {}
    for f in files:
        with safe_open(f, framework="numpy") as h:
            out.update({k: h.get_tensor(k) for k in h.keys()})  # noqa: SIM118 - a safetensors handle
    return out


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("to_hf")
    params = jax.tree.map(np.asarray, model.init(SMALL, jax.random.key(3)))
    params["final_norm"]["scale"] = np.linspace(0.5, 1.5, SMALL.d_model, dtype=np.float32)  # not all ones
    save_step(root / "run", SMALL, params)
    return root, params


def test_the_export_is_the_same_model_in_transformers_logits_within_1e_5(small_run, capsys):
    root, params = small_run
    out = root / "hf-sharded"
    assert main(["to-hf", str(root / "run"), "--out", str(out), "--max_shard_gib", "0.0002"]) == 0
    assert "to-hf: step 5 of" in capsys.readouterr().out
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # sharded at ~215 KB, with the index
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size"] == 500 and config["layer_types"] == list(SMALL.layers)
    assert config["rope_parameters"]["full_attention"]["rope_type"] == "yarn"
    assert config["rope_parameters"]["sliding_attention"]["rope_type"] == "default"
    assert json.loads((out / "olmax_export.json").read_text())["padded_vocab_rows_dropped"] == 12
    tokens = np.random.default_rng(0).integers(0, SMALL.vocab_size, (2, 80))  # past the 32-token window
    ours = np.asarray(model.forward(SMALL, jax.tree.map(jnp.asarray, params), jnp.asarray(tokens)))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    with torch.no_grad():
        theirs = hf(torch.tensor(tokens)).logits.numpy()
    assert theirs.shape == ours.shape == (2, 80, 500)
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=1e-5)


def test_hf_to_olmax_to_hf_gives_back_the_same_tensors_byte_for_byte(small_run, tmp_path):
    root, _ = small_run
    first = tmp_path / "first"
    assert main(["to-hf", str(root / "run"), "--out", str(first)]) == 0
    cfg, params = model.load_hf(str(first), vocab_pad_multiple=128, ranks_sha256=None)  # HF → olmax
    save_step(tmp_path / "run2", cfg, params, step=1)
    second = tmp_path / "second"
    assert main(["to-hf", str(tmp_path / "run2"), "--out", str(second)]) == 0  # → HF again
    a, b = tensors(first), tensors(second)
    assert sorted(a) == sorted(b) and len(a) == 3 + 11 * SMALL.n_layers
    for name in a:
        assert a[name].dtype == b[name].dtype == np.float32 and a[name].shape == b[name].shape
        assert a[name].tobytes() == b[name].tobytes(), name


def test_bfloat16_export_holds_the_rounded_parameters(small_run, tmp_path):
    root, params = small_run
    out = tmp_path / "bf16"
    assert main(["to-hf", str(root / "run"), "--out", str(out), "--dtype", "bfloat16"]) == 0
    with safe_open(out / "model.safetensors", framework="flax") as h:
        embed = np.asarray(h.get_tensor("model.embed_tokens.weight"))
        gate = np.asarray(h.get_tensor("model.layers.2.mlp.gate_proj.weight"))  # assigned in place, chunk by chunk
    assert str(embed.dtype) == "bfloat16" and json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert embed.tobytes() == params["embed"]["embedding"][:500].astype(embed.dtype).tobytes()
    assert gate.tobytes() == params["layers"]["mlp"]["gate_proj"][2].T.astype(gate.dtype).tobytes()


def test_the_stored_chunks_are_boxes_that_tile_the_array():
    boxes = list(chunk_boxes((4, 10, 6), (4, 4, 6)))  # a device's shard of a stacked kernel: every layer
    assert boxes == [(slice(0, 4), slice(a, b), slice(0, 6)) for a, b in ((0, 4), (4, 8), (8, 10))]
    assert len(list(chunk_boxes((3, 5), (2, 5)))) == 2 and list(chunk_boxes((), ())) == [()]


def test_a_dolma2_run_gets_a_tokenizer_that_encodes_as_dolma2(tmp_path):
    from pipelines.dolma2_tokenizer import dolma2

    cfg = model.get_config("olmo3-tiny", d_model=8, n_heads=2, n_kv_heads=2, head_dim=4, mlp_hidden=16, n_layers=1)
    save_step(tmp_path / "run", cfg, jax.tree.map(np.asarray, model.init(cfg, jax.random.key(0))))
    assert main(["to-hf", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    text = "The quiet river 2010 + x<|endoftext|>  naïve\n\ncode:\tdef f(): pass<|pad|>"
    assert tok.encode(text) == dolma2().encode(text, allowed_special="all")
    assert (tok.eos_token_id, tok.pad_token_id) == (100257, 100277)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["vocab_size"] == 100278


def _refused(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    return err


def test_an_existing_out_is_refused_and_left_untouched(small_run, tmp_path, capsys):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    err = _refused(capsys, ["to-hf", str(small_run[0] / "run"), "--out", str(out)])
    assert "exists: the export never overwrites" in err
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


def test_a_path_without_an_olmax_step_is_refused(tmp_path, capsys):
    (tmp_path / "model_and_optim").mkdir()  # an OLMo-core step is not an olmax one
    err = _refused(capsys, ["to-hf", str(tmp_path), "--out", str(tmp_path / "hf")])
    assert "is not an olmax checkpoint step" in err
    assert not (tmp_path / "hf").exists()


def test_a_torn_step_is_refused_and_nothing_is_written(small_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(small_run[0] / "run", run)
    (run / "checkpoints" / "5" / "olmax_checksums.json").unlink()
    err = _refused(capsys, ["to-hf", str(run), "--out", str(tmp_path / "hf")])
    assert "a torn step: no olmax_checksums.json" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_checkpoint_the_recorded_model_does_not_shape_is_refused_naming_the_tensor(small_run, tmp_path, capsys):
    cfg = dataclasses.replace(SMALL, mlp_hidden=SMALL.mlp_hidden * 2)  # meta says another model
    save_step(tmp_path / "run", cfg, small_run[1])
    err = _refused(capsys, ["to-hf", str(tmp_path / "run"), "--out", str(tmp_path / "hf")])
    assert "params/layers.mlp.down_proj has shape (4, 192, 64), the run's model config" in err
    assert "makes (4, 384, 64)" in err
