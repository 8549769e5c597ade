"""End-to-end properties of `python -m pipelines.tokenize` on a generated corpus (see conftest)."""

from __future__ import annotations

import collections
import filecmp
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from array_record.python.array_record_module import ArrayRecordReader

from pipelines.dolma2_tokenizer import EOS_ID, PAD_ID, SPECIAL_TOKENS, dolma2

from .fixtures import HELDOUT_FRACTION, SEQ_LEN, SPECIAL_TEXT


def read_split(out: Path, manifest: dict, source: str, split: str) -> list[np.ndarray]:
    """A split's records in manifest (reading) order, each checked to be seq_len uint32-le."""
    records = []
    for shard in manifest["sources"][source]["splits"][split]["shards"]:
        reader = ArrayRecordReader(str(out / shard["path"]))
        n = reader.num_records()
        raw = reader.read_all() if n else []
        reader.close()
        for r in raw:
            assert len(r) == 4 * SEQ_LEN
            records.append(np.frombuffer(r, dtype="<u4"))
    return records


def docs_of(records: list[np.ndarray]) -> list[list[int]]:
    """Independent inverse of packing (the contract's words): drop PAD, cut after each EOS."""
    flat = [t for r in records for t in r.tolist() if t != PAD_ID]
    assert not flat or flat[-1] == EOS_ID, "split does not end with EOS: a document was truncated"
    docs, cur = [], []
    for t in flat:
        if t == EOS_ID:
            docs.append(cur)
            cur = []
        else:
            cur.append(t)
    return docs


def expected_split(text: str) -> str:
    h = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")
    return "heldout" if h < HELDOUT_FRACTION * 2**64 else "train"


@pytest.fixture(scope="module")
def decoded(job_out, manifest) -> dict[tuple[str, str], list[str]]:
    enc = dolma2()
    return {
        (s, split): [enc.decode(d) for d in docs_of(read_split(job_out, manifest, s, split))]
        for s in ("web", "books")
        for split in ("train", "heldout")
    }


def test_every_kept_document_comes_back_exactly_once_in_its_split(corpus, decoded):
    expected = collections.Counter()
    for text, (source, _id) in corpus.kept().items():
        expected[(source, expected_split(text), text)] += 1
    got = collections.Counter((s, split, t) for (s, split), texts in decoded.items() for t in texts)
    assert got == expected
    assert sum(1 for k in expected if k[1] == "heldout") > 0, "corpus too small to exercise held-out"


def test_plain_gzip_and_zstd_files_are_all_read(corpus, decoded):
    texts = {t for ts in decoded.values() for t in ts}
    text_of = {doc_id: text for _, doc_id, text in corpus.good}
    for letter in "abc":  # a.jsonl, b.jsonl.gz, c.jsonl.zst: 40 generated documents each
        assert all(text_of[f"{letter}{i:03d}"] in texts for i in range(40)), letter


def test_no_heldout_text_reaches_training(decoded):
    train = {t for (s, split), ts in decoded.items() if split == "train" for t in ts}
    heldout = {t for (s, split), ts in decoded.items() if split == "heldout" for t in ts}
    assert heldout and not (train & heldout)


def test_special_token_text_stays_ordinary_text(job_out, manifest, decoded):
    assert SPECIAL_TEXT in decoded[("web", "train")] + decoded[("web", "heldout")]
    specials = set(SPECIAL_TOKENS.values())
    for s in ("web", "books"):
        for split in ("train", "heldout"):
            recs = read_split(job_out, manifest, s, split)
            flat = np.concatenate(recs) if recs else np.zeros(0, np.uint32)
            found = set(np.unique(flat[np.isin(flat, list(specials))]).tolist())
            assert found <= {EOS_ID, PAD_ID}
            # exactly one EOS per document: text spelling <|endoftext|> added none
            assert int((flat == EOS_ID).sum()) == manifest["sources"][s]["counts"][split]


def test_only_the_last_example_of_each_shard_has_padding(job_out, manifest):
    for entry in manifest["sources"].values():
        for split in ("train", "heldout"):
            for shard in entry["splits"][split]["shards"]:
                r = ArrayRecordReader(str(job_out / shard["path"]))
                recs = [np.frombuffer(x, "<u4") for x in (r.read_all() if r.num_records() else [])]
                for ex in recs[:-1]:
                    assert not (ex == PAD_ID).any()
                if recs:
                    pads = np.flatnonzero(recs[-1] == PAD_ID)
                    assert pads.size == 0 or (pads == np.arange(pads[0], SEQ_LEN)).all()


