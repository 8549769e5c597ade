"""`format: tokens` sources: OLMo-core token files → one shard each, counted, in listed order."""

from __future__ import annotations

import dataclasses
import filecmp
import gzip
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from array_record.python.array_record_module import ArrayRecordReader

from pipelines import token_files as tk
from pipelines.dolma2_tokenizer import EOS_ID, PAD_ID, VOCAB_SIZE
from pipelines.tokenize import run

L = 16
ORDINARY = 100256


def token_file(rng, n, mean_doc=9, end_with_eos=True):
    ids = rng.integers(0, ORDINARY, size=n, dtype=np.uint32)
    ends = np.cumsum(rng.integers(1, 2 * mean_doc, size=n))
    ids[ends[ends < n]] = EOS_ID
    if n and end_with_eos:
        ids[-1] = EOS_ID
    return ids


def expected_counts(ids, seq_len):
    """Independent of the converter: documents by EOS (+ a tail without one), and documents
    whose EOS is not in the kept instances (an id past the last whole instance, or no EOS)."""
    n, kept = len(ids), seq_len * (len(ids) // seq_len)
    eos = np.flatnonzero(ids == EOS_ID)
    starts = np.concatenate([[0], eos + 1])
    ends = np.concatenate([eos, [n - 1]])  # inclusive last id of each document
    docs = [(s, e) for s, e in zip(starts, ends) if s <= e and s < n]
    cut = sum(1 for s, e in docs if e >= kept or ids[e] != EOS_ID)
    return len(docs), cut


@pytest.mark.parametrize("n,chunk", [(0, 5), (7, 3), (16, 16), (100, 7), (333, 64), (1000, 1)])
def test_records_concatenated_are_the_files_whole_instances(n, chunk):
    ids = token_file(np.random.default_rng(n), n, end_with_eos=n % 2 == 0)
    conv = tk.TokenFileConverter(L, EOS_ID, VOCAB_SIZE)
    parts = [conv.feed(ids[i : i + chunk]) for i in range(0, n, chunk)]
    stats = conv.finish()
    got = np.concatenate(parts + [np.zeros((0, L), np.uint32)]).reshape(-1)
    assert np.array_equal(got, ids[: L * (n // L)])
    assert np.array_equal(tk.instances(ids, L).reshape(-1), got)
    docs, cut = expected_counts(ids, L)
    assert (stats.tokens, stats.records, stats.kept, stats.dropped) == (n, n // L, L * (n // L), n % L)
    assert (stats.documents, stats.documents_cut) == (docs, cut)


def test_a_file_ending_without_eos_on_an_instance_boundary_counts_its_last_document_as_cut():
    """No remainder, but the shard ends inside the file's last document (it goes on in the next
    file): it is one of the documents whose EOS the shards do not hold, as the audit counts them."""
    ids = token_file(np.random.default_rng(4), 3 * L, end_with_eos=False)
    conv = tk.TokenFileConverter(L, EOS_ID, VOCAB_SIZE)
    kept = conv.feed(ids)
    stats = conv.finish()
    assert stats.dropped == 0 and kept.reshape(-1)[-1] != EOS_ID
    assert stats.documents_cut == 1 and stats.documents == int(np.count_nonzero(ids == EOS_ID)) + 1
    assert int(np.count_nonzero(kept == EOS_ID)) == stats.documents - stats.documents_cut


@pytest.mark.parametrize("n", [3 * L, 3 * L + 5, 5 * L - 1, 7])
@pytest.mark.parametrize("end_with_eos", [True, False])
def test_a_heldout_file_keeps_its_remainders_whole_documents_and_drops_only_ids_after_its_last_eos(n, end_with_eos):
    ids = token_file(np.random.default_rng(n), n, mean_doc=4, end_with_eos=end_with_eos)
    conv = tk.TokenFileConverter(L, EOS_ID, VOCAB_SIZE, keep_remainder=True, pad_id=PAD_ID)
    kept = conv.feed(ids)
    stats = conv.finish()
    records = np.concatenate([kept] + ([] if conv.tail is None else [conv.tail[None]]))
    eos = np.flatnonzero(ids == EOS_ID)
    last = int(eos[-1]) + 1 if len(eos) else 0
    upto = max(last, L * (n // L))  # the whole instances, and every id up to the last EOS
    assert np.array_equal(records.reshape(-1)[:upto], ids[:upto]) and (records.reshape(-1)[upto:] == PAD_ID).all()
    assert (stats.records, stats.kept, stats.dropped, stats.padding) == (
        len(records),
        upto,
        n - upto,
        records.size - upto,
    )
    assert stats.documents_cut == int(ids[-1] != EOS_ID)  # only an unterminated last document is cut
    assert int(np.count_nonzero(records == EOS_ID)) == stats.documents - stats.documents_cut


@pytest.mark.parametrize("dtype", ["uint32", "uint16"])
def test_read_ids_reassembles_ids_split_across_reads(dtype):
    dt = tk.token_dtype(dtype)
    ids = np.arange(1000, dtype=dt)
    got = np.concatenate(list(tk.read_ids(io.BytesIO(ids.tobytes()), dt, chunk=7)))
    assert np.array_equal(got, ids)
    with pytest.raises(tk.TokenFileError, match="bad_token_file_size"):
        list(tk.read_ids(io.BytesIO(ids.tobytes() + b"\x01"), dt, chunk=7))


def test_an_id_past_the_vocabulary_is_a_reasoned_error():
    conv = tk.TokenFileConverter(L, EOS_ID, VOCAB_SIZE)
    conv.feed(np.array([1, 2, EOS_ID], np.uint32))
    with pytest.raises(tk.TokenFileError) as e:
        conv.feed(np.array([5, VOCAB_SIZE + 3], np.uint32))
    assert e.value.reason == "token_id_out_of_range" and "token 4" in e.value.detail


# -- the job ---------------------------------------------------------------------------------------


def write_csv_gz(path, rows):
    with gzip.open(path, "wt") as f:
        for i in range(rows):
            f.write(f"{i},{i + 1},doc{i},src,loc\n")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokcorpus")
    rng = np.random.default_rng(11)
    files = {}
    os.makedirs(root / "ai2" / "mix", exist_ok=True)
    # listed out of name order on purpose: the mixture's order is the instance order
    for name, n in [("c", 211), ("a", 9), ("b", 150)]:
        ids = token_file(rng, n)
        ids.astype("<u4").tofile(root / "ai2" / "mix" / f"{name}.npy")
        files[f"mix/{name}"] = ids
    docs, _ = expected_counts(files["mix/b"], L)
    write_csv_gz(root / "ai2" / "mix" / "b.csv.gz", docs)  # agrees: cross-checked, accepted
    os.makedirs(root / "ai2" / "val", exist_ok=True)
    files["val/v"] = token_file(rng, 70)
    files["val/v"].astype("<u4").tofile(root / "ai2" / "val" / "v.npy")
    os.makedirs(root / "ai2" / "bad", exist_ok=True)
    (root / "ai2" / "bad" / "0-size.npy").write_bytes(token_file(rng, 40).astype("<u4").tobytes() + b"\x00\x01")
    big = token_file(rng, 40)
    big[17] = VOCAB_SIZE
    big.astype("<u4").tofile(root / "ai2" / "bad" / "1-vocab.npy")
    token_file(rng, 40).astype("<u4").tofile(root / "ai2" / "bad" / "2-csv.npy")
    write_csv_gz(root / "ai2" / "bad" / "2-csv.csv.gz", 999)
    token_file(rng, 40).astype("<u4").tofile(root / "ai2" / "bad" / "3-gz.npy")
    (root / "ai2" / "bad" / "3-gz.csv.gz").write_bytes(b"not gzip at all")
    token_file(rng, 40).astype("<u4").tofile(root / "ai2" / "bad" / "4-ok.npy")  # good: 2 instances
    os.makedirs(root / "jsonl", exist_ok=True)
    texts = [f"document number {i} says {'word ' * (i % 7)}" for i in range(30)]
    (root / "jsonl" / "d.jsonl").write_text(
        "".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts))
    )
    # a held-out-only jsonl source; its first 5 texts also occur in "docs" (whose ids sort first)
    evals = texts[:5] + [f"evaluation text {i}" for i in range(6)]
    os.makedirs(root / "eval", exist_ok=True)
    (root / "eval" / "e.jsonl").write_text(
        "".join(json.dumps({"id": f"e{i}", "text": t}) + "\n" for i, t in enumerate(evals))
    )
    mixture = {
        "name": "tokens-test",
        "tokenizer": "dolma2",
        "seq_len": L,
        "seed": 0,
        "heldout_fraction": 0.2,
        "dedup": True,
        "sources": [
            {
                "name": "mix",
                "format": "tokens",
                "dtype": "uint32",
                "weight": 1.0,
                "paths": [str(root / "ai2" / "mix" / f"{x}.npy") for x in "cab"],
            },
            {"name": "docs", "paths": [str(root / "jsonl" / "*.jsonl")], "weight": 1.0},
            {"name": "evaljs", "split": "heldout", "weight": 1.0, "paths": [str(root / "eval" / "*.jsonl")]},
            {
                "name": "val",
                "format": "tokens",
                "split": "heldout",
                "weight": 1.0,
                "paths": [str(root / "ai2" / "val" / "*.npy")],
            },
            {"name": "bad", "format": "tokens", "weight": 1.0, "paths": [str(root / "ai2" / "bad" / "*.npy")]},
        ],
    }
    (root / "mixture.yaml").write_text(yaml.safe_dump(mixture, sort_keys=False))
    return {"root": root, "files": files, "mixture": root / "mixture.yaml", "texts": texts, "evals": evals}


def run_job(corpus, out, *flags):
    run(["--mixture", str(corpus["mixture"]), "--output", str(out), *flags])
    return json.loads((out / "manifest.json").read_text())


@pytest.fixture(scope="module")
def job(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("tokout1")
    return out, run_job(corpus, out, "--direct_num_workers=1")


def records(out, manifest, source, split):
    rows = []
    for shard in manifest["sources"][source]["splits"][split]["shards"]:
        reader = ArrayRecordReader(str(out / shard["path"]))
        rows += [np.frombuffer(r, "<u4") for r in (reader.read_all() if reader.num_records() else [])]
        reader.close()
    return rows


def test_each_token_file_is_one_shard_of_its_instances_in_listed_order(corpus, job):
    out, m = job
    shards = m["sources"]["mix"]["splits"]["train"]["shards"]
    want = [tk.instances(corpus["files"][f"mix/{x}"], L) for x in "cab"]
    assert [s["records"] for s in shards] == [len(w) for w in want] == [211 // L, 0, 150 // L]
    for shard, w in zip(shards, want):
        reader = ArrayRecordReader(str(out / shard["path"]))
        got = [np.frombuffer(r, "<u4") for r in (reader.read_all() if reader.num_records() else [])]
        reader.close()
        assert np.array_equal(np.array(got).reshape(-1, L), w)
    assert [s["paths"] for s in m["mixture"]["sources"] if s["name"] == "mix"][0] == [
        str(corpus["root"] / "ai2" / "mix" / f"{x}.npy") for x in "cab"
    ]


def test_remainder_is_counted_and_accounting_adds_up(corpus, job):
    _, m = job
    entry = m["sources"]["mix"]
    docs = [expected_counts(corpus["files"][f"mix/{x}"], L) for x in "cab"]
    lengths = [len(corpus["files"][f"mix/{x}"]) for x in "cab"]
    assert entry["remainder"] == {"tokens": sum(n % L for n in lengths), "documents": sum(c for _, c in docs)}
    assert entry["counts"]["documents"] == entry["counts"]["train"] == sum(d for d, _ in docs)
    assert entry["tokens"] == {"train": sum(L * (n // L) for n in lengths), "heldout": 0, "padding": 0}
    for name, e in m["sources"].items():
        c = e["counts"]
        assert c["documents"] == c["train"] + c["heldout"] + c["duplicates"] + sum(c["rejected"].values()), name
    assert "remainder" not in m["sources"]["docs"]


def test_each_bad_token_file_is_rejected_whole_with_its_reason(corpus, job):
    out, m = job
    bad = m["sources"]["bad"]
    assert bad["counts"]["rejected"] == {
        "bad_token_file_size": 1,
        "token_id_out_of_range": 1,
        "document_count_mismatch": 1,
        "unreadable_file": 1,
        "numpy_header": 0,
        "pad_id_in_document": 0,
    }
    rows = [json.loads(line) for line in (out / "rejects" / "bad.jsonl").read_text().splitlines()]
    assert [(Path(r["file"]).name, r["reason"]) for r in rows] == [
        ("0-size.npy", "bad_token_file_size"),
        ("1-vocab.npy", "token_id_out_of_range"),
        ("2-csv.npy", "document_count_mismatch"),
        ("3-gz.npy", "unreadable_file"),
    ]
    assert [s["records"] for s in bad["splits"]["train"]["shards"]] == [0, 0, 0, 0, 40 // L]
    assert bad["counts"]["documents"] == 4 + bad["counts"]["train"]


def test_a_heldout_source_is_all_heldout_and_never_trained_on(corpus, job):
    out, m = job
    val = m["sources"]["val"]
    assert val["splits"]["train"]["examples"] == 0 and val["counts"]["train"] == 0
    ids = corpus["files"]["val/v"]
    whole = tk.instances(ids, L)
    rest = ids[whole.size :]
    cut = int(np.flatnonzero(rest == EOS_ID)[-1]) + 1  # the fixture's file ends with EOS
    tail = np.full((1, L), PAD_ID, np.uint32)
    tail[0, :cut] = rest[:cut]
    # OLMo-core's instances, then the remainder's whole documents in one PAD-filled record: the
    # evaluator reads every document of a validation file (dataloader.heldout)
    assert 0 < cut < L and np.array_equal(
        np.array(records(out, m, "val", "heldout")).reshape(-1, L), np.concatenate([whole, tail])
    )
    shard_padding = L - cut
    assert val["tokens"]["heldout"] == len(ids) and val["tokens"]["padding"] == shard_padding
    assert val.get("remainder", {"tokens": 0, "documents": 0}) == {"tokens": 0, "documents": 0}
    from dataloader import LoaderConfig, make_loader
    from dataloader.loader import load_plan

    cfg = LoaderConfig(data=[str(out / "manifest.json")], global_batch_size=2, seed=1, prefetch=0)
    _, plan = load_plan(cfg)
    val_ordinal = [s.name for s in plan.sources].index("val")
    assert plan.counts[val_ordinal] == 0
    it = make_loader(cfg, 0, 1)
    seen = {int(e) >> 40 for _ in range(plan.size) for e in next(it)["example"]}
    assert val_ordinal not in seen and {0, 1} <= seen  # the tokens and the jsonl source are read


@pytest.mark.slow
def test_one_and_two_workers_write_byte_identical_output(corpus, job, tmp_path):
    out1, m1 = job
    out2 = tmp_path / "out2"
    m2 = run_job(corpus, out2, "--direct_num_workers=2", "--direct_running_mode=multi_processing")
    assert m1 == m2
    cmp = filecmp.dircmp(out1, out2)
    assert not cmp.left_only and not cmp.right_only
    for sub in [".", "mix", "val", "bad", "docs", "evaljs", "rejects", "duplicates"]:
        names = sorted(os.listdir(out1 / sub))
        match, mismatch, errors = filecmp.cmpfiles(
            out1 / sub, out2 / sub, [n for n in names if (out1 / sub / n).is_file()], shallow=False
        )
        assert not mismatch and not errors, (sub, mismatch, errors)


def test_mixture_keys_are_validated():
    from pipelines.mixture import MixtureError, parse_mixture

    base = {"name": "x", "tokenizer": "dolma2", "seq_len": 8, "seed": 0, "heldout_fraction": 0.1, "dedup": False}
    with pytest.raises(MixtureError, match="format"):
        parse_mixture({**base, "sources": [{"name": "a", "paths": ["x"], "weight": 1, "format": "npy"}]})
    with pytest.raises(MixtureError, match="dtype"):
        parse_mixture({**base, "sources": [{"name": "a", "paths": ["x"], "weight": 1, "dtype": "uint32"}]})
    with pytest.raises(MixtureError, match="dedup: true"):
        parse_mixture(
            {
                **base,
                "sources": [
                    {"name": "a", "paths": ["x"], "weight": 1, "split": "heldout"},
                    {"name": "b", "paths": ["y"], "weight": 1},
                ],
            }
        )
    m = parse_mixture({**base, "sources": [{"name": "a", "paths": ["x"], "weight": 1, "format": "tokens"}]})
    assert m.sources[0].dtype == "uint32" and m.to_dict()["sources"][0]["format"] == "tokens"


def test_the_olmo_core_order_refuses_data_with_rejected_token_files(job, tmp_path):
    from dataloader import LoaderConfig
    from dataloader.loader import load_plan

    out, _ = job
    with pytest.raises(ValueError, match="'bad': 4 token file"):
        load_plan(
            LoaderConfig(
                data=[str(out / "manifest.json")], global_batch_size=2, order="olmo-core", order_cache=str(tmp_path)
            )
        )
    # the same files as a held-out source: not numbered by OLMo-core's training order, so accepted
    from contract import with_fingerprint

    m = json.loads((out / "manifest.json").read_text())
    bad = m["sources"]["bad"]
    bad["splits"]["train"], bad["splits"]["heldout"] = bad["splits"]["heldout"], bad["splits"]["train"]
    bad["tokens"]["train"], bad["tokens"]["heldout"] = 0, bad["tokens"]["train"]
    next(s for s in m["mixture"]["sources"] if s["name"] == "bad")["split"] = "heldout"
    held = tmp_path / "held"
    held.mkdir()
    (held / "manifest.json").write_text(json.dumps(with_fingerprint(m)))
    for name in m["sources"]:
        (held / name).symlink_to(out / name)
    _, plan = load_plan(
        LoaderConfig(
            data=[str(held / "manifest.json")], global_batch_size=2, order="olmo-core", order_cache=str(tmp_path)
        )
    )
    assert dict(zip([s.name for s in plan.sources], plan.counts))["bad"] == 0


@pytest.mark.parametrize("tail", [b"\n", b""])
def test_csv_rows_are_counted_streaming_with_or_without_a_last_newline(tail):
    text = "".join(f"{i},{i + 1},d{i},s,l\n" for i in range(100_000)).encode()[:-1] + tail
    assert tk.count_csv_rows(io.BytesIO(gzip.compress(text))) == 100_000


def test_a_heldout_jsonl_source_keeps_its_copies_and_theirs_elsewhere_are_removed(corpus, job):
    from pipelines.dolma2_tokenizer import dolma2
    from tests.pipelines.test_job import docs_of

    out, m = job
    ev, docs = m["sources"]["evaljs"], m["sources"]["docs"]
    assert ev["counts"]["heldout"] == len(corpus["evals"]) and ev["counts"]["train"] == 0
    assert ev["counts"]["duplicates"] == 0 and docs["counts"]["duplicates"] == 5  # docs' ids sort first
    enc = dolma2()
    heldout = {enc.decode(d) for d in docs_of(records(out, m, "evaljs", "heldout"))}
    train = {enc.decode(d) for s in ("docs",) for d in docs_of(records(out, m, s, "train"))}
    assert heldout == set(corpus["evals"]) and not heldout & train


def test_dedup_keeps_the_copy_in_a_heldout_source():
    from pipelines.job import Copy
    from pipelines.split import choose_kept

    copies = [Copy("a", "1", "f", 1), Copy("z", "9", "g", 2)]
    assert choose_kept(copies)[0].source == "a"
    kept, dups = choose_kept(copies, frozenset({"z"}))
    assert kept.source == "z" and [d.source for d in dups] == ["a"]


def test_the_audit_passes_the_jobs_output_with_tokens_and_heldout_sources(job, tmp_path):
    from audit import AuditConfig, run_audit

    out, _ = job
    results, _ = run_audit(
        AuditConfig(data=str(out / "manifest.json"), out=str(tmp_path / "report"), global_batch_size=2)
    )
    res = {r.name: r for r in results}
    # no --run: the run check is skipped; no --eval-tasks: eval leakage is not run
    assert {k: r.passed for k, r in res.items() if k not in ("run", "task_contamination")} == dict.fromkeys(
        ("integrity", "accounting", "mixture", "sharding", "contamination", "statistics"), True
    ), {k: r.failures[:3] for k, r in res.items() if not r.passed}
    assert res["task_contamination"].passed is None
    assert res["integrity"].figures["records_checked"] == sum(
        s["records"] for e in job[1]["sources"].values() for sp in e["splits"].values() for s in sp["shards"]
    )


def test_a_uint16_file_converts_to_the_same_ids_as_uint32_records(tmp_path):
    eos = 50000  # a 16-bit vocabulary's EOS (the dolma2 ids do not fit uint16)
    ids = np.random.default_rng(5).integers(0, eos, size=1000).astype("<u2")
    ids[::37] = eos
    ids.tofile(tmp_path / "f.npy")
    stats, _ = tk.convert_file(
        str(tmp_path / "f.npy"), str(tmp_path / "f.arrayrecord"), tk.token_dtype("uint16"), L, eos, 65536
    )
    reader = ArrayRecordReader(str(tmp_path / "f.arrayrecord"))
    got = np.array([np.frombuffer(r, "<u4") for r in reader.read_all()])
    reader.close()
    assert np.array_equal(got, tk.instances(ids.astype(np.uint32), L)) and got.shape == (1000 // L, L)
    assert stats.documents == int((ids == eos).sum()) + int(ids[-1] != eos)


def test_a_token_file_converts_to_the_same_records_with_any_shard_compression(tmp_path):
    ids = (np.random.default_rng(6).integers(0, 300, size=4000) % 300).astype("<u4")
    ids[::41] = EOS_ID
    ids.tofile(tmp_path / "f.npy")
    got = {}
    for compression in ("zstd:1", "uncompressed"):
        dest = tmp_path / f"{compression.replace(':', '')}.arrayrecord"
        tk.convert_file(
            str(tmp_path / "f.npy"), str(dest), tk.token_dtype("uint32"), L, EOS_ID, VOCAB_SIZE, compression=compression
        )
        reader = ArrayRecordReader(str(dest))
        got[compression] = (reader.read_all(), compression in reader.writer_options_string())
        reader.close()
    (zstd, zstd_said), (plain, plain_said) = got.values()  # 64-byte records: sizes alike (one chunk each)
    assert zstd == plain and len(zstd) == 4000 // L and zstd_said and plain_said


# -- unreadable token files --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "directory", "permission denied", "vanished"])
def test_a_token_file_no_longer_readable_is_one_unreadable_file_reject_not_a_crash_or_a_hang(
    tmp_path, kind, monkeypatch
):
    # `resolve` refuses these before the job runs (next test); a worker that meets one later (the
    # file changed in between) rejects the file whole, with empty shards, as jsonl inputs are
    import signal

    from apache_beam.io.filesystems import FileSystems

    path = tmp_path / "f.npy"
    if kind == "fifo":
        os.mkfifo(path)  # opening it would block forever
    elif kind == "directory":
        path.mkdir()
    elif kind == "permission denied":
        token_file(np.random.default_rng(0), 40).astype("<u4").tofile(path)

        def denied(*_a, **_k):
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(FileSystems, "open", denied)  # root reads any file: simulate what a user meets
    out = tmp_path / "out"
    os.makedirs(out / "src")
    dofn = tk.ConvertTokenFile(str(out), L, EOS_ID, VOCAB_SIZE, {"src": "uint32"}, frozenset(), PAD_ID)
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the converter blocked"))
    signal.alarm(10)
    try:
        outputs = list(dofn.process(("src", str(path), 0, 1)))
    finally:
        signal.alarm(0)
    shards = [o for o in outputs if isinstance(o, dict)]
    tagged = [(o.tag, o.value) for o in outputs if not isinstance(o, dict)]
    assert [(s["split"], s["records"], s["documents"]) for s in shards] == [("train", 0, 0), ("heldout", 0, 0)]
    rejects = [v[1] for t, v in tagged if t == "rejects"]
    assert [(r.file, r.reason) for r in rejects] == [(str(path), "unreadable_file")]
    assert sorted(v for t, v in tagged if t == "tally") == [
        (("src", "documents"), 1),
        (("src", "rejected/unreadable_file"), 1),
    ]


@pytest.mark.parametrize("kind", ["fifo", "unreadable"])
def test_an_unreadable_token_file_stops_the_job_before_it_touches_the_output(tmp_path, kind, monkeypatch):
    from pipelines.mixture import MixtureError

    (tmp_path / "in").mkdir()
    token_file(np.random.default_rng(1), 40).astype("<u4").tofile(tmp_path / "in" / "0-ok.npy")
    bad = tmp_path / "in" / "1-bad.npy"
    if kind == "fifo":
        os.mkfifo(bad)
    else:
        token_file(np.random.default_rng(2), 40).astype("<u4").tofile(bad)
        bad.chmod(0)
        real_access = os.access  # root reads anything: make the check see what a normal user would
        monkeypatch.setattr(os, "access", lambda p, m: str(p) != str(bad) and real_access(p, m))
    mixture = {
        "name": "t",
        "tokenizer": "dolma2",
        "seq_len": L,
        "seed": 0,
        "heldout_fraction": 0.0,
        "dedup": False,
        "sources": [{"name": "a", "format": "tokens", "weight": 1.0, "paths": [str(tmp_path / "in" / "*.npy")]}],
    }
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(mixture))
    out = tmp_path / "out"
    with pytest.raises(
        MixtureError, match=f"{bad}.*" + {"fifo": "not a regular file", "unreadable": "not readable"}[kind]
    ):
        run(["--mixture", str(tmp_path / "m.yaml"), "--output", str(out)])
    assert not out.exists() or not any(out.iterdir())


# -- held-out token sources and the audit's contamination check ------------------------------------


def test_a_heldout_token_document_also_in_a_training_token_file_fails_the_audit_naming_it(tmp_path):
    from audit import AuditConfig, run_audit

    rng = np.random.default_rng(21)

    def docs(*lengths):  # documents of these lengths, each followed by EOS
        return [np.append(rng.integers(0, ORDINARY, size=n, dtype=np.uint32), np.uint32(EOS_ID)) for n in lengths]

    shared = docs(11)[0]  # one document (with its EOS), in both files
    val = np.concatenate(docs(5, 7) + [shared] + docs(9)).astype("<u4")  # held-out document 2
    train = np.concatenate(docs(6, 3, 9, 12, 2) + [shared] + docs(20, 4)).astype("<u4")  # training document 5
    (tmp_path / "in").mkdir()
    val.tofile(tmp_path / "in" / "val.npy")
    train.tofile(tmp_path / "in" / "train.npy")
    # each copy lies inside its file's whole instances (not in the dropped remainder)
    assert L * (len(val) // L) >= 6 + 8 + 12 and L * (len(train) // L) >= 7 + 4 + 10 + 13 + 3 + 12
    mixture = {
        "name": "t",
        "tokenizer": "dolma2",
        "seq_len": L,
        "seed": 0,
        "heldout_fraction": 0.0,
        "dedup": False,
        "sources": [
            {"name": "train", "format": "tokens", "weight": 1.0, "paths": [str(tmp_path / "in" / "train.npy")]},
            {
                "name": "val",
                "format": "tokens",
                "split": "heldout",
                "weight": 1.0,
                "paths": [str(tmp_path / "in" / "val.npy")],
            },
        ],
    }
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(mixture))
    out = tmp_path / "out"
    run(["--mixture", str(tmp_path / "m.yaml"), "--output", str(out), "--direct_num_workers=1"])
    results, _ = run_audit(
        AuditConfig(data=str(out / "manifest.json"), out=str(tmp_path / "report"), global_batch_size=2)
    )
    c = {r.name: r for r in results}["contamination"]
    assert not c.passed and c.figures["exact_overlap"] == 1
    # ordinals count each split's documents from 0
    assert c.failures[0] == (
        "training document 5 of train/train (ends in train/train-00000-of-00001.arrayrecord) "
        "is an exact copy of held-out document 2 of val/heldout (ends in "
        "val/heldout-00000-of-00001.arrayrecord)"
    )
    assert "is an exact copy of held-out document 2 of val/heldout" in c.summary


def test_a_shards_bytes_do_not_depend_on_the_read_size(tmp_path, monkeypatch):
    """READ_TOKENS is a speed/memory setting only: reads that split instances anywhere give
    the same shard bytes and stats."""
    ids = token_file(np.random.default_rng(11), 1003)
    ids.astype("<u4").tofile(tmp_path / "f.npy")
    got = set()
    for read_tokens in (1, 7, L, 3 * L + 5, 1 << 20):
        monkeypatch.setattr(tk, "READ_TOKENS", read_tokens)
        stats, sha = tk.convert_file(
            str(tmp_path / "f.npy"),
            str(tmp_path / f"{read_tokens}.arrayrecord"),
            tk.token_dtype("uint32"),
            L,
            EOS_ID,
            VOCAB_SIZE,
        )
        got.add((sha, dataclasses.astuple(stats)))
    assert len(got) == 1
    assert next(iter(got))[1][:2] == (len(ids), len(ids) // L)  # (tokens, records)
