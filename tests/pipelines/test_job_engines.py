"""The job's encoder engines (issue 12): the same bytes whichever engine computes the ids, the
engine recorded outside the fingerprint, and a wrong id failing the job (never a reject)."""

from __future__ import annotations

import filecmp
import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from .fixtures import _run_job, _run_job_with_counters, make_corpus

SAMPLE_MIXTURE = Path(__file__).resolve().parents[2] / "data_manifests" / "mixtures" / "sample.yaml"


@pytest.fixture(scope="module")
def job_out_tiktoken(corpus, tmp_path_factory):
    """The conftest job (one worker) with the reference engine instead of the default."""
    return _run_job(corpus, tmp_path_factory.mktemp("out-tiktoken"), "--tokenizer_engine=tiktoken")


@pytest.mark.slow
def test_engines_write_byte_identical_shards_and_the_same_fingerprint(job_out, job_out_tiktoken):
    files = sorted(str(p.relative_to(job_out)) for p in job_out.rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(job_out_tiktoken)) for p in job_out_tiktoken.rglob("*") if p.is_file())
    assert any(f.endswith(".arrayrecord") for f in files)
    data = [f for f in files if f != "manifest.json"]
    _, mismatch, errors = filecmp.cmpfiles(job_out, job_out_tiktoken, data, shallow=False)
    assert mismatch == [] and errors == []
    m_quick = json.loads((job_out / "manifest.json").read_text())
    m_tik = json.loads((job_out_tiktoken / "manifest.json").read_text())
    assert m_quick["build"]["tokenizer_engine"] == "quicktok"  # the default
    assert m_quick["build"]["tokenizer_engine_version"] == "0.4.0"
    assert m_quick["build"]["crosscheck"]["reference"] == "tiktoken" and m_quick["build"]["crosscheck"]["rate"] == 0.01
    assert m_tik["build"]["tokenizer_engine"] == "tiktoken" and m_tik["build"]["crosscheck"] is None
    assert m_tik["build"]["exactness"] is None  # the reference is not checked against itself
    # everything but `build` is the same, byte for byte, fingerprint included
    assert m_quick["fingerprint"] == m_tik["fingerprint"]
    del m_quick["build"], m_tik["build"]
    assert m_quick == m_tik


def _wrong_on(marker: str):
    """A test double: quicktok, except that the 4th id of any text containing `marker` is off by one."""
    from pipelines.dolma2_tokenizer import _quicktok_engine

    good = _quicktok_engine()

    def encode_batch(texts):
        ids, offsets = good.encode_batch(texts)
        ids = ids.copy()
        for i, t in enumerate(texts):
            if marker in t:
                ids[offsets[i] + 3] += 1
        return ids, offsets

    return replace(good, name="wrong", encode_batch=encode_batch)


def test_an_engine_giving_a_wrong_id_fails_the_job_naming_the_document(corpus, tmp_path, monkeypatch):
    from pipelines import dolma2_tokenizer as tk
    from pipelines.tokenize import run

    # the "special" document (conftest) in web/a.jsonl; its line, found independently
    lines = (corpus.root / "web" / "a.jsonl").read_bytes().split(b"\n")
    [line] = [n for n, raw in enumerate(lines, start=1) if b'"id": "special"' in raw]
    monkeypatch.setitem(tk.ENGINES, "wrong-for-test", lambda _vocab: _wrong_on("keep <|endoftext|> as text"))
    out = tmp_path / "out"
    # "keep <|endoftext|>…" is keep | <| | endo | ft…: the 4th id starts at character 11
    with pytest.raises(
        tk.TokenizerMismatch,
        match=rf"document 'special' at {corpus.root}/web/a.jsonl:{line}: first difference at token 3 \(character 11,",
    ):
        run(
            [
                "--mixture",
                str(corpus.mixture_path),
                "--output",
                str(out),
                "--tokenizer_engine=wrong-for-test",
                "--tokenizer_crosscheck=all",
            ]
        )
    assert not (out / "manifest.json").exists()  # failed, not rejected: no manifest


def test_an_engine_giving_a_special_id_fails_the_job_even_unsampled(corpus, tmp_path, monkeypatch):
    # a special id from text would silently end a document early: checked on every document
    from dataclasses import replace as dc_replace

    from pipelines import dolma2_tokenizer as tk
    from pipelines.tokenize import run

    good = tk._quicktok_engine()

    def eos_for_text(texts):
        ids, offsets = good.encode_batch(texts)
        hit = [i for i, t in enumerate(texts) if t == "an exact repeated line"]
        ids = ids.copy()
        for i in hit:
            ids[offsets[i]] = tk.EOS_ID
        return ids, offsets

    monkeypatch.setitem(tk.ENGINES, "eos-for-test", lambda _vocab: dc_replace(good, encode_batch=eos_for_text))
    with pytest.raises(tk.TokenizerMismatch, match=r"document 'rep' at .*/web/b.jsonl.gz:\d+"):
        run(
            [
                "--mixture",
                str(corpus.mixture_path),
                "--output",
                str(tmp_path / "out"),
                "--tokenizer_engine=eos-for-test",
                "--tokenizer_crosscheck=0",
            ]
        )


