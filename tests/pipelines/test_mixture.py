"""Mixture files: the shipped ones parse; malformed ones fail with a clear error; globs resolve
so that every file belongs to exactly one source."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.mixture import DEFAULT_MIXTURE, MixtureError, load_mixture, parse_mixture, resolve, uses_sample

MIXTURES = Path(DEFAULT_MIXTURE).parent
BASE = {
    "name": "m", "tokenizer": "dolma2", "seq_len": 16, "seed": 0, "heldout_fraction": 0.1, "dedup": False,
    "sources": [{"name": "a", "paths": ["x/*.jsonl"], "weight": 1.0}],
}


def test_shipped_mixtures_parse():
    sample = load_mixture(DEFAULT_MIXTURE)
    assert uses_sample(sample) and sample.seq_len <= 1024 and len(sample.sources) >= 3
    stage1 = load_mixture(MIXTURES / "olmo3-stage1.yaml")
    assert (stage1.seq_len, stage1.seed) == (8192, 34521)
    shares = {s.name: s.weight for s in stage1.sources}
    assert shares["common_crawl"] == 0.761 and abs(sum(shares.values()) - 1.0) < 1e-3
    stage2 = load_mixture(MIXTURES / "olmo3-stage2.yaml")
    assert stage2.seq_len == 8192 and stage2.dedup


@pytest.mark.parametrize(
    "patch,msg",
    [
        ({"seq_len": 0}, "seq_len"),
        ({"heldout_fraction": 1.0}, "heldout_fraction"),
        ({"dedup": "yes"}, "dedup"),
        ({"colour": 1}, "unknown keys"),
        ({"sources": []}, "sources"),
        ({"sources": [{"name": "a", "paths": ["p"], "weight": 0}]}, "weight"),
        ({"sources": [{"name": "rejects", "paths": ["p"], "weight": 1}]}, "name"),
        ({"sources": [{"name": "a/b", "paths": ["p"], "weight": 1}]}, "name"),
        ({"sources": [{"name": "a", "paths": [], "weight": 1}]}, "paths"),
        ({"sources": [{"name": "a", "paths": ["p"], "weight": 1}, {"name": "a", "paths": ["q"], "weight": 1}]}, "duplicate"),
    ],
)
def test_malformed_mixture_is_refused_with_a_clear_error(patch, msg):
    with pytest.raises(MixtureError, match=msg):
        parse_mixture({**BASE, **patch})


def test_resolve_expands_globs_and_refuses_a_file_in_two_sources(tmp_path):
    for name in ("a1.jsonl", "a2.jsonl.gz", "b1.jsonl"):
        (tmp_path / name).write_text("")
    m = parse_mixture({**BASE, "sources": [
        {"name": "a", "paths": [str(tmp_path / "a*")], "weight": 1},
        {"name": "b", "paths": [str(tmp_path / "b*.jsonl")], "weight": 1}]})
    r = resolve(m)
    assert r.files == ((str(tmp_path / "a1.jsonl"), str(tmp_path / "a2.jsonl.gz")), (str(tmp_path / "b1.jsonl"),))
    assert r.to_dict()["sources"][0]["paths"] == list(r.files[0])
    clash = parse_mixture({**BASE, "sources": [
        {"name": "a", "paths": [str(tmp_path / "*1.jsonl")], "weight": 1},
        {"name": "b", "paths": [str(tmp_path / "b*")], "weight": 1}]})
    with pytest.raises(MixtureError, match="matched by sources"):
        resolve(clash)
    with pytest.raises(MixtureError, match="matched no files"):
        resolve(parse_mixture({**BASE, "sources": [{"name": "a", "paths": [str(tmp_path / "zz*")], "weight": 1}]}))


def test_engine_settings_parse_and_stay_out_of_the_recorded_mixture():
    m = parse_mixture({**BASE, "tokenizer_engine": "tiktoken", "tokenizer_crosscheck": "all"})
    assert (m.tokenizer_engine, m.tokenizer_crosscheck) == ("tiktoken", "all")
    assert parse_mixture({**BASE, "tokenizer_crosscheck": 0.25}).tokenizer_crosscheck == 0.25
    assert (parse_mixture(BASE).tokenizer_engine, parse_mixture(BASE).tokenizer_crosscheck) == (None, None)
    # how the ids are computed is not what they are: the manifest's mixture (fingerprinted) omits it
    assert m.to_dict() == parse_mixture(BASE).to_dict()
    for bad in (1.5, -0.1, "some", True, float("nan")):
        with pytest.raises(MixtureError, match="tokenizer_crosscheck"):
            parse_mixture({**BASE, "tokenizer_crosscheck": bad})
    with pytest.raises(MixtureError, match="tokenizer_engine"):
        parse_mixture({**BASE, "tokenizer_engine": ""})