def test_manifest_counts_add_up_and_describe_the_shards(corpus, job_out, manifest):
    assert manifest["format_version"] == 1 and manifest["seq_len"] == SEQ_LEN
    assert manifest["record_format"] == "uint32-le[seq_len]"
    assert manifest["tokenizer"]["eos_id"] == EOS_ID and manifest["tokenizer"]["pad_id"] == PAD_ID
    assert list(manifest["sources"]) == ["web", "books", "junk"]  # mixture order
    assert [s["paths"] for s in manifest["mixture"]["sources"]] == [
        [str(corpus.root / "web/a.jsonl"), str(corpus.root / "web/b.jsonl.gz")],
        [str(corpus.root / "books/c.jsonl.zst")],
        [str(corpus.root / "junk/d.jsonl")],
    ]
    for name, e in manifest["sources"].items():
        c = e["counts"]
        assert c["documents"] == corpus.documents[name]
        assert c["documents"] == c["train"] + c["heldout"] + c["duplicates"] + sum(c["rejected"].values())
        examples = 0
        for split in ("train", "heldout"):
            shards = e["splits"][split]["shards"]
            n = len(shards)
            assert [sh["path"] for sh in shards] == [f"{name}/{split}-{k:05d}-of-{n:05d}.arrayrecord" for k in range(n)]
            for sh in shards:
                p = job_out / sh["path"]
                assert hashlib.sha256(p.read_bytes()).hexdigest() == sh["sha256"]
                assert ArrayRecordReader(str(p)).num_records() == sh["records"]
            assert e["splits"][split]["examples"] == sum(sh["records"] for sh in shards)
            examples += e["splits"][split]["examples"]
        assert e["tokens"]["train"] + e["tokens"]["heldout"] + e["tokens"]["padding"] == examples * SEQ_LEN
    assert len(manifest["sources"]["web"]["splits"]["train"]["shards"]) > 1


def test_each_bad_line_is_rejected_with_its_reason(corpus, job_out, manifest):
    for source in ("web", "books", "junk"):
        want = collections.Counter(reason for _, _, reason in corpus.rejects.get(source, []))
        got = {r: n for r, n in manifest["sources"][source]["counts"]["rejected"].items() if n}
        assert got == dict(want)
        rows = [json.loads(line) for line in (job_out / "rejects" / f"{source}.jsonl").read_text().splitlines()]
        assert [(r["file"], r["line"], r["reason"]) for r in rows] == sorted(corpus.rejects.get(source, []))
    ids = {r["reason"]: r["id"] for r in map(json.loads, (job_out / "rejects/web.jsonl").read_text().splitlines())}
    assert ids["empty_text"] == "e1" and ids["missing_text"] == "m1" and ids["invalid_json"] is None


def test_duplicates_keep_the_smallest_source_and_id(corpus, job_out, manifest):
    kept = corpus.kept()
    dup_count = collections.Counter()
    for source, _doc_id, _text in corpus.good:
        dup_count[source] += 1
    for source, _ in kept.values():
        dup_count[source] -= 1
    for source in ("web", "books"):
        assert manifest["sources"][source]["counts"]["duplicates"] == dup_count[source]
    rows = [json.loads(x) for x in (job_out / "duplicates/web.jsonl").read_text().splitlines()]
    pairs = {(r["id"], r["kept"]["source"], r["kept"]["id"]) for r in rows}
    assert ("zz-dup", "web", "aa-dup") in pairs  # same source: smaller id kept
    assert ("aaa-first", "books", "zzz-last") in pairs  # across sources: smaller source name kept
    assert ("rep", "web", "rep") in pairs  # the very same line twice


@pytest.mark.slow
@pytest.mark.parametrize("other", ["job_out_2workers", "job_out_2threads"])
def test_one_and_two_workers_write_byte_identical_output(job_out, other, request):
    job_out_2 = request.getfixturevalue(other)  # 2 worker processes, or 2 worker threads
    files1 = sorted(p.relative_to(job_out) for p in job_out.rglob("*") if p.is_file())
    files2 = sorted(p.relative_to(job_out_2) for p in job_out_2.rglob("*") if p.is_file())
    assert files1 == files2
    assert not any(".tmp-" in str(p) for p in files1)
    _, mismatch, errors = filecmp.cmpfiles(job_out, job_out_2, [str(p) for p in files1], shallow=False)
    assert mismatch == [] and errors == []