def test_a_corrupted_engine_is_refused_before_the_job_starts(corpus, tmp_path, monkeypatch, capsys):
    from pipelines import dolma2_tokenizer as tk
    from pipelines.tokenize import run

    good = tk._quicktok_engine()

    def token_bytes(rank):
        return b" teh" if rank == 279 else good.token_bytes(rank)

    monkeypatch.setitem(tk.ENGINES, "corrupt-for-test", lambda _vocab: replace(good, token_bytes=token_bytes))
    with pytest.raises(tk.VocabularyError, match="rank 279 is b' teh', cl100k has b' the'"):
        run(
            [
                "--mixture",
                str(corpus.mixture_path),
                "--output",
                str(tmp_path / "out"),
                "--tokenizer_engine=corrupt-for-test",
            ]
        )
    assert not (tmp_path / "out").exists()
    # the command line says so in one line and exits 2, no traceback
    from pipelines.tokenize import main

    assert (
        main(
            [
                "--mixture",
                str(corpus.mixture_path),
                "--output",
                str(tmp_path / "out"),
                "--tokenizer_engine=corrupt-for-test",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "error: " in err and "rank 279" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def _sampled_at(rate: float, text: str) -> bool:
    """Written out here, not taken from the pipeline: the default sample is bytes 8..16 of the
    text's sha256, big-endian, below `rate` of 2**64."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[8:16], "big") < rate * 2**64


@pytest.fixture(scope="module")
def sampled_corpus(tmp_path_factory):
    """The conftest corpus plus web/e.jsonl: an unsampled document, then two that the DEFAULT
    cross-check rate samples (found by trying texts), so that a default job must check them."""
    from pipelines.dolma2_tokenizer import DEFAULT_CROSSCHECK

    assert 0 < DEFAULT_CROSSCHECK < 1  # a sample, not every document: that is the point here
    corpus = make_corpus(tmp_path_factory.mktemp("corpus-sampled"))
    texts = (f"this document is in the default cross-check sample, try {n}" for n in range(100_000))
    sampled = [t for t in texts if _sampled_at(DEFAULT_CROSSCHECK, t)][:2]
    unsampled = next(
        t for t in (f"and this one is not, try {n}" for n in range(100)) if not _sampled_at(DEFAULT_CROSSCHECK, t)
    )
    docs = [("e-out", unsampled), ("e-in-1", sampled[0]), ("e-in-2", sampled[1])]
    (corpus.root / "web" / "e.jsonl").write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in docs))
    corpus.good.extend(("web", i, t) for i, t in docs)
    return corpus, sampled


@pytest.mark.slow
def test_the_default_cross_check_checks_exactly_the_sampled_documents(sampled_corpus, tmp_path):
    corpus, sampled = sampled_corpus
    out, counters = _run_job_with_counters(corpus, tmp_path / "out", "--direct_num_workers=1")
    build = json.loads((out / "manifest.json").read_text())["build"]
    from pipelines.dolma2_tokenizer import DEFAULT_CROSSCHECK

    assert build["tokenizer_engine"] == "quicktok" and build["crosscheck"]["rate"] == DEFAULT_CROSSCHECK
    # every document the job encodes (each kept text once) whose hash falls in the sample, by source
    want: dict[str, int] = {}
    for text, (source, _) in corpus.kept().items():
        want[source] = want.get(source, 0) + _sampled_at(DEFAULT_CROSSCHECK, text)
    assert want["web"] >= len(sampled)  # the two added documents at least
    got = {s: counters.get(f"{s}/crosschecked", 0) for s in want}
    assert got == want
    # the manifest says how many, per source (0 for one with nothing kept)
    sources = json.loads((out / "manifest.json").read_text())["sources"]
    assert build["crosscheck"]["documents"] == {**dict.fromkeys(sources, 0), **want}


@pytest.mark.slow
def test_a_wrong_id_in_a_sampled_document_fails_a_default_job(sampled_corpus, tmp_path, monkeypatch):
    from pipelines import dolma2_tokenizer as tk
    from pipelines.tokenize import run

    corpus, sampled = sampled_corpus
    monkeypatch.setitem(
        tk.ENGINES, tk.DEFAULT_ENGINE, lambda _vocab: _wrong_on(sampled[1])
    )  # the default engine, now wrong
    tk.get_engine.cache_clear()  # engines are loaded once per process: forget the good one…
    out = tmp_path / "out"
    try:
        with pytest.raises(
            tk.TokenizerMismatch,
            match=rf"document 'e-in-2' at {corpus.root}/web/e.jsonl:3: first difference at token 3",
        ):
            run(["--mixture", str(corpus.mixture_path), "--output", str(out)])  # no engine or cross-check flag
    finally:
        tk.get_engine.cache_clear()  # …and the wrong one
    assert not (out / "manifest.json").exists()


def _mixture_with(corpus, tmp: Path, **settings) -> Path:
    import yaml

    path = tmp / "mixture.yaml"
    path.write_text(yaml.safe_dump({**yaml.safe_load(corpus.mixture_path.read_text()), **settings}, sort_keys=False))
    return path


def test_engine_settings_in_the_mixture_file_reach_the_manifest(corpus, tmp_path):
    from pipelines.tokenize import run

    tik = _mixture_with(corpus, tmp_path, tokenizer_engine="tiktoken")
    run(["--mixture", str(tik), "--output", str(tmp_path / "tik")])
    build = json.loads((tmp_path / "tik" / "manifest.json").read_text())["build"]
    assert build["tokenizer_engine"] == "tiktoken" and build["crosscheck"] is None
    every = _mixture_with(corpus, tmp_path, tokenizer_crosscheck="all")
    run(["--mixture", str(every), "--output", str(tmp_path / "all")])
    build = json.loads((tmp_path / "all" / "manifest.json").read_text())["build"]
    assert build["tokenizer_engine"] == "quicktok" and build["crosscheck"]["rate"] == "all"


@pytest.mark.slow
def test_every_engine_writes_byte_identical_shards_of_the_embedded_sample(tmp_path):
    """The embedded sample (code, docstrings, math) through the whole job with each engine: every
    file but the manifest byte for byte the same, the manifest the same but for `build`."""
    from pipelines.dolma2_tokenizer import ENGINES
    from pipelines.tokenize import run

    outs = {}
    for engine in ("quicktok", "gigatoken", "tiktoken"):
        assert engine in ENGINES
        outs[engine] = tmp_path / engine
        run(["--mixture", str(SAMPLE_MIXTURE), "--output", str(outs[engine]), f"--tokenizer_engine={engine}"])
    ref = outs["tiktoken"]
    files = sorted(str(p.relative_to(ref)) for p in ref.rglob("*") if p.is_file())
    assert sum(f.endswith(".arrayrecord") for f in files) >= 6
    manifests = {}
    for engine, out in outs.items():
        assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == files
        data = [f for f in files if f != "manifest.json"]
        _, mismatch, errors = filecmp.cmpfiles(ref, out, data, shallow=False)
        assert mismatch == [] and errors == [], engine
        manifests[engine] = json.loads((out / "manifest.json").read_text())
    builds = {e: m.pop("build") for e, m in manifests.items()}
    assert manifests["quicktok"] == manifests["gigatoken"] == manifests["tiktoken"]
    giga = builds["gigatoken"]
    assert (giga["tokenizer_engine"], giga["tokenizer_engine_version"]) == ("gigatoken", "0.10.0")
    assert giga["exactness"]["identical"] == giga["exactness"]["documents"] >= 40
    assert sum(giga["crosscheck"]["documents"].values()) > 0


def test_an_engine_wrong_on_the_exactness_corpus_is_refused_before_the_job_starts(corpus, tmp_path, monkeypatch):
    from bench.exactness_corpus import read_fixture
    from pipelines import dolma2_tokenizer as tk
    from pipelines.tokenize import run

    docs = read_fixture(Path(tk.__file__).parent / tk.EXACTNESS_CORPUS)
    line, doc = next((n, d) for n, d in enumerate(docs, start=1) if d["id"].startswith("rtl-") and len(d["text"]) > 100)
    # wrong only on that document of the exactness corpus: none of the job's own documents has it
    monkeypatch.setitem(tk.ENGINES, "rtl-wrong-for-test", lambda _vocab: _wrong_on(doc["text"][:60]))
    out = tmp_path / "out"
    with pytest.raises(
        tk.TokenizerMismatch,
        match=rf"document '{doc['id']}' at pipelines/data/exactness.jsonl.gz:{line}: first difference at token 3",
    ):
        run(["--mixture", str(corpus.mixture_path), "--output", str(out), "--tokenizer_engine=rtl-wrong-for-test"])
    assert not out.exists()
