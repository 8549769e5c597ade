"""Batches carry the exact shard records; EOS/PAD-derived fields; held-out pass; open checks."""

import json
import os
import shutil

import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordReader

from contract import ManifestError, with_fingerprint
from dataloader import LoaderConfig, batch_fields, make_loader
from dataloader.plan import RECORD_BITS
from pipelines.dolma2_tokenizer import EOS_ID, PAD_ID
from tests.dataloader.conftest import SEQ_LEN, write_dataset, write_shard


def read_straight(manifest, manifest_path, source_name, split, record):
    """The record as array_record returns it from the shard, without the loader."""
    base = os.path.dirname(manifest_path)
    for shard in manifest["sources"][source_name]["splits"][split]["shards"]:
        if record < shard["records"]:
            reader = ArrayRecordReader(os.path.join(base, shard["path"]))
            blob = reader.read([record])[0]
            reader.close()
            return np.frombuffer(blob, dtype="<u4").astype(np.int32)
        record -= shard["records"]
    raise IndexError(record)


def test_batch_tokens_equal_the_records_read_straight_from_the_shards(manifest_path, manifest):
    names = list(manifest["sources"])
    it = make_loader(LoaderConfig(data=[manifest_path], global_batch_size=16, seed=9), 0, 1)
    seen = set()
    for _ in range(6):
        b = next(it)
        for row, ex in enumerate(b["example"].tolist()):
            src, rec = ex >> RECORD_BITS, ex & ((1 << RECORD_BITS) - 1)
            seen.add(src)
            assert np.array_equal(b["tokens"][row], read_straight(manifest, manifest_path, names[src], "train", rec))
    assert seen == {0, 1}


def test_segment_ids_positions_and_loss_mask_follow_eos_and_pad():
    E, P = EOS_ID, PAD_ID
    tokens = np.array(
        [
            [5, 6, E, 7, E, 8, 9, 9],  # continued doc, two more docs
            [E, 1, 2, 3, E, P, P, P],  # starts with an EOS, PAD tail
            [P, P, P, P, P, P, P, P],
        ],
        dtype=np.int32,
    )
    f = batch_fields(tokens, E, P)
    assert f["segment_ids"].tolist() == [[1, 1, 1, 2, 2, 3, 3, 3], [1, 2, 2, 2, 2, 0, 0, 0], [0] * 8]
    assert f["positions"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2], [0, 0, 1, 2, 3, 0, 0, 0], [0] * 8]
    assert f["loss_mask"].tolist() == [[1] * 8, [1] * 5 + [0] * 3, [0] * 8]
    assert all(v.dtype == np.int32 for v in f.values())


