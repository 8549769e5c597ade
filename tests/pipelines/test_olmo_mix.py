"""`python -m pipelines.mixture from-olmo-mix`: OLMo-core mix files → tokens mixtures, checked
against OLMo-core's own DataMix.build (ai2-olmo-core, test extra)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from pipelines import olmo_mix
from pipelines.mixture import load_mixture

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "data_manifests" / "mixtures" / "olmo3-stage1-ai2.yaml"
PLACEHOLDER = "gs://YOUR_BUCKET/ai2-llm"
mixes = pytest.importorskip("olmo_core.data.mixes", reason="ai2-olmo-core is in the test extra")
from olmo_core.data.tokenizer import TokenizerName  # noqa: E402


def official_mix_file() -> str:
    import olmo_core
    return os.path.join(os.path.dirname(olmo_core.__file__), "data", "mixes", "OLMo-mix-0625-official.txt")


def test_sources_and_file_order_are_olmo_cores_data_mix_build():
    with open(official_mix_file()) as f:
        mixture = olmo_mix.mixture_from_olmo_mix(f.read(), PLACEHOLDER)
    paths, labels = mixes.DataMix.OLMo_mix_0625_official.build(
        PLACEHOLDER, TokenizerName.dolma2)
    assert [p for s in mixture["sources"] for p in s["paths"]] == paths  # line order = instance order
    assert [s["name"] for s in mixture["sources"] for _ in s["paths"]] == labels
    assert len(paths) == 1016 and len(mixture["sources"]) == 65
    assert all(s["format"] == "tokens" and s["dtype"] == "uint32" for s in mixture["sources"])
    assert all("/allenai/dolma3-tokenizer/" in p for p in paths)


def test_shipped_stage1_mixture_is_the_generated_one(capsys):
    from pipelines.mixture import _from_olmo_mix_cli  # the `python -m pipelines.mixture from-olmo-mix` CLI
    assert _from_olmo_mix_cli([official_mix_file(), "--root", PLACEHOLDER, "--name", "olmo3-stage1-ai2"]) == 0
    out = capsys.readouterr().out
    assert out == SHIPPED.read_text()
    m = load_mixture(SHIPPED)
    assert m.name == "olmo3-stage1-ai2" and m.seq_len == 8192 and m.heldout_fraction == 0.0
    assert sum(len(s.paths) for s in m.sources) == 1016


def test_malformed_mix_files_are_clear_errors():
    with pytest.raises(olmo_mix.OlmoMixError, match="m.txt:2: expected 'label,path'"):
        olmo_mix.parse_olmo_mix("# c\nno-comma-here\n", "m.txt")
    with pytest.raises(olmo_mix.OlmoMixError, match="TOKENIZER"):
        olmo_mix.parse_olmo_mix("a,x/y.npy\n", "m.txt")
    with pytest.raises(olmo_mix.OlmoMixError, match="more than one run"):
        olmo_mix.mixture_from_olmo_mix("a,{TOKENIZER}/1.npy\nb,{TOKENIZER}/2.npy\na,{TOKENIZER}/3.npy\n", "r")
    got = olmo_mix.mixture_from_olmo_mix("# x\n\na,p/{TOKENIZER}/1.npy\na,p/{TOKENIZER}/0.npy\n", "gs://b/", tokenizer_id="t")
    assert got["sources"] == [{"name": "a", "format": "tokens", "dtype": "uint32", "weight": 1.0,
                               "paths": ["gs://b/p/t/1.npy", "gs://b/p/t/0.npy"]}]
    assert yaml.safe_load(olmo_mix.to_yaml(got, "h")) == got


@pytest.mark.parametrize("label", ["rejects", "Duplicates", "a b", "-a", "x" * 129])
def test_a_label_that_cannot_be_a_source_name_is_refused(label):
    with pytest.raises(olmo_mix.OlmoMixError, match="m.txt:1: label .* is not a valid source name"):
        olmo_mix.parse_olmo_mix(f"{label},p/{{TOKENIZER}}/0.npy\n", "m.txt")


def test_the_cli_turns_bad_mix_files_into_one_error_line_and_exit_2(tmp_path, capsys):
    from pipelines.mixture import _from_olmo_mix_cli

    bad = tmp_path / "bad.txt"
    bad.write_text("no-comma-here\n")
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe,\x00")
    for path, says in ((bad, "bad.txt:1: expected 'label,path'"), (tmp_path / "missing.txt", "missing.txt"),
                       (binary, "binary.txt")):
        assert _from_olmo_mix_cli([str(path), "--root", "gs://b"]) == 2
        captured = capsys.readouterr()
        assert captured.err.startswith("error: ") and says in captured.err and captured.out == ""