def test_without_dedup_every_copy_is_kept_and_copies_share_a_split(corpus, job_out_no_dedup):
    m = json.loads((job_out_no_dedup / "manifest.json").read_text())
    enc = dolma2()
    where = collections.defaultdict(list)  # text → splits of its copies
    for s in ("web", "books"):
        assert m["sources"][s]["counts"]["duplicates"] == 0
        for split in ("train", "heldout"):
            for d in docs_of(read_split(job_out_no_dedup, m, s, split)):
                where[enc.decode(d)].append(split)
    assert collections.Counter({t: len(v) for t, v in where.items()}) == collections.Counter(
        t for _, _, t in corpus.good
    )
    assert all(len(set(splits)) == 1 for splits in where.values())  # a held-out text never also trains
    assert any(len(v) > 1 for v in where.values())


def test_a_source_with_no_valid_document_has_empty_splits(job_out, manifest):
    junk = manifest["sources"]["junk"]
    assert junk["counts"]["documents"] == 2 and junk["counts"]["train"] == junk["counts"]["heldout"] == 0
    for split in ("train", "heldout"):  # its one input file still gives one (empty) shard per split
        [shard] = junk["splits"][split]["shards"]
        assert junk["splits"][split]["examples"] == shard["records"] == 0
        assert shard["path"] == f"junk/{split}-00000-of-00001.arrayrecord"
        assert ArrayRecordReader(str(job_out / shard["path"])).num_records() == 0
    assert junk["tokens"] == {"train": 0, "heldout": 0, "padding": 0}


def test_each_input_file_is_one_shard_per_split_in_line_order(corpus, job_out, manifest):
    """Shard k of a split holds exactly file k's kept documents of that split, in line order."""
    import gzip

    enc, kept = dolma2(), corpus.kept()
    for source, files in (("web", ["web/a.jsonl", "web/b.jsonl.gz"]), ("books", ["books/c.jsonl.zst"])):
        for k, rel in enumerate(files):
            raw = (corpus.root / rel).read_bytes()
            if rel.endswith(".gz"):
                raw = gzip.decompress(raw)
            elif rel.endswith(".zst"):
                import zstandard

                raw = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
            lines = []
            for line in raw.split(b"\n"):
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if isinstance(obj, dict) and isinstance(obj.get("text"), str) and isinstance(obj.get("id"), str):
                    lines.append((obj["id"], obj["text"]))
            for split in ("train", "heldout"):
                want, seen = [], set()
                for i, t in lines:  # the kept copy; of identical (source, id, text) lines, the first
                    if t and kept.get(t) == (source, i) and expected_split(t) == split and t not in seen:
                        want.append(t)
                        seen.add(t)
                shard = manifest["sources"][source]["splits"][split]["shards"][k]
                assert shard["path"] == f"{source}/{split}-{k:05d}-of-{len(files):05d}.arrayrecord"
                reader = ArrayRecordReader(str(job_out / shard["path"]))
                recs = [np.frombuffer(r, "<u4") for r in (reader.read_all() if reader.num_records() else [])]
                assert [enc.decode(d) for d in docs_of(recs)] == want, (rel, split)


def test_beam_metrics_count_documents_tokens_and_rejects_per_source(corpus, job_run, manifest):
    _, counters = job_run
    for source, e in manifest["sources"].items():
        c, t = e["counts"], e["tokens"]
        assert counters.get(f"{source}/documents", 0) == corpus.documents[source] == c["documents"]
        rejected = {k.split("/", 2)[2]: v for k, v in counters.items() if k.startswith(f"{source}/rejected/")}
        assert rejected == collections.Counter(reason for _, _, reason in corpus.rejects.get(source, []))
        assert counters.get(f"{source}/duplicates", 0) == c["duplicates"]
        for split in ("train", "heldout"):
            assert counters.get(f"{source}/tokens/{split}", 0) == t[split]
            assert counters.get(f"{source}/examples/{split}", 0) == e["splits"][split]["examples"]
    assert counters["web/tokens/train"] > 0 and sum(v for k, v in counters.items() if "/rejected/" in k) > 0


def test_every_shard_is_written_with_group_size_1(job_out, manifest):
    # one record per chunk, so Grain can read any record directly (the contract's group_size:1)
    paths = [sh["path"] for e in manifest["sources"].values() for sp in e["splits"].values() for sh in sp["shards"]]
    assert paths
    for path in paths:
        reader = ArrayRecordReader(str(job_out / path))
        options = dict(o.split(":", 1) for o in reader.writer_options_string().split(","))
        reader.close()
        assert options["group_size"] == "1", (path, options)


