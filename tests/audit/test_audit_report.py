"""Pure pieces of the audit (document recovery from packed records, 13-grams) and the report:
one self-contained HTML file that renders in headless Chromium when it is installed."""

from __future__ import annotations

import html.parser
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from audit import AuditConfig, run_audit, write_outputs
from audit.contamination import word_ngrams
from contract import DocumentSplitter, parse_records
from pipelines.dolma2_tokenizer import EOS_ID, PAD_ID
from tests.audit import audit_fixtures as fx


def test_documents_are_recovered_exactly_from_packed_records():
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 1000, size=int(n)).tolist() for n in rng.integers(1, 40, size=50)]
    packs = [fx.pack(docs[:20], 16), fx.pack(docs[20:], 16)]  # two packing units
    splitter = DocumentSplitter(EOS_ID, PAD_ID)
    got = []
    for unit in packs:
        for chunk in np.array_split(unit, 3):  # chunk boundaries fall inside documents
            got += [d.tolist() for d in splitter.feed(chunk)]
    assert splitter.finish() == 0
    assert got == docs
    p = splitter.problems
    assert (p.misplaced_pad, p.cut_without_eos, p.all_pad_records) == (0, 0, 0)


def test_packing_violations_are_counted():
    recs = fx.pack([[5] * 10], 8)  # [5]*8 | 5 5 EOS PAD…
    bad = recs.copy()
    bad[1, 2] = 7  # the document is cut by PAD before its EOS
    mid = recs.copy()
    mid[0, 3] = PAD_ID  # PAD inside a record, not a trailing run
    # (misplaced_pad, cut_without_eos, all_pad_records): `bad` is cut twice, by the PAD run in
    # record 1 and by the end of the split (the fragment never gets its EOS); `mid` once.
    for arr, want in ((bad, (0, 2, 0)), (mid, (1, 0, 0))):
        s = DocumentSplitter(EOS_ID, PAD_ID)
        list(s.feed(arr))
        s.finish()
        p = s.problems
        assert (p.misplaced_pad, p.cut_without_eos, p.all_pad_records) == want


def test_parse_records_rejects_wrong_length_and_out_of_vocabulary():
    good = np.arange(4, dtype="<u4").tobytes()
    arr, probs = parse_records([good, good[:-4], np.array([1, 2, 3, 10**6], "<u4").tobytes()], 4, 1000)
    assert arr.shape == (1, 4)
    assert [i for i, _ in probs.bad] == [1, 2]
    assert "12 bytes, expected 16" in probs.bad[0][1] and ">= vocabulary size 1000" in probs.bad[1][1]


def test_word_13grams_ignore_case_and_punctuation():
    a = word_ngrams("The quick brown fox jumps over the lazy dog, again and again, every day!")
    b = word_ngrams("the QUICK brown fox -- jumps over the lazy dog again and again every day")
    assert a == b and len(a) == 2
    assert word_ngrams("too short to have one") == set()


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("rep")
    manifest = fx.write_sample(str(root / "data"))
    fx.write_run_logs(str(root / "run"), manifest, hosts=2, steps=10, global_batch_size=8)
    fx.tamper_one_byte(str(root / "data" / "code" / "heldout-00000-of-00002.arrayrecord"))
    results, meta = run_audit(AuditConfig(data=manifest, out=str(root / "out"), run=str(root / "run")))
    path, _ = write_outputs(results, meta, str(root / "out"))
    return path


class _Collect(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.urls, self.ids = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for k, v in attrs:
            if k in ("src", "href") and v and not v.startswith("#"):
                self.urls.append(v)
            if k == "id":
                self.ids.append(v)


def test_report_is_one_self_contained_file_with_a_section_per_check(report):
    text = open(report, encoding="utf-8").read()
    p = _Collect()
    p.feed(text)
    assert p.urls == [] and "script" not in p.tags and "link" not in p.tags  # nothing fetched
    titles = re.findall(r"<svg [^>]*><title>([^<]*)</title>", text)
    assert p.tags.count("svg") == len(titles)
    assert titles == [
        "Where documents went",
        "Share of training tokens",
        "Host overlap matrix",
        "Shared slots",
        "Hosts logging each step",
    ] + [f"Document length, {src}/{split}" for src in ("web", "code") for split in ("train", "heldout")]
    assert p.ids == [
        "integrity",
        "accounting",
        "mixture",
        "sharding",
        "run",
        "contamination",
        "statistics",
        "task_contamination",
    ]
    assert 'olmax data audit: <span class="badge FAIL">FAIL</span>' in text  # the tampered shard
    assert "code/heldout-00000-of-00002.arrayrecord" in text
    svgs = re.findall(r"<svg.*?</svg>", text, flags=re.S)
    assert len(svgs) == p.tags.count("svg")
    for s in svgs:  # every plot is well-formed XML (browsers drop malformed inline SVG silently)
        assert ET.fromstring(s).tag == "{http://www.w3.org/2000/svg}svg"


def test_report_renders_in_headless_chromium(report, tmp_path, chromium):
    shot = tmp_path / "report.png"
    proc = chromium(report, shot, "1000,3000")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.exists() and shot.stat().st_size > 10_000
    assert "Uncaught" not in proc.stderr and "ERR_FILE_NOT_FOUND" not in proc.stderr


def test_every_attribute_of_the_report_is_escaped():
    """A check's name goes into href="#…" and id="…": quotes and tags in it stay text."""
    from audit.checks import CheckResult
    from audit.report import render

    evil = '"><script>alert(1)</script>'
    page = render([CheckResult(evil, evil, False, evil, [evil], 1)], {"x": evil})
    assert "<script" not in page and 'href="#&quot;&gt;&lt;script' in page and 'id="&quot;&gt;' in page