def test_heldout_is_a_fixed_unshuffled_finite_pass(manifest_path, manifest):
    names = list(manifest["sources"])
    sizes = [manifest["sources"][n]["splits"]["heldout"]["examples"] for n in names]
    total = sum(sizes)
    G = 8
    assert total % G, "the fixture must leave a partial last batch"
    cfg = LoaderConfig(data=[manifest_path], global_batch_size=G, split="heldout", seed=123)
    halves = [list(make_loader(cfg, h, 2)) for h in range(2)]
    batches = [{k: np.concatenate([a[k], b[k]]) for k in a} for a, b in zip(*halves)]
    assert len(batches) == -(-total // G)
    example = np.concatenate([b["example"] for b in batches])
    expected = [(s << RECORD_BITS) | r for s, n in enumerate(sizes) for r in range(n)]
    assert example[:total].tolist() == expected  # every record once, in manifest order
    last = batches[-1]
    pad_rows = slice(total % G, G)
    assert (last["tokens"][pad_rows] == PAD_ID).all() and (last["loss_mask"][pad_rows] == 0).all()
    assert (last["index"][pad_rows] == -1).all() and (last["example"][pad_rows] == -1).all()
    assert np.concatenate([b["index"] for b in batches])[:total].tolist() == list(range(total))
    # The seed plays no role and a resumed pass continues where it stopped.
    again = list(
        make_loader(
            LoaderConfig(data=[manifest_path], global_batch_size=G, split="heldout", seed=0), 0, 1, start_step=1
        )
    )
    assert all(np.array_equal(a["tokens"], b["tokens"]) for a, b in zip(again, batches[1:]))


@pytest.fixture
def copy_of(manifest_path, tmp_path):
    src = os.path.dirname(manifest_path)
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    return str(dst)


def _edit_manifest(root, fn, refingerprint=True):
    """Edits the manifest; with refingerprint, as a buggy writer would (a self-consistent manifest that
    does not describe its shards), else as a hand edit (the fingerprint no longer matches)."""
    path = os.path.join(root, "manifest.json")
    with open(path) as f:
        m = json.load(f)
    fn(m)
    with open(path, "w") as f:
        json.dump(with_fingerprint(m) if refingerprint else m, f)
    return path


def test_loader_refuses_a_manifest_whose_fingerprint_does_not_match(copy_of):
    path = _edit_manifest(
        copy_of, lambda m: m["sources"]["web"]["splits"]["train"]["shards"].reverse(), refingerprint=False
    )
    with pytest.raises(ManifestError, match="fingerprint .* does not match the manifest's content"):
        make_loader(LoaderConfig(data=[path], global_batch_size=8), 0, 1)


def test_open_rejects_a_record_count_mismatch(copy_of):
    def bump(m):
        m["sources"]["code"]["splits"]["train"]["shards"][0]["records"] += 1
        m["sources"]["code"]["splits"]["train"]["examples"] += 1

    path = _edit_manifest(copy_of, bump)
    with pytest.raises(ValueError, match=r"code/train-00000-of-00003.arrayrecord: \d+ records, the manifest says"):
        make_loader(LoaderConfig(data=[path], global_batch_size=8), 0, 1)


def test_open_rejects_wrong_record_size_and_group_size(copy_of, manifest):
    shard = manifest["sources"]["web"]["splits"]["train"]["shards"][1]
    n = shard["records"]
    target = os.path.join(copy_of, shard["path"])
    write_shard(target, np.zeros((n, SEQ_LEN + 1), np.uint32))
    with pytest.raises(ValueError, match=f"record 0 has {4 * (SEQ_LEN + 1)} bytes"):
        make_loader(LoaderConfig(data=[os.path.join(copy_of, "manifest.json")], global_batch_size=8), 0, 1)
    write_shard(target, np.zeros((n, SEQ_LEN), np.uint32), options="group_size:64")
    with pytest.raises(ValueError, match="group_size:1"):
        make_loader(LoaderConfig(data=[os.path.join(copy_of, "manifest.json")], global_batch_size=8), 0, 1)
    os.remove(target)
    with pytest.raises(FileNotFoundError, match="shard missing"):
        make_loader(LoaderConfig(data=[os.path.join(copy_of, "manifest.json")], global_batch_size=8), 0, 1)


@pytest.mark.parametrize("bad_id", [100277 + 5, 2**31, 2**32 - 1])  # ≥ 2**31: negative as int32
def test_token_ids_outside_the_vocabulary_are_an_error(tmp_path, bad_id):
    bad = [np.array([bad_id, 1, 2], dtype=np.uint32)]  # an id ≥ vocab_size in a "document"
    path = write_dataset(str(tmp_path), {"x": {"train": bad * 4, "weight": 1.0}}, shards=1)
    for prefetch in (0, 2):  # the error reaches the caller from Grain's prefetch threads too
        it = make_loader(LoaderConfig(data=[path], global_batch_size=2, prefetch=prefetch), 0, 1)
        with pytest.raises(ValueError, match="vocab_size"):
            next(it)


def test_two_manifests_number_sources_in_data_order(manifest_path, tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 1000, 20) for _ in range(30)]
    other = write_dataset(
        str(tmp_path), {"books": {"train": docs, "heldout": docs[:3], "weight": 0.2, "max_repetition": 10}}
    )
    it = make_loader(LoaderConfig(data=[manifest_path, other], global_batch_size=64), 0, 1)
    assert [s.name for s in it.plan.sources] == ["web", "code", "books"]
    sources = set((next(it)["example"] >> RECORD_BITS).tolist())
    assert 2 in sources


