"""The eval-leakage index and detectors (pipelines/leakage/index.py, pipelines/leakage/detect.py),
as pure functions: the index keeps each task document's own text, is hashed and refuses a tampered
copy; decon's scoring is decon's; on a planted-contamination corpus the detectors find what they
are built to find and flag no clean document; the 13-gram mode flags exactly the documents
datatrove's NGramsDecontFilter drops."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from pipelines.dolma2_tokenizer import dolma2
from pipelines.leakage import detect as ld
from pipelines.leakage import index as li
from pipelines.leakage import spans
from tests.pipelines import leak_plants as lp


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    return lp.write_tasks(tmp_path_factory.mktemp("leak") / "tasks")


@pytest.fixture(scope="module")
def index(tasks):
    return li.build(str(tasks))


@pytest.fixture(scope="module")
def corpus(index):
    """(texts, types, items, token ids, flags {mode: {doc: {(task, doc_id)}}})."""
    enc = dolma2()
    docs = lp.plants(index)
    ids = [np.asarray(enc.encode_ordinary(t), np.uint32) for t, _, _ in docs]
    tokens = np.concatenate(ids)
    ends = np.cumsum([x.size for x in ids])
    starts = ends - np.array([x.size for x in ids])
    det = ld.Detector(index, ld.DetectorConfig(mode=ld.BOTH))
    flags: dict[str, dict[int, set]] = {ld.DECON: {}, ld.NGRAM13: {}}
    for r in det.scan(tokens, starts, ends):
        for h in r.hits:
            key = (index.tasks[int(index.item_task[h.item])], int(index.item_doc[h.item]))
            flags[h.mode].setdefault(r.doc, set()).add(key)
    return docs, flags


def test_the_index_keeps_each_documents_own_text_and_not_the_shared_shots(index):
    enc = dolma2()
    colors = [i for i in range(index.items) if index.tasks[int(index.item_task[i])] == lp.COLORS]
    questions = [enc.decode(index.part("question", i).tolist()) for i in colors]
    assert len(colors) == 100 and all(q.startswith("Question: ") and q.endswith("\nAnswer:") for q in questions)
    assert all(q.count("Question:") == 1 for q in questions)  # the 3 shared shots are gone
    assert index.meta["per_task"][lp.COLORS]["shared_context_tokens_removed"] > 0
    # copycolors is fast multiple choice: the answer is the gold option's letter
    assert {enc.decode(index.part("answer", i).tolist()) for i in colors} <= {f" {c}" for c in "ABCDEFGHIJ"}
    rc = [i for i in range(index.items) if index.tasks[int(index.item_task[i])] == lp.RC]
    items = lp.rc_items(len(rc))
    for i, (passage, question, answer) in zip(rc, items):
        assert enc.decode(index.part("passage", i).tolist()) == passage + "\n\n"
        assert enc.decode(index.part("question", i).tolist()) == question + "\nAnswer:"
        assert enc.decode(index.part("answer", i).tolist()) == " " + answer
    assert index.meta["per_task"][lp.RC]["split"] == "test" and index.meta["per_task"][lp.COLORS]["split"] == "default"


def test_the_index_is_hashed_built_the_same_twice_and_a_tampered_file_is_refused(tasks, index, tmp_path):
    again = li.build(str(tasks))
    assert again.sha256 == index.sha256
    path = str(tmp_path / "index.npz")
    assert li.main([str(tasks), "--out", path]) == 0  # built once, then named in place of the folder
    assert li.open_index(path).sha256 == index.sha256 == li.open_index(str(tasks)).sha256
    loaded = li.load(path)
    assert loaded.sha256 == index.sha256 and np.array_equal(loaded.parts["question"][0], index.parts["question"][0])
    import zipfile

    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    arr = np.load(tmp_path / "index.npz")["answer_ids"].copy()
    arr[0] += 1
    bad = tmp_path / "bad.npz"
    import io

    buf = io.BytesIO()
    np.save(buf, arr)
    members["answer_ids.npy"] = buf.getvalue()
    with zipfile.ZipFile(bad, "w") as z:
        for n, b in members.items():
            z.writestr(n, b)
    with pytest.raises(li.LeakIndexError, match="does not match its sha256"):
        li.load(str(bad))


def test_canonical_ids_merge_case_leading_space_and_punctuation():
    enc = dolma2()
    canon = li.canonical_table("dolma2")
    one = lambda s: enc.encode_ordinary(s)[0]
    assert canon[one("The")] == canon[one(" the")] == canon[one(" THE")] != 0
    assert canon[one(",")] == canon[one(" (")] == canon[one("\n\n")] == canon[one("  ")] == 0
    assert canon[one(" cat")] != canon[one(" dog")]
    assert li.clean_text("  Hello, World!\n\nIt’s  “fine”. ") == "hello world it s fine"  # decon's clean_text


def test_decons_scoring_rules():
    cfg = ld.DetectorConfig()
    # the question threshold decon derives from 0.8 (scoring.rs test: 0.714285)
    assert ld.interpolate_threshold(60, 20, 50, (0.8 - 0.3) / 0.7) == pytest.approx(0.714285, abs=1e-6)
    assert ld.interpolate_threshold(20, 20, 50, 0.8) == 1.0 and ld.interpolate_threshold(35, 20, 50, 0.8) == 0.9
    # long, confident components: the default weights 0.7 / 0.2 / 0.1, QA 0.75 / 0.25, QP 0.85 / 0.15
    long = dict(q_unique=40, q_len=60, a_len=10, p_len=80)
    assert ld.combined_score(cfg, 1.0, 40, 60, 0.0, 10, 0.0, 80) == pytest.approx(0.7)
    assert ld.combined_score(cfg, 1.0, 40, 60, 1.0, 10, 0.0, 80) == pytest.approx(0.9)
    assert ld.combined_score(cfg, 1.0, 40, 60, 0.0, 10, None, 0) == pytest.approx(0.75)
    assert ld.combined_score(cfg, 1.0, 40, 60, None, 0, 0.0, 80) == pytest.approx(0.85)
    assert ld.combined_score(cfg, 0.9, long["q_unique"], 60, None, 0, None, 0) == pytest.approx(0.9)
    # a short question (10 unique 5-grams: confidence 0.75) moves weight to the answer
    assert ld.combined_score(cfg, 1.0, 10, 60, 0.0, 10, None, 0) == pytest.approx(0.75 * 0.75)
    # items of 20 tokens or fewer need a perfect match: 0.99 is scaled down to 0.792, 1.0 is kept
    assert ld.combined_score(cfg, 0.99, 40, 15, None, 0, None, 0) == pytest.approx(0.99 * 0.8)
    assert ld.combined_score(cfg, 1.0, 40, 15, None, 0, None, 0) == 1.0


def test_a_bad_setting_is_refused():
    bad_forms = (dict(whitespace_forms="x"), dict(whitespace_forms="\t\t"))
    for bad in (dict(mode="fuzzy"), dict(threshold=0.0), dict(threshold=float("nan")), dict(ngram=0), *bad_forms):
        with pytest.raises(ValueError):
            ld.DetectorConfig(**bad)


def _table(corpus):
    docs, flags = corpus
    rows = collections.defaultdict(lambda: collections.Counter())
    for k, (_, kind, item) in enumerate(docs):
        for mode, f in flags.items():
            row = rows[(kind, mode)]
            row["docs"] += 1
            row["flagged"] += k in f
            row["right_item"] += k in f and item in f[k]
    return rows


# Recall per plant type (flagged / planted documents) measured on this corpus; "clean" is the
# false-positive count over the sample's own documents. decon by design: the answer must be near
# the question (question_only scores at most 0.75 < 0.8), answers and passages alone start no
# cluster, and a split or halved question covers half its 5-grams. The 13-gram mode needs 13
# consecutive words of an item: a half question of the synthetic task is 8 words (its answer does
# not follow it in the item), copycolors' halves are 20+.
EXPECTED = {
    ld.DECON: {"verbatim": 1.0, "reformatted": 1.0, "question_only": 0.0, "answer_only": 0.0, "passage_only": 0.0,
               "split": 0.0, "half_question": 0.0},
    ld.NGRAM13: {"verbatim": 1.0, "reformatted": 1.0, "question_only": 1.0, "answer_only": 0.0, "passage_only": 1.0,
                 "split": 1.0},
}  # fmt: skip


def test_planted_contamination_recall_and_precision_per_plant_type(corpus):
    docs, flags = corpus
    rows = _table(corpus)
    print("\nplant type      mode     planted flagged right-item recall")
    for (kind, mode), r in sorted(rows.items()):
        print(f"{kind:15} {mode:8} {r['docs']:7} {r['flagged']:7} {r['right_item']:10} {r['flagged'] / r['docs']:.2f}")
    for mode, want in EXPECTED.items():
        assert rows[("clean", mode)]["flagged"] == 0, mode  # precision: no clean sample document flagged
        for kind, recall in want.items():
            r = rows[(kind, mode)]
            assert r["flagged"] / r["docs"] == recall, (mode, kind, r)
            assert r["right_item"] == r["flagged"], (mode, kind)  # what is flagged names the planted item
    halves = [(k, item) for k, (_, kind, item) in enumerate(docs) if kind == "half_question"]
    assert {k for k, _ in halves if k in flags[ld.NGRAM13]} == {k for k, item in halves if item[0] == lp.COLORS}


def test_the_13gram_mode_flags_exactly_the_documents_datatroves_filter_drops(index, corpus, tmp_path):
    """datatrove's index is built by its own code: NGramsDecontIndexer.compute_hashes (the method its
    run() calls for every eval document), called on a stand-in for the step, because constructing
    the step requires lighteval, which only its task-registry branch uses; the hashes are written
    as run() writes them (<task>.index.hashes, uint64 array). Configured as olmax's mode: n = 13,
    query n-grams on (the item's passage + question is the query, its gold answer the label)."""
    from types import SimpleNamespace

    from datatrove.data import Document
    from datatrove.pipeline.decont.n_grams import NGramsDecontConfig, NGramsDecontFilter, NGramsDecontIndexer
    from datatrove.utils.hashing import HashConfig, create_hash_func
    from datatrove.utils.word_tokenizers import load_word_tokenizer

    # sha1: datatrove's xxhash path passes str to xxhash, which xxhash 4 (this project's) refuses
    cfg = NGramsDecontConfig(n_grams=13, find_query_ngrams=True, hash_config=HashConfig(hash_fc="sha1"))
    stand_in = SimpleNamespace(
        config=cfg, tokenizer=load_word_tokenizer("en"), hash_func=create_hash_func(cfg.hash_config)
    )
    enc = dolma2()
    hashes: dict[str, set[int]] = {}
    for i in range(index.items):
        text = {p: enc.decode(index.part(p, i).tolist()) for p in ("passage", "question", "answer")}
        task = index.tasks[int(index.item_task[i])]
        hashes.setdefault(task, set()).update(
            NGramsDecontIndexer.compute_hashes(stand_in, text["answer"], text["passage"] + text["question"])
        )
    folder = tmp_path / "datatrove-index"
    folder.mkdir()
    for task, hs in hashes.items():
        np.array(sorted(hs), dtype=cfg.hash_config.np_descr).tofile(folder / f"{task}.index.hashes")
    dt = NGramsDecontFilter(str(folder), config=cfg)
    docs, flags = corpus
    dropped = {k for k, (text, _, _) in enumerate(docs) if dt.filter(Document(text=text, id=str(k))) is not True}
    assert dropped == set(flags[ld.NGRAM13]) and len(dropped) > 50


def test_words_are_decons_cleaned_words_however_bpe_split_them():
    """leakage.grams.word_hashes over token ids gives one hash per word of clean_text(text), the
    same for a word in any case (BPE splits "IGNEOUS" and " igneous" differently), and cuts words
    where digits meet letters."""
    from pipelines.leakage.grams import word_hashes

    enc, tables = dolma2(), li.word_tables("dolma2")

    def words(text: str) -> list[int]:
        ids = np.asarray(enc.encode_ordinary(text), np.int64)
        first = np.zeros(ids.size, bool)
        first[0] = True
        return word_hashes(tables, ids, first)[0].tolist()

    text = "What is the NAME of the process in which IGNEOUS rocks, e.g. Eiffel's, form?\n\ndef f(lst_a):"
    assert len(words(text)) == len(li.clean_text(text).split(" ")) == 20
    assert words(text.upper()) == words(li.clean_text(text)) == words(text)
    assert words("igneous rock") != words("igneous rocks") and len(set(words("a b c a"))) == 3
    # a word also ends where digits meet letters: punctuation deleted ("frac1z2") or replaced by
    # spaces (decon's cleaning of "\\frac{1}{z^2}") gives the same words
    assert words("frac1z2") == words("\\frac{1}{z^2}") == words("frac 1 z 2") and len(words("frac1z2")) == 4


def test_the_candidate_check_rules_out_documents_and_flags_the_same_ones(index, corpus):
    """The word-evidence check (candidate_share, Detector.candidate_docs) leaves fewer documents to
    decode and score, and the detector flags exactly the documents and items it flags without it."""
    enc = dolma2()
    docs, flags = corpus
    ids = [np.asarray(enc.encode_ordinary(t), np.uint32) for t, _, _ in docs]
    tokens = np.concatenate(ids)
    ends = np.cumsum([x.size for x in ids])
    starts = ends - np.array([x.size for x in ids])
    every_hit = ld.Detector(index, ld.DetectorConfig(candidate_share=0))
    checked = ld.Detector.shared(index, ld.DetectorConfig(mode=ld.BOTH))
    before, after = every_hit.candidate_docs(tokens, starts, ends), checked.candidate_docs(tokens, starts, ends)
    assert set(after.tolist()) < set(before.tolist())
    flagged = {
        r.doc: {(h.item, round(h.score, 9)) for h in r.hits} for r in every_hit.scan(tokens, starts, ends) if r.hits
    }
    assert flagged == {
        r.doc: {(h.item, round(h.score, 9)) for h in r.hits if h.mode == ld.DECON}
        for r in checked.scan(tokens, starts, ends)
        if any(h.mode == ld.DECON for h in r.hits)
    }
    assert set(flagged) == set(flags[ld.DECON]) and len(flagged) == 24


@pytest.mark.parametrize("damage", ["empty", "truncated"])
def test_an_empty_or_truncated_index_file_is_one_error_line_and_exit_2_in_the_audit_and_the_tokenize_job(
    index, tmp_path, damage
):
    """An index file named by `python -m audit --eval-tasks` or a mixture's `decontaminate.tasks`
    that is empty or cut short (a copy that stopped, a full disk) is refused: one `error:` line
    naming the file, exit 2, nothing written (not numpy's EOFError or zipfile's BadZipFile)."""
    import json
    import os
    import subprocess
    import sys

    import yaml

    from tests.audit import audit_fixtures as fx

    good = tmp_path / "index.npz"
    index.save(str(good))
    bad = tmp_path / f"{damage}.npz"
    bad.write_bytes(b"" if damage == "empty" else good.read_bytes()[: good.stat().st_size // 2])
    manifest = fx.write_sample(str(tmp_path / "data"), shards=1, seq_len=16)
    (tmp_path / "web.jsonl").write_text(json.dumps({"id": "a", "text": "hello world"}) + "\n")
    mixture = {
        "name": "x", "tokenizer": "dolma2", "seq_len": 64, "seed": 0, "heldout_fraction": 0.0, "dedup": False,
        "decontaminate": {"tasks": str(bad)},
        "sources": [{"name": "web", "paths": [str(tmp_path / "web.jsonl")], "weight": 1.0}],
    }  # fmt: skip
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(mixture))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = dict(os.environ, PYTHONPATH=root)
    commands = {
        "audit": ["-m", "audit", "--data", manifest, "--out", str(tmp_path / "audit"), "--eval-tasks", str(bad)],
        "tokenize": [
            "-m",
            "pipelines.tokenize",
            "--mixture",
            str(tmp_path / "m.yaml"),
            "--output",
            str(tmp_path / "tok"),
        ],
    }
    for name, argv in commands.items():
        p = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=root, timeout=300)
        lines = [x for x in p.stderr.splitlines() if x.strip()]
        assert p.returncode == 2, (name, p.stderr[-2000:])
        assert len(lines) == 1 and lines[0].startswith(f"error: {bad}: "), (name, p.stderr[-2000:])
        assert "Traceback" not in p.stderr and "python -m pipelines.leakage.index" in lines[0]
        assert not (tmp_path / name if name == "audit" else tmp_path / "tok").exists(), name


def test_a_copy_whose_whitespace_is_tabs_newlines_or_no_break_spaces_is_flagged_as_decon_flags_it(index):
    """Whitespace that decon's cleaning turns into a space must not hide a copy from the pre-filter:
    BPE splits a word after a tab or a newline ("\\tigneous": "\\t" "igne" "ous") unlike after a
    space (" ign" "eous"), so the shard's canonical 5-grams are not the question's. Each plant is
    flagged, naming its item, exactly where decon itself (the document cleaned and re-tokenized,
    no pre-filter) flags it, and decon flags every one (its cleaning makes them the verbatim copy)."""
    enc = dolma2()
    docs = lp.whitespace_plants(index, per_kind=6)
    ids = [np.asarray(enc.encode_ordinary(t), np.uint32) for t, _, _ in docs]
    tokens = np.concatenate(ids)
    ends = np.cumsum([x.size for x in ids])
    starts = ends - np.array([x.size for x in ids])
    det = ld.Detector.shared(index, ld.DetectorConfig(mode=ld.BOTH))
    name = lambda i: (index.tasks[int(index.item_task[i])], int(index.item_doc[i]))
    flagged = {r.doc: {name(h.item) for h in r.hits if h.mode == ld.DECON} for r in det.scan(tokens, starts, ends)}
    alone = [det._decon_doc(c) for c in det.clean_batch([t for t, _, _ in docs])]
    for k, (_, kind, item) in enumerate(docs):
        assert alone[k] is not None and item in {name(h.item) for h in alone[k].hits}, (kind, item)
        assert item in flagged.get(k, set()), (kind, item)
    # the pre-filter's forms are a detector setting (an audit or manifest checked without them is
    # not taken for this check); without them ("", the pre-filter before issue 55) copies are missed
    assert ld.DetectorConfig().to_json()["whitespace_forms"] == "\t\n"
    old = ld.Detector(index, ld.DetectorConfig(whitespace_forms=""))
    assert len({r.doc for r in old.scan(tokens, starts, ends) if r.hits}) < len(docs)


def _batch(texts: list[str]):
    enc = dolma2()
    ids = [np.asarray(enc.encode_ordinary(t), np.uint32) for t in texts]
    ends = np.cumsum([x.size for x in ids])
    return np.concatenate(ids), ends - np.array([x.size for x in ids]), ends


def test_the_spans_are_the_old_codes_spans_each_document_cleaned_and_encoded_once(index, corpus, monkeypatch):
    """Detector.scan traces each flagged document's cleaned ids back to its characters once
    (`leakage.spans.span_map`), whatever number of hits it holds: the spans are the old per-hit code's
    (tests/pipelines/leakage/reference.py `old_raw_span`), character for character, and the cleaning
    and encoding run once per document, not once per hit (issue 55: 400 copies in one 57.6k-token
    document took 32 s, each hit re-cleaning and re-encoding all of it)."""
    from tests.pipelines.leakage.reference import old_raw_span

    det = ld.Detector.shared(index, ld.DetectorConfig())
    docs, _ = corpus
    texts = [t for t, _, _ in docs]
    compared = 0
    for r in det.scan(*_batch(texts)):
        for h in r.hits:
            assert h.mark is not None
            a, b = h.mark
            assert f"{h.text[:a]}【{h.text[a:b]}】{h.text[b:]}" == old_raw_span(det, texts[r.doc], h.start, h.end)
            compared += 1
    assert compared >= 24
    # one copy, then 40 copies of the same instance in one document: as many cleanings and encodings
    p, q, a = (dolma2().decode(index.part(x, 0).tolist()) for x in ("passage", "question", "answer"))
    calls: collections.Counter = collections.Counter()
    clean, enc = ld.clean_text, det.enc

    class Counting:
        def __getattr__(self, name):
            calls[name] += 1
            return getattr(enc, name)

    counted = lambda t: (calls.update(["clean_text"]), clean(t))[1]
    monkeypatch.setattr(ld, "clean_text", counted)
    monkeypatch.setattr(spans, "clean_text", counted)
    monkeypatch.setattr(det, "enc", Counting())
    per_doc, hits = [], []
    for copies in (1, 40):
        calls.clear()
        text = "\n\n".join([f"Intro {k}. {p}{q}{a}" for k in range(copies)])
        (r,) = det.scan(*_batch([text]))
        hits.append(len(r.hits))
        per_doc.append({k: calls[k] for k in ("clean_text", "encode_ordinary", "decode_with_offsets")})
    assert hits[0] == 1 and hits[1] >= 10  # (adjacent copies join one cluster)
    assert per_doc[0] == per_doc[1] and per_doc[1]["encode_ordinary"] == per_doc[1]["decode_with_offsets"] == 1


def test_brackets_in_a_cjk_document_are_its_text_and_the_span_is_exactly_the_copy(index):
    """【 and 】 in a training document (CJK text), around the copied instance and inside its span
    (between the question and the answer), are ordinary characters: the hit's span offsets cover
    exactly the copy, question to answer, and the report highlights those characters (issue 55:
    markers in the text moved the highlight)."""
    from audit.report import marked

    enc = dolma2()
    item = next(i for i in range(index.items) if index.tasks[int(index.item_task[i])] == lp.COLORS)
    q, a = (enc.decode(index.part(x, item).tolist()) for x in ("question", "answer"))
    copy = q + " 【注】" + a  # a bracket pair inside the span
    before, after = "这是【重要】的文本。\n\n", "\n\n【完】后记】"
    text = before + copy + after
    det = ld.Detector.shared(index, ld.DetectorConfig())
    (r,) = det.scan(*_batch([text]))
    (h,) = [h for h in r.hits if h.item == item]
    assert h.mark is not None and h.text == text  # the whole document is within the context shown
    start, end = h.mark
    assert text[start:end] == copy.strip() and "【注】" in text[start:end]
    assert marked(h.text, h.mark) == f'<pre class="doc">{before}<mark>{copy.strip()}</mark>{after}</pre>'