def test_a_failed_rerun_into_the_same_folder_leaves_no_stale_manifest(tmp_path, monkeypatch):
    # an earlier run's manifest would describe shards this run overwrites under the same names;
    # if this run fails (here: the disk fills up while shards are committed), no manifest.json
    # may be left for a loader to trust
    from pipelines import shards
    from pipelines.tokenize import run

    def disk_full(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shards.ShardWriter, "commit", disk_full)  # in-process runner: the DoFn sees it
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text(
        json.dumps({"format_version": 1, "record_format": "uint32-le[seq_len]", "sources": {}})
    )
    (tmp_path / "ok.jsonl").write_text(json.dumps({"id": "1", "text": "fine"}) + "\n")
    (tmp_path / "mixture.yaml").write_text(
        "name: t\ntokenizer: dolma2\nseq_len: 8\nseed: 0\nheldout_fraction: 0.0\ndedup: false\n"
        f"sources:\n  - name: s\n    paths: ['{tmp_path / 'ok.jsonl'}']\n    weight: 1\n"
    )
    with pytest.raises(Exception, match="No space left on device"):
        run(["--mixture", str(tmp_path / "mixture.yaml"), "--output", str(out)])
    assert not (out / "manifest.json").exists()


def test_a_truncated_file_is_rejected_whole_and_its_duplicates_elsewhere_survive(tmp_path):
    import yaml
    import zstandard

    from pipelines.tokenize import run

    shared = "a text that is in both files"
    lines = [json.dumps({"id": "0-first", "text": shared}).encode()]
    lines += [json.dumps({"id": f"x{i}", "text": f"other text {i} " * 50}).encode() for i in range(2000)]
    blob = zstandard.ZstdCompressor().compress(b"\n".join(lines) + b"\n")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "bad.jsonl.zst").write_bytes(blob[: len(blob) * 2 // 3])  # truncated
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "good.jsonl").write_text(json.dumps({"id": "z", "text": shared}) + "\n")
    mix = tmp_path / "mix.yaml"
    mix.write_text(
        yaml.safe_dump(
            {
                "name": "t",
                "tokenizer": "dolma2",
                "seq_len": SEQ_LEN,
                "seed": 0,
                "heldout_fraction": 0.0,
                "dedup": True,
                "sources": [
                    {"name": "a", "paths": [str(tmp_path / "a" / "*")], "weight": 0.5},
                    {"name": "b", "paths": [str(tmp_path / "b" / "*")], "weight": 0.5},
                ],
            }
        )
    )
    out = tmp_path / "out"
    run(["--mixture", str(mix), "--output", str(out)])
    m = json.loads((out / "manifest.json").read_text())
    a, b = m["sources"]["a"], m["sources"]["b"]
    assert a["counts"]["documents"] == 1 and a["counts"]["rejected"]["unreadable_file"] == 1
    assert a["counts"]["train"] == a["splits"]["train"]["examples"] == 0  # nothing of it is trained on
    assert [sh["records"] for sh in a["splits"]["train"]["shards"]] == [0]
    [row] = [json.loads(x) for x in (out / "rejects" / "a.jsonl").read_text().splitlines()]
    assert (
        row["reason"] == "unreadable_file" and row["file"].endswith("bad.jsonl.zst") and "truncated" in row["excerpt"]
    )
    # the copy in the unreadable file would have won dedup (source a < b); the readable one is kept
    assert b["counts"]["train"] == 1 and b["counts"]["duplicates"] == 0
    enc = dolma2()
    assert [enc.decode(d) for d in docs_of(read_split(out, m, "b", "train"))] == [shared]


def test_uncompressed_shards_hold_the_same_records_and_the_manifest_says_so(corpus, job_out, manifest, tmp_path):
    from pipelines.tokenize import run  # lazy: as the session fixtures run the job (Beam's start-up)

    raw = yaml.safe_load(corpus.mixture_path.read_text())
    mixture = tmp_path / "uncompressed.yaml"
    mixture.write_text(yaml.safe_dump({**raw, "shard_compression": "uncompressed"}, sort_keys=False))
    out = tmp_path / "out"
    run(["--mixture", str(mixture), "--output", str(out), "--direct_num_workers=1"])
    m = json.loads((out / "manifest.json").read_text())
    assert m["mixture"]["shard_compression"] == "uncompressed" and "shard_compression" not in manifest["mixture"]
    assert m["fingerprint"] != manifest["fingerprint"]  # other shard bytes: another dataset's fingerprint
    for source, entry in manifest["sources"].items():
        assert m["sources"][source]["counts"] == entry["counts"] and m["sources"][source]["tokens"] == entry["tokens"]
        for split in entry["splits"]:
            assert [r.tobytes() for r in read_split(out, m, source, split)] == [
                r.tobytes() for r in read_split(job_out, manifest, source, split)
            ]
            for shard in m["sources"][source]["splits"][split]["shards"]:
                reader = ArrayRecordReader(str(out / shard["path"]))
                assert "uncompressed" in reader.writer_options_string()
                reader.close()