def reference_fields(row, eos, pad):
    """Token-by-token statement of the contract, for one row."""
    seg, pos, mask, cur, start = [], [], [], 1, 0
    for t, tok in enumerate(row):
        if t > 0 and row[t - 1] == eos:
            cur, start = cur + 1, t
        real = tok != pad
        seg.append(cur if real else 0)
        pos.append(t - start if real else 0)
        mask.append(int(real))
    return seg, pos, mask


def test_fields_match_a_token_by_token_reference_on_random_rows():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 50, size=(40, 37)).astype(np.int32)
    tokens[rng.random(tokens.shape) < 0.15] = EOS_ID
    for r in range(0, 40, 3):  # PAD tails of varying length, incl. all-PAD rows
        tokens[r, 37 - r :] = PAD_ID
    f = batch_fields(tokens, EOS_ID, PAD_ID)
    for r, row in enumerate(tokens.tolist()):
        seg, pos, mask = reference_fields(row, EOS_ID, PAD_ID)
        assert f["segment_ids"][r].tolist() == seg and f["positions"][r].tolist() == pos
        assert f["loss_mask"][r].tolist() == mask


def test_loader_fields_match_the_token_by_token_reference(manifest_path):
    # The loader computes the fields into its batch block from one shared EOS/PAD scan;
    # held-out batches add PAD tails and all-PAD completion rows.
    for split, steps in (("train", 8), ("heldout", None)):
        it = make_loader(LoaderConfig(data=[manifest_path], global_batch_size=8, seed=4, split=split), 0, 1)
        batches = [next(it) for _ in range(steps)] if steps else list(it)
        assert any((b["tokens"] == PAD_ID).any() for b in batches)
        for b in batches:
            for r, row in enumerate(b["tokens"].tolist()):
                seg, pos, mask = reference_fields(row, EOS_ID, PAD_ID)
                assert b["segment_ids"][r].tolist() == seg and b["positions"][r].tolist() == pos
                assert b["loss_mask"][r].tolist() == mask


def test_batches_handed_out_never_change_or_share_memory(manifest_path):
    it = make_loader(LoaderConfig(data=[manifest_path], global_batch_size=8, seed=5, prefetch=4, read_threads=2), 0, 1)
    held = [next(it) for _ in range(3)]
    frozen = [{k: v.copy() for k, v in b.items()} for b in held]
    later = [next(it) for _ in range(30)]  # > 1 epoch: the same records come back
    for b, f in zip(held, frozen):
        for k in b:
            assert np.array_equal(b[k], f[k]), k
    arrays = [v for b in held + later for v in b.values()]
    for i, a in enumerate(arrays):
        for other in arrays[i + 1 :]:
            assert not np.shares_memory(a, other)


@pytest.mark.parametrize("prefetch,threads", [(1, 1), (3, 2), (8, 4)])
def test_output_is_identical_whatever_the_prefetch_settings(manifest_path, prefetch, threads):
    def stream(**kw):
        it = make_loader(LoaderConfig(data=[manifest_path], global_batch_size=8, seed=2, **kw), 0, 2)
        out = [next(it) for _ in range(40)]  # > 1 epoch of the 241-slot plan on this host
        it.close()
        return out

    for a, b in zip(stream(prefetch=0), stream(prefetch=prefetch, read_threads=threads)):
        for k in a:
            assert np.array_equal(a[k], b[k]), k
