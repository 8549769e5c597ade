"""Best-fit packing of token files (`pipelines.token_bestfit`): the records are OLMo-core's own
`NumpyPackedFSLDataset` instances (AI2's stage-3 dataset: groups of files, truncate), their document
mask is OLMo-core's `doc_lens`, every kept token is a document's, and the job's output passes the audit."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from array_record.python.array_record_module import ArrayRecordReader

from contract import TOKEN_DTYPE
from dataloader.loader import batch_fields
from pipelines import token_bestfit as tb
from pipelines.dolma2_tokenizer import EOS_ID, PAD_ID, VOCAB_SIZE

L = 64
ORDINARY = 100256


def token_file(rng, n_docs: int, longest: int, end_with_eos: bool = True) -> np.ndarray:
    """Documents of random lengths (some longer than L, many ties), each ended by EOS."""
    docs = []
    for k in rng.integers(1, longest, size=n_docs):
        d = rng.integers(0, ORDINARY, size=int(k), dtype=np.uint32)
        d[-1] = EOS_ID
        docs.append(d)
    ids = np.concatenate(docs)
    if not end_with_eos:  # a tail that no EOS ends: no document (OLMo-core drops it too)
        ids = np.concatenate([ids, rng.integers(0, ORDINARY, size=5, dtype=np.uint32)])
    return ids


def write_files(tmp_path, n_files: int, seed: int, longest: int = 3 * L // 2) -> list[str]:
    rng = np.random.default_rng(seed)
    paths = []
    for f in range(n_files):
        p = tmp_path / f"{f:06d}.npy"
        token_file(rng, int(rng.integers(5, 60)), longest, end_with_eos=f != 1).tofile(p)
        paths.append(str(p))
    return paths


def read_shard(path: str) -> np.ndarray:
    r = ArrayRecordReader(path)
    try:
        rows = [np.frombuffer(b, TOKEN_DTYPE) for b in r.read_all()]
    finally:
        r.close()
    return np.stack(rows) if rows else np.zeros((0, L), TOKEN_DTYPE)


def olmax_instances(tmp_path, paths: list[str], group: int, ties: str = "numpy") -> np.ndarray:
    """The packed records; ties "numpy" (OLMo-core's argsort) by default: the tests compare them with
    OLMo-core's instances on this machine, and the random lengths tie often."""
    out = []
    for g, files in enumerate(tb.groups(paths, group)):
        dest = str(tmp_path / f"shard{g}.arrayrecord")
        stats, _ = tb.pack_group(files, dest, np.dtype("<u4"), L, EOS_ID, VOCAB_SIZE, PAD_ID, ties)
        rows = read_shard(dest)
        assert stats.records == len(rows)
        assert stats.kept == int(np.count_nonzero(rows != PAD_ID)) and stats.padding == rows.size - stats.kept
        out.append(rows)
    return np.concatenate(out)


@pytest.mark.parametrize("group,seed", [(1, 0), (2, 1), (3, 2)])
def test_records_are_olmo_cores_packed_instances_and_the_document_mask_its_doc_lens(tmp_path, group, seed):
    from olmo_core.data.numpy_dataset import NumpyPackedFSLDataset  # the reference (test extra)

    paths = write_files(tmp_path, 5, seed)
    ds = NumpyPackedFSLDataset(
        *paths,
        sequence_length=L,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        vocab_size=VOCAB_SIZE,
        dtype=np.uint32,
        generate_doc_lengths=True,
        source_group_size=group,
    )
    ds.work_dir = tmp_path / "work"
    ds.prepare()
    theirs = [ds[i] for i in range(len(ds))]
    ours = olmax_instances(tmp_path, paths, group)
    assert ours.shape == (len(theirs), L)
    assert np.array_equal(ours, np.stack([t["input_ids"].numpy() for t in theirs]).astype(TOKEN_DTYPE))
    seg = batch_fields(ours.astype(np.int32), EOS_ID, PAD_ID)["segment_ids"]
    for row, t in zip(seg, theirs):
        real = [int(np.count_nonzero(row == s)) for s in range(1, int(row.max()) + 1)]
        pad = int(np.count_nonzero(row == 0))
        assert t["doc_lens"].tolist() == real + ([pad] if pad else [])  # OLMo-core's trailing PAD "document"


def test_every_kept_token_is_a_documents_and_the_counts_add_up(tmp_path):
    paths = write_files(tmp_path, 3, 7, longest=3 * L)
    ids = [np.fromfile(p, np.uint32) for p in paths]
    dest = str(tmp_path / "s.arrayrecord")
    stats, _ = tb.pack_group(paths, dest, np.dtype("<u4"), L, EOS_ID, VOCAB_SIZE, PAD_ID)
    rows = read_shard(dest)
    # independent of the packer: documents by EOS, each kept whole if ≤ L, else its first L ids
    docs, cut, kept = [], 0, []
    for a in ids:
        eos = np.flatnonzero(a == EOS_ID)
        starts = np.concatenate([[0], eos[:-1] + 1])
        for s, e in zip(starts, eos + 1):
            docs.append(a[s:e])
            kept.append(tuple(a[s : min(e, s + L)].tolist()))
            cut += e - s > L
        cut += a[-1] != EOS_ID  # an unterminated tail: a document, cut
    assert stats.documents == len(docs) + sum(a[-1] != EOS_ID for a in ids) and stats.documents_cut == cut
    assert stats.tokens == sum(map(len, ids)) and stats.dropped == stats.tokens - stats.kept
    assert int(np.count_nonzero(rows == EOS_ID)) == stats.documents - stats.documents_cut  # what the audit checks
    got = []
    for row in rows:
        real = row[row != PAD_ID]
        assert np.all(row[len(real) :] == PAD_ID)  # one trailing PAD run
        if len(real) == L and EOS_ID not in real:
            got.append(tuple(real.tolist()))  # a truncated document, alone in its record
            continue
        ends = np.flatnonzero(real == EOS_ID) + 1
        assert ends[-1] == len(real)  # whole documents only
        got += [tuple(x.tolist()) for x in np.split(real, ends[:-1])]
    assert sorted(got) == sorted(kept)


def test_an_empty_file_and_a_file_without_eos_hold_no_document(tmp_path):
    paths = [str(tmp_path / "empty.npy"), str(tmp_path / "noeos.npy"), str(tmp_path / "one.npy")]
    np.zeros(0, np.uint32).tofile(paths[0])
    np.arange(3, 10, dtype=np.uint32).tofile(paths[1])  # 7 ids, no EOS: a cut document, dropped
    np.array([5, 6, EOS_ID], np.uint32).tofile(paths[2])
    stats, _ = tb.pack_group(paths, str(tmp_path / "s.arrayrecord"), np.dtype("<u4"), L, EOS_ID, VOCAB_SIZE, PAD_ID)
    rows = read_shard(str(tmp_path / "s.arrayrecord"))
    assert rows.shape == (1, L) and rows[0, :3].tolist() == [5, 6, EOS_ID] and np.all(rows[0, 3:] == PAD_ID)
    assert (stats.tokens, stats.kept, stats.dropped, stats.documents, stats.documents_cut) == (10, 3, 7, 2, 1)


def test_a_group_with_a_bad_file_is_rejected_naming_the_file(tmp_path):
    paths = write_files(tmp_path, 2, 3)
    bad = np.fromfile(paths[1], np.uint32)
    bad[0] = VOCAB_SIZE + 5
    bad.tofile(paths[1])
    with pytest.raises(tb.tf.TokenFileError) as e:
        tb.pack_group(paths, str(tmp_path / "s.arrayrecord"), np.dtype("<u4"), L, EOS_ID, VOCAB_SIZE, PAD_ID)
    assert e.value.reason == "token_id_out_of_range" and paths[1] in e.value.detail


@pytest.fixture(scope="module")
def packed_job(tmp_path_factory):
    """The tokenize job on 5 token files, best-fit in groups of 2, with 1 worker and with 2 threads."""
    from pipelines.tokenize import main

    tmp_path = tmp_path_factory.mktemp("job")
    src = tmp_path / "src"
    src.mkdir()
    paths = write_files(src, 5, 11)
    mixture = tmp_path / "m.yaml"
    raw = {
        "name": "tokbf",
        "tokenizer": "dolma2",
        "seq_len": L,
        "seed": 0,
        "heldout_fraction": 0.0,
        "dedup": False,
        "sources": [{"name": "longmino", "format": "tokens", "dtype": "uint32", "weight": 1.0, "paths": paths}],
        "packing": {"method": "best_fit", "group": 2, "ties": "numpy"},  # compared with OLMo-core below
    }
    mixture.write_text(yaml.safe_dump(raw))
    for workers, mode in ((1, "in_memory"), (2, "multi_threading")):
        flags = [f"--direct_num_workers={workers}", f"--direct_running_mode={mode}"]
        assert main(["--mixture", str(mixture), "--output", str(tmp_path / f"out{workers}"), *flags]) == 0
    return tmp_path, paths


def test_the_jobs_packed_token_shards_pass_the_audit_and_do_not_depend_on_the_worker_count(packed_job):
    from audit.runner import AuditConfig, run_audit

    tmp_path, paths = packed_job
    m1, m2 = (json.loads((tmp_path / f"out{w}" / "manifest.json").read_text()) for w in (1, 2))
    want = {"method": "best_fit", "window": 256, "group": 2, "long_docs": "truncate", "ties": "numpy"}
    assert m1["mixture"]["packing"] == {**want, "numpy": np.__version__}  # the tie order's machine
    shards = m1["sources"]["longmino"]["splits"]["train"]["shards"]
    assert len(shards) == 3  # ceil(5 / 2) groups
    assert [s["sha256"] for s in shards] == [
        s["sha256"] for s in m2["sources"]["longmino"]["splits"]["train"]["shards"]
    ]
    ours = np.concatenate([read_shard(str(tmp_path / "out1" / s["path"])) for s in shards])
    assert np.array_equal(ours, olmax_instances(tmp_path, paths, 2))
    results, _ = run_audit(AuditConfig(data=str(tmp_path / "out1" / "manifest.json"), out=str(tmp_path / "a")))
    failed = {r.name: r.failures[:2] for r in results if r.passed is False}
    assert failed == {}
    verdicts = {r.name: r.passed for r in results}
    assert all(verdicts[k] is True for k in ("integrity", "accounting", "sharding", "statistics")), verdicts


def test_the_olmo_core_order_over_packed_shards_gives_olmo_cores_packed_batches(packed_job):
    """AI2's stage-3 data path end to end: OLMo-core's NumpyPackedFSLDataset (groups of 2) under its
    NumpyDataLoader (seed 34521, epochs 1 and 2) against olmax's loader (order olmo-core) over the
    job's shards: the same instances, token for token, in the same batches."""
    import olmo_core.data as oc  # the reference (test extra)

    from dataloader import LoaderConfig, make_loader

    tmp_path, paths = packed_job
    ipb = 3
    ds = oc.NumpyPackedFSLDatasetConfig(
        tokenizer=oc.TokenizerConfig.dolma2(),
        paths=paths,
        sequence_length=L,
        dtype="uint32",
        generate_doc_lengths=True,
        source_group_size=2,
        work_dir=str(tmp_path / "oc"),
    ).build()
    dl = oc.NumpyDataLoaderConfig(
        global_batch_size=ipb * L, seed=34521, num_workers=0, work_dir=str(tmp_path / "oc")
    ).build(ds)
    ref = []
    for epoch in (1, 2):
        dl.reshuffle(epoch=epoch)
        ref += [b["input_ids"].numpy().astype(np.int64) for b in dl]
        dl.reset()
    assert len(ref) >= 10
    c = LoaderConfig(
        data=[str(tmp_path / "out1" / "manifest.json")],
        global_batch_size=ipb,
        seed=34521,
        order="olmo-core",
        order_cache=str(tmp_path / "order"),
    )
    it = make_loader(c, 0, 1, start_step=0)
    try:
        for step, want in enumerate(ref):
            assert np.array_equal(next(it)["tokens"].astype(np.int64), want), step
    finally:
        it.close()


TIES_SCRIPT = """
import hashlib, sys
import numpy as np
from pipelines.token_bestfit import pack_spans
rng = np.random.default_rng(0)
lengths = rng.integers(1, 200, size=5000)
starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
spans = np.stack([starts, starts + lengths], axis=1).astype(np.int64)
ordered, bins = pack_spans(spans, 256, sys.argv[1])
print(hashlib.sha256(ordered.tobytes() + repr(bins).encode()).hexdigest())
"""


def _packed_digest(ties: str, disable: str) -> str:
    import os
    import subprocess
    import sys

    env = {**os.environ, "NPY_DISABLE_CPU_FEATURES": disable}
    out = subprocess.run([sys.executable, "-c", TIES_SCRIPT, ties], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_stable_ties_pack_the_same_on_every_cpu_and_numpys_do_not():
    """Invariant 2 for token-file best-fit: 5,000 documents of 199 lengths (ties everywhere) pack to
    the same bins with numpy's AVX-512 kernels and without them (another worker's CPU) under the
    default `ties: stable`; OLMo-core's own unstable argsort (`ties: numpy`) does not (the control;
    it needs a CPU with numpy's X86_V4 group)."""
    cpu = np.__config__.CONFIG["SIMD Extensions"]["found"]
    assert _packed_digest("stable", "") == _packed_digest("stable", "X86_V4 AVX512_ICL AVX512_SPR")
    if "X86_V4" not in cpu:
        pytest.skip("this CPU has no AVX-512 group (X86_V4): numpy's tie order cannot be shown to move here")
    assert _packed_digest("numpy", "") != _packed_digest("numpy", "X86_V4 AVX512_ICL AVX512_SPR")


def test_stable_ties_are_olmo_cores_order_where_no_lengths_tie():
    rng = np.random.default_rng(3)
    lengths = rng.permutation(np.arange(1, 300))  # all distinct
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    spans = np.stack([starts, starts + lengths], axis=1).astype(np.int64)
    a, bins_a = tb.pack_spans(spans, 512, "stable")
    b, bins_b = tb.pack_spans(spans, 512, "numpy")
    assert np.array_equal(a, b) and bins_a == bins_b
    with pytest.raises(ValueError, match="ties"):
        tb.pack_spans(spans, 512, "quick")
