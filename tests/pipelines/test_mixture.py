"""Mixture files: the shipped ones parse; malformed ones fail with a clear error; globs resolve
so that every file belongs to exactly one source."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from contract import config_model
from pipelines.mixture import (
    DEFAULT_MIXTURE,
    MAX_SEQ_LEN,
    MixtureError,
    load_mixture,
    parse_mixture,
    parse_yaml,
    resolve,
    uses_sample,
)

MIXTURES = Path(DEFAULT_MIXTURE).parent
BASE = {
    "name": "m",
    "tokenizer": "dolma2",
    "seq_len": 16,
    "seed": 0,
    "heldout_fraction": 0.1,
    "dedup": False,
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
        ({"colour": 1}, r"unknown key\(s\) \['colour'\]"),
        ({"sources": []}, "sources"),
        ({"sources": [{"name": "a", "paths": ["p"], "weight": 0}]}, "weight"),
        ({"sources": [{"name": "rejects", "paths": ["p"], "weight": 1}]}, "name"),
        ({"sources": [{"name": "a/b", "paths": ["p"], "weight": 1}]}, "name"),
        ({"sources": [{"name": "a", "paths": [], "weight": 1}]}, "paths"),
        (
            {"sources": [{"name": "a", "paths": ["p"], "weight": 1}, {"name": "a", "paths": ["q"], "weight": 1}]},
            "duplicate",
        ),
    ],
)
def test_malformed_mixture_is_refused_with_a_clear_error(patch, msg):
    with pytest.raises(MixtureError, match=msg):
        parse_mixture({**BASE, **patch})


def test_resolve_expands_globs_and_refuses_a_file_in_two_sources(tmp_path):
    for name in ("a1.jsonl", "a2.jsonl.gz", "b1.jsonl"):
        (tmp_path / name).write_text("")
    m = parse_mixture(
        {
            **BASE,
            "sources": [
                {"name": "a", "paths": [str(tmp_path / "a*")], "weight": 1},
                {"name": "b", "paths": [str(tmp_path / "b*.jsonl")], "weight": 1},
            ],
        }
    )
    r = resolve(m)
    assert r.files == ((str(tmp_path / "a1.jsonl"), str(tmp_path / "a2.jsonl.gz")), (str(tmp_path / "b1.jsonl"),))
    assert r.to_dict()["sources"][0]["paths"] == list(r.files[0])
    clash = parse_mixture(
        {
            **BASE,
            "sources": [
                {"name": "a", "paths": [str(tmp_path / "*1.jsonl")], "weight": 1},
                {"name": "b", "paths": [str(tmp_path / "b*")], "weight": 1},
            ],
        }
    )
    with pytest.raises(MixtureError, match="matched by sources"):
        resolve(clash)
    with pytest.raises(MixtureError, match="matched no files"):
        resolve(parse_mixture({**BASE, "sources": [{"name": "a", "paths": [str(tmp_path / "zz*")], "weight": 1}]}))


@pytest.mark.parametrize(
    "name",
    [
        "rejects\n",
        "web\n",
        "Rejects",
        "DUPLICATES",
        "Manifest.JSON",
        "olmax-output.json",
        "a" * 129,
        "",
        ".hidden",
        "a b",
        "naïve",
    ],
)
def test_a_source_name_must_match_the_rule_in_full(name):
    with pytest.raises(MixtureError, match="name"):
        parse_mixture({**BASE, "sources": [{"name": name, "paths": ["p"], "weight": 1}]})


def test_source_names_that_differ_only_in_case_are_duplicates():
    # they are folder names: on a case-insensitive filesystem Web/ and web/ are one folder
    with pytest.raises(MixtureError, match="duplicate source names"):
        parse_mixture(
            {
                **BASE,
                "sources": [{"name": "Web", "paths": ["p"], "weight": 1}, {"name": "web", "paths": ["q"], "weight": 1}],
            }
        )


@pytest.mark.parametrize(
    "patch,msg",
    [
        ({"seq_len": MAX_SEQ_LEN + 1}, "seq_len"),
        ({"seq_len": 10**15}, "seq_len"),
        ({"seq_len": True}, "seq_len"),
        ({"heldout_fraction": float("nan")}, "heldout_fraction"),
        ({"sources": [{"name": "a", "paths": ["p"], "weight": 1, "max_repetition": float("inf")}]}, "max_repetition"),
        ({"name": "lone \ud800"}, "not valid Unicode"),
        ({"sources": [{"name": "a", "paths": ["x/\udcff*"], "weight": 1}]}, "not valid Unicode"),
    ],
)
def test_values_that_cannot_be_right_are_refused_before_the_job(patch, msg):
    with pytest.raises(MixtureError, match=msg):
        parse_mixture({**BASE, **patch})


def test_the_longest_accepted_seq_len_allocates_fine():
    from pipelines.pack import Packer

    assert parse_mixture({**BASE, "seq_len": MAX_SEQ_LEN}).seq_len == MAX_SEQ_LEN
    p = Packer(MAX_SEQ_LEN, 1, 0)
    assert p.add([5] * 10) == [] and len(p.finish()) == 4 * MAX_SEQ_LEN  # one PAD-filled example: 4 MiB


@pytest.mark.parametrize(
    "text,key,line",
    [
        ("name: m\nseed: 0\nname: n\n", "name", 3),
        ("sources:\n  - name: a\n    weight: 1\n    weight: 2\n", "weight", 4),
        ("dedup: true\n'dedup': false\n", "dedup", 2),
    ],
)
def test_a_duplicate_key_in_a_mixture_file_is_refused_with_its_line(tmp_path, text, key, line):
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(MixtureError, match=f":{line}: duplicate key '{key}' \\(first at line"):
        load_mixture(path)


def test_yaml_anchors_and_merges_still_load(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(
        "name: m\ntokenizer: dolma2\nseq_len: 16\nseed: 0\nheldout_fraction: 0.1\ndedup: false\n"
        "sources:\n  - &a {name: a, paths: ['x'], weight: 1}\n  - <<: *a\n    name: b\n"
    )
    assert [s.name for s in load_mixture(path).sources] == ["a", "b"]


def _two_sources(pa: str, pb: str):
    return parse_mixture(
        {**BASE, "sources": [{"name": "a", "paths": [pa], "weight": 1}, {"name": "b", "paths": [pb], "weight": 1}]}
    )


@pytest.mark.parametrize("spelling", ["dot", "dotdot", "symlink", "hardlink"])
def test_one_file_reached_by_two_spellings_in_two_sources_is_refused(tmp_path, spelling):
    import os

    (tmp_path / "in" / "sub").mkdir(parents=True)
    (tmp_path / "in" / "a.jsonl").write_text("")
    other = {
        "dot": tmp_path / "in" / "." / "a.jsonl",
        "dotdot": tmp_path / "in" / "sub" / ".." / "a.jsonl",
        "symlink": tmp_path / "link.jsonl",
        "hardlink": tmp_path / "hard.jsonl",
    }[spelling]
    if spelling == "symlink":
        os.symlink(tmp_path / "in" / "a.jsonl", other)
    elif spelling == "hardlink":
        os.link(tmp_path / "in" / "a.jsonl", other)
    with pytest.raises(MixtureError, match="matched by sources 'a' and 'b'"):
        resolve(_two_sources(str(tmp_path / "in" / "a.jsonl"), str(other)))
    # within one source the file is read once, under its first spelling
    one = parse_mixture(
        {**BASE, "sources": [{"name": "a", "paths": [str(tmp_path / "in" / "a.jsonl"), str(other)], "weight": 1}]}
    )
    assert resolve(one).files == ((str(tmp_path / "in" / "a.jsonl"),),)


def test_a_token_file_listed_twice_in_one_source_is_kept_twice_a_jsonl_file_once(tmp_path):
    """OLMo-core counts every line of a mix file (dolma17.txt lists a wiki file twice): a tokens
    source keeps each occurrence (one shard each); a jsonl file read twice would only add duplicates."""
    (tmp_path / "t").mkdir()
    for name in ("0.npy", "1.npy"):
        (tmp_path / "t" / name).write_bytes(b"")
    t0, t1 = str(tmp_path / "t" / "0.npy"), str(tmp_path / "t" / "1.npy")
    tokens = parse_mixture(
        {
            **BASE,
            "sources": [
                {"name": "a", "format": "tokens", "paths": [t0, t1, t0, str(tmp_path / "t" / "*.npy")], "weight": 1}
            ],
        }
    )
    assert resolve(tokens).files == ((t0, t1, t0, t0, t1),)
    (tmp_path / "a.jsonl").write_text("")
    jsonl = parse_mixture({**BASE, "sources": [{"name": "a", "paths": [str(tmp_path / "a.jsonl")] * 2, "weight": 1}]})
    assert resolve(jsonl).files == ((str(tmp_path / "a.jsonl"),),)


@pytest.mark.parametrize("kind", ["directory", "fifo", "non-utf8 name", "unreadable", "dangling symlink"])
def test_an_input_that_is_not_a_readable_file_stops_the_job_before_it_touches_the_output(tmp_path, kind, monkeypatch):
    import json
    import os

    from pipelines.tokenize import run

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "ok.jsonl").write_text('{"id": "1", "text": "fine"}\n')
    pattern = str(tmp_path / "in" / "*")
    if kind == "directory":
        (tmp_path / "in" / "dir.jsonl").mkdir()
        pattern = str(tmp_path / "in" / "dir.jsonl")  # a glob matches only files; a literal path can name a folder
    elif kind == "fifo":
        os.mkfifo(tmp_path / "in" / "pipe.jsonl")  # opening it would block forever
    elif kind == "non-utf8 name":
        (tmp_path / "in").joinpath(os.fsdecode(b"caf\xe9.jsonl")).write_text('{"id": "2", "text": "t"}\n')
    elif kind == "unreadable":
        (tmp_path / "in" / "secret.jsonl").write_text("{}\n")
        (tmp_path / "in" / "secret.jsonl").chmod(0)
        real_access = os.access  # root reads anything: make the check see what a normal user would
        monkeypatch.setattr(os, "access", lambda p, m: not str(p).endswith("secret.jsonl") and real_access(p, m))
    else:
        os.symlink(tmp_path / "gone.jsonl", tmp_path / "in" / "dangling.jsonl")
        pattern = str(tmp_path / "in" / "dangling.jsonl")  # (a glob skips it, as it skips folders)
    mixture = tmp_path / "m.yaml"
    mixture.write_text(json.dumps({**BASE, "sources": [{"name": "a", "paths": [pattern], "weight": 1}]}))
    out = tmp_path / "out"
    out.mkdir()
    manifest = {"format_version": 1, "record_format": "uint32-le[seq_len]", "sources": {"a": {}}}
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(
        MixtureError,
        match={
            "directory": "is a directory",
            "fifo": "not a regular file",
            "non-utf8 name": "not valid UTF-8",
            "unreadable": "not readable",
            "dangling symlink": "matched no files",
        }[kind],
    ):
        run(["--mixture", str(mixture), "--output", str(out)])
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json"]  # the earlier run's manifest survives


@pytest.mark.parametrize(
    "content,msg",
    [(None, "cannot read the mixture file"), (b"\xff\xfe", "not UTF-8"), (b"name: [unclosed", "not valid YAML")],
)
def test_a_mixture_file_that_cannot_be_read_is_a_clear_error(tmp_path, content, msg):
    path = tmp_path / "m.yaml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(MixtureError, match=msg):
        load_mixture(path)


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
    for bad in ("", "fasttok", 3):
        with pytest.raises(
            MixtureError,
            match=r"tokenizer_engine=.*(expected one of \['gigatoken', 'quicktok', 'tiktoken'\]|not a str)",
        ):
            parse_mixture({**BASE, "tokenizer_engine": bad})


@pytest.mark.parametrize(
    "patch,key",
    [
        ({"decontaminate": {"tasks": "d", "threshold": "0.8"}}, "decontaminate.threshold='0.8' is not a float"),
        ({"decontaminate": {"tasks": "d", "threshold": True}}, "decontaminate.threshold=True is not a float"),
        ({"heldout_fraction": "0.1"}, "heldout_fraction='0.1' is not a float"),
        ({"sources": [{"name": "a", "paths": ["p"], "weight": "1"}]}, "sources[0].weight='1' is not a float"),
        (
            {"sources": [{"name": "a", "paths": ["p"], "weight": 1, "max_repetition": "2"}]},
            "sources[0].max_repetition='2' is not a float",
        ),
        ({"tokenizer_crosscheck": "0.5"}, "tokenizer_crosscheck='0.5' is a string"),
        ({"seq_len": "16"}, "seq_len='16' is not a int"),
        ({"seed": "0"}, "seed='0' is not a int"),
    ],
)
def test_a_number_written_as_a_string_is_refused_as_a_bool_is(patch, key):
    """Before, a quoted "0.8" passed for the number 0.8 while `true` was refused."""
    with pytest.raises(MixtureError, match=re.escape(key)):
        parse_mixture({**BASE, **patch})


def test_numbers_in_a_mixture_file_are_yaml_1_2_floats_and_quoted_ones_strings(tmp_path):
    """`1e-1` (an exponent with no dot or sign) is a float in YAML 1.2 and a string in PyYAML's 1.1:
    read as the float it is, so that the strict fields need no string conversion."""
    text = Path(DEFAULT_MIXTURE).read_text()
    path = tmp_path / "m.yaml"
    path.write_text(f"{text}\ndecontaminate: {{tasks: d, threshold: 8e-1}}\ntokenizer_crosscheck: 5E-1\n")
    m = load_mixture(path)
    assert (m.decontaminate.threshold, m.tokenizer_crosscheck) == (0.8, 0.5)
    path.write_text(f'{text}\ndecontaminate: {{tasks: d, threshold: "0.8"}}\n')
    with pytest.raises(MixtureError, match=re.escape("decontaminate.threshold='0.8' is not a float")):
        load_mixture(path)
    assert parse_yaml("a: 3e-4\nb: 1.0e5\nc: '3e-4'\nd: 1e5x\n", "x") == {"a": 3e-4, "b": 1e5, "c": "3e-4", "d": "1e5x"}
    assert yaml.load("a: 3e-4", Loader=config_model.UniqueKeyLoader) == {"a": "3e-4"}  # other families: as before


def test_packing_defaults_to_concat_and_chunk_and_only_best_fit_is_recorded():
    assert parse_mixture(BASE).packing is None and "packing" not in parse_mixture(BASE).to_dict()
    concat = parse_mixture({**BASE, "packing": {"method": "concat"}})
    assert concat.packing is None and "packing" not in concat.to_dict()  # the manifest of stages 1-2 is unchanged
    best = parse_mixture({**BASE, "packing": {"method": "best_fit", "window": 8}})
    assert best.to_dict()["packing"] == {"method": "best_fit", "window": 8}
    assert parse_mixture({**BASE, "packing": {"method": "best_fit"}}).to_dict()["packing"]["window"] == 256


@pytest.mark.parametrize(
    "packing,msg",
    [
        ({"method": "first_fit"}, "method"),
        ({"method": "best_fit", "window": 0}, "window"),
        ({"method": "best_fit", "extra": 1}, "extra"),
    ],
)
def test_a_bad_packing_is_refused(packing, msg):
    with pytest.raises(MixtureError, match=msg):
        parse_mixture({**BASE, "packing": packing})


def test_a_best_fit_window_is_bounded_to_a_gibibyte_of_tokens():
    long = {**BASE, "seq_len": 65536}
    ok = parse_mixture({**long, "packing": {"method": "best_fit", "window": 4096}}).packing
    assert ok is not None and ok.window == 4096
    with pytest.raises(MixtureError, match="window 4097 × seq_len 65536 tokens is more than 268435456"):
        parse_mixture({**long, "packing": {"method": "best_fit", "window": 4097}})


def test_best_fit_packing_of_token_files_groups_them_and_states_truncation():
    tokens = {**BASE["sources"][0], "format": "tokens"}
    m = parse_mixture({**BASE, "packing": {"method": "best_fit"}, "sources": [tokens]})
    assert m.packing is not None and m.packing.group == 1  # OLMo-core's source_group_size default
    want = {"method": "best_fit", "window": 256, "group": 1, "long_docs": "truncate", "ties": "stable"}
    assert m.to_dict()["packing"] == want  # equal lengths in stream order: the same shards on every CPU
    m = parse_mixture(
        {**BASE, "packing": {"method": "best_fit", "group": 8, "long_docs": "truncate"}, "sources": [tokens]}
    )
    assert m.to_dict()["packing"]["group"] == 8


@pytest.mark.parametrize(
    "packing,sources,match",
    [
        ({"method": "concat", "group": 8}, "tokens", "are for method best_fit"),
        ({"method": "best_fit", "group": 8}, "jsonl", "for token files"),
        ({"method": "best_fit", "long_docs": "fragment"}, "tokens", "long_docs"),
        ({"method": "best_fit", "group": 0}, "tokens", "group"),
        ({"method": "best_fit"}, "heldout", "held out"),
    ],
)
def test_a_bad_token_file_packing_is_refused(packing, sources, match):
    src = dict(BASE["sources"][0])
    if sources != "jsonl":
        src["format"] = "tokens"
    if sources == "heldout":
        src["split"] = "heldout"
    with pytest.raises(MixtureError, match=match):
        parse_mixture({**BASE, "packing": packing, "sources": [src]})


def test_shard_compression_defaults_to_zstd_1_and_only_another_one_is_recorded():
    assert parse_mixture(BASE).shard_compression is None and "shard_compression" not in parse_mixture(BASE).to_dict()
    default = parse_mixture({**BASE, "shard_compression": "zstd:1"})  # written out: the same shards, same manifest
    assert default.shard_compression is None and default.to_dict() == parse_mixture(BASE).to_dict()
    for other in ("snappy", "uncompressed"):
        assert parse_mixture({**BASE, "shard_compression": other}).to_dict()["shard_compression"] == other


@pytest.mark.parametrize("value", ["zstd:3", "gzip", "", 1])
def test_a_shard_compression_outside_the_list_is_refused(value):
    with pytest.raises(MixtureError, match="shard_compression"):
        parse_mixture({**BASE, "shard_compression": value})
