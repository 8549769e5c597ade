"""Token files hold only ids the tokenizer's vocabulary and the loader agree on: a dtype that
cannot hold the tokenizer's ids is refused before the job; a numpy `.npy` header and a PAD id
are whole-file rejects with their own reasons, so the job and the audit never disagree."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from array_record.python.array_record_module import ArrayRecordReader

from pipelines import token_files as tk
from pipelines.dolma2_tokenizer import EOS_ID, PAD_ID, VOCAB_SIZE
from pipelines.mixture import MixtureError, parse_mixture
from pipelines.tokenize import main

L = 16


def ids_file(path, n=200, seed=0):
    ids = np.random.default_rng(seed).integers(0, 100256, size=n).astype("<u4")
    ids[::9] = EOS_ID
    ids[-1] = EOS_ID
    ids.tofile(path)
    return ids


def mixture(tmp_path, paths, dtype="uint32"):
    path = tmp_path / "mixture.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "ids",
                "tokenizer": "dolma2",
                "seq_len": L,
                "seed": 0,
                "heldout_fraction": 0.0,
                "dedup": False,
                "sources": [
                    {"name": "t", "format": "tokens", "dtype": dtype, "weight": 1.0, "paths": [str(p) for p in paths]}
                ],
            }
        )
    )
    return path


def test_a_dtype_that_cannot_hold_the_tokenizers_ids_is_refused_before_anything_is_written(tmp_path, capsys):
    # a uint32 file read as uint16 would be twice the ids, none of them an EOS: one garbage document
    ids_file(tmp_path / "a.npy")
    out = tmp_path / "out"
    assert main(["--mixture", str(mixture(tmp_path, [tmp_path / "a.npy"], "uint16")), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "dtype uint16 cannot hold dolma2's ids" in err and str(VOCAB_SIZE - 1) in err
    assert not out.exists()
    with pytest.raises(MixtureError, match="uint16 cannot hold"):
        parse_mixture(
            {
                "name": "x",
                "tokenizer": "dolma2",
                "seq_len": 8,
                "seed": 0,
                "heldout_fraction": 0.0,
                "dedup": False,
                "sources": [{"name": "a", "paths": ["x"], "weight": 1, "format": "tokens", "dtype": "uint16"}],
            }
        )
    assert tk.dtype_holds("uint16", 65536) and not tk.dtype_holds("uint16", 65537)
    assert tk.dtype_holds("uint32", VOCAB_SIZE)


@pytest.mark.parametrize("dtype, eos, vocab", [("uint32", EOS_ID, VOCAB_SIZE), ("uint16", 50000, 65536)])
def test_a_numpy_npy_file_is_rejected_with_its_own_reason_not_read_as_ids(tmp_path, dtype, eos, vocab):
    # with a 16-bit vocabulary, np.save's header bytes are valid ids: only the magic tells them apart
    ids = np.random.default_rng(1).integers(0, eos, size=300).astype(dtype)
    ids[::7] = eos
    np.save(tmp_path / "f.npy", ids)
    with pytest.raises(tk.TokenFileError) as e:
        tk.convert_file(str(tmp_path / "f.npy"), str(tmp_path / "f.arrayrecord"), tk.token_dtype(dtype), L, eos, vocab)
    assert e.value.reason == "numpy_header" and "np.save" in e.value.detail
    assert not (tmp_path / "f.arrayrecord").exists()
    ids.tofile(tmp_path / "raw.npy")  # the same ids without the header convert
    stats, _ = tk.convert_file(
        str(tmp_path / "raw.npy"), str(tmp_path / "raw.arrayrecord"), tk.token_dtype(dtype), L, eos, vocab
    )
    assert stats.tokens == len(ids)


def test_a_pad_id_inside_a_token_file_is_a_reject_and_the_audit_passes_the_jobs_output(tmp_path):
    from audit import AuditConfig, run_audit

    good = ids_file(tmp_path / "0-good.npy", seed=2)
    pad = ids_file(tmp_path / "1-pad.npy", seed=3)
    pad[37] = PAD_ID
    pad.tofile(tmp_path / "1-pad.npy")
    ids_file(tmp_path / "2-saved.tmp", seed=4)
    np.save(tmp_path / "2-saved.npy", np.fromfile(tmp_path / "2-saved.tmp", "<u4"))
    out = tmp_path / "out"
    paths = [tmp_path / n for n in ("0-good.npy", "1-pad.npy", "2-saved.npy")]
    assert main(["--mixture", str(mixture(tmp_path, paths)), "--output", str(out)]) == 0
    m = json.loads((out / "manifest.json").read_text())
    counts = m["sources"]["t"]["counts"]
    assert counts["rejected"]["pad_id_in_document"] == 1 and counts["rejected"]["numpy_header"] == 1
    rows = [json.loads(line) for line in (out / "rejects" / "t.jsonl").read_text().splitlines()]
    assert [(r["file"].rsplit("/", 1)[1], r["reason"]) for r in rows] == [
        ("1-pad.npy", "pad_id_in_document"),
        ("2-saved.npy", "numpy_header"),
    ]
    assert "token 37" in rows[0]["excerpt"]
    shards = m["sources"]["t"]["splits"]["train"]["shards"]
    assert [s["records"] for s in shards] == [len(good) // L, 0, 0]
    reader = ArrayRecordReader(str(out / shards[0]["path"]))
    assert not (np.frombuffer(b"".join(reader.read_all()), "<u4") == PAD_ID).any()
    reader.close()
    results, _ = run_audit(
        AuditConfig(data=str(out / "manifest.json"), out=str(tmp_path / "audit"), global_batch_size=2)
    )
    failed = {r.name: r.failures[:2] for r in results if r.passed is False}
    assert failed == {}
