"""order="olmo-core": olmax's global batches are OLMo-core's, checked against OLMo-core itself.

The oracle is ai2-olmo-core from PyPI (test extra): NumpyFSLDatasetConfig(...).build() +
NumpyDataLoaderConfig(...).build(...) + reshuffle(epoch), on CPU, without torch.distributed.
"""

from __future__ import annotations

import json
import os

import numpy as np
import olmo_core.data as oc  # the oracle (test extra, pinned): missing, these tests fail, never skip
import pytest
from olmo_core.data.collator import DataCollator
from olmo_core.data.data_loader import NumpyDataLoaderBase

from contract.run import OLMO_CORE, order_named
from dataloader import LoaderConfig, checkpoint, make_loader, olmo_order
from dataloader.loader import load_plan
from pipelines.dolma2_tokenizer import EOS_ID
from tests.dataloader.olmo_fixtures import write_instances_dataset, write_token_files
from tests.modes import modes, umask

L = 8  # sequence length
IPB = 4  # instances per global batch
# Uneven files: some shorter than L (no instance), sizes not multiples of L (remainders dropped).
SIZES = {"web": [37, 100, 5, 64, 250, 3], "code": [81, 7, 120], "math": [16, 47]}
SEEDS = (0, 34521)


@pytest.fixture(scope="module")
def olmo_data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("olmo"))
    files = write_token_files(root, np.random.default_rng(7), SIZES)
    manifest = write_instances_dataset(root, files, L)
    listed = [p for name in SIZES for p in files[name]]
    return {"root": root, "manifest": manifest, "paths": listed}


def olmo_dataset(data, work_dir):
    tok = oc.TokenizerConfig.dolma2()
    return oc.NumpyFSLDatasetConfig(
        tokenizer=tok,
        paths=data["paths"],
        sequence_length=L,
        max_target_sequence_length=L,
        dtype="uint32",
        work_dir=str(work_dir),
    ).build()


def olmo_loader(data, work_dir, seed, dp_world_size=1, dp_rank=0):
    ds = olmo_dataset(data, work_dir)
    if dp_world_size == 1:
        return oc.NumpyDataLoaderConfig(
            global_batch_size=IPB * L, seed=seed, num_workers=0, work_dir=str(work_dir)
        ).build(ds)
    ds.prepare()
    return NumpyDataLoaderBase.wrap_numpy_dataset(
        ds,
        global_batch_size=IPB * L,
        seed=seed,
        work_dir=str(work_dir),
        dp_world_size=dp_world_size,
        dp_rank=dp_rank,
        fs_local_rank=0,
        collator=DataCollator(pad_token_id=ds.pad_token_id, vocab_size=ds.vocab_size),
    )


def olmo_epoch(dl, epoch):
    """Every batch of `epoch`: list of (input_ids int64 [b, L], instance index int64 [b])."""
    dl.reshuffle(epoch=epoch)
    out = [(b["input_ids"].numpy().astype(np.int64), b["index"].numpy().astype(np.int64)) for b in dl]
    dl.reset()
    return out


def cfg(data, tmp_path, seed, **kw):
    return LoaderConfig(
        data=[data["manifest"]],
        global_batch_size=IPB,
        seed=seed,
        order="olmo-core",
        order_cache=str(tmp_path / "order"),
        **kw,
    )


def instance_ids(plan, example):
    """olmax example ids (source << 40 | record) → OLMo-core instance ids (plan slots)."""
    src, rec = example >> 40, example & ((1 << 40) - 1)
    return plan.offsets[src] + rec


def olmax_batches(c, start, n, hosts=1):
    its = [make_loader(c, h, hosts, start_step=start) for h in range(hosts)]
    out = []
    for _ in range(n):
        parts = [next(it) for it in its]
        out.append(
            (
                np.concatenate([p["tokens"] for p in parts]).astype(np.int64),
                np.concatenate([p["example"] for p in parts]),
            )
        )
    for it in its:
        it.close()
    return out


def test_the_fixture_has_documents_crossing_instance_and_file_boundaries(olmo_data):
    """What the oracle tests below must cover (the issue): a document continued in the next file
    (a file that does not end with EOS, followed by one that has tokens) and documents cut by
    instance boundaries within a file."""
    ids = [np.fromfile(p, dtype="<u4") for p in olmo_data["paths"]]
    crossing_files = [i for i in range(len(ids) - 1) if len(ids[i]) and ids[i][-1] != EOS_ID and len(ids[i + 1])]
    assert len(crossing_files) >= 3
    # an instance whose last id is not EOS: its document goes on in the next instance
    cut = sum(int(np.count_nonzero(ids_f[L - 1 : L * (len(ids_f) // L) : L] != EOS_ID)) for ids_f in ids)
    assert cut >= 10


@pytest.mark.parametrize("seed", SEEDS)
def test_global_batches_equal_olmo_cores_for_epochs_1_and_2(olmo_data, tmp_path, seed):
    dl = olmo_loader(olmo_data, tmp_path / "oc", seed)
    ref = olmo_epoch(dl, 1) + olmo_epoch(dl, 2)
    per_epoch = dl.total_batches
    assert len(ref) == 2 * per_epoch and per_epoch >= 10
    c = cfg(olmo_data, tmp_path, seed, prefetch=2)
    _, plan = load_plan(c)
    assert plan.size == len(olmo_dataset(olmo_data, tmp_path / "oc2"))
    ours = olmax_batches(c, 0, len(ref))
    for step, ((tokens, example), (ref_tokens, ref_index)) in enumerate(zip(ours, ref)):
        assert np.array_equal(instance_ids(plan, example), ref_index), step
        assert np.array_equal(tokens, ref_tokens), step  # token for token, same row order


@pytest.mark.parametrize("seed,k", [(0, 3), (34521, 7)])
def test_resume_at_k_equals_olmo_core_resumed_at_batches_processed_k(olmo_data, tmp_path, seed, k):
    first = olmo_loader(olmo_data, tmp_path / "oc", seed)
    first.reshuffle(epoch=1)
    for i, _ in enumerate(first):
        if i + 1 == k:
            break
    state = first.state_dict()
    assert state["batches_processed"] == k
    fresh = olmo_loader(olmo_data, tmp_path / "oc", seed)
    fresh.load_state_dict(state)
    fresh.reshuffle(epoch=state["epoch"])
    ref = [(b["input_ids"].numpy().astype(np.int64)) for b in fresh]
    ours = olmax_batches(cfg(olmo_data, tmp_path, seed, prefetch=0), k, len(ref))
    assert len(ref) == first.total_batches - k
    for (tokens, _), ref_tokens in zip(ours, ref):
        assert np.array_equal(tokens, ref_tokens)


def test_resume_in_epoch_2_from_a_checkpointed_state(olmo_data, tmp_path):
    seed = 34521
    dl = olmo_loader(olmo_data, tmp_path / "oc", seed)
    per_epoch = dl.total_batches
    ref = olmo_epoch(dl, 2)
    c = cfg(olmo_data, tmp_path, seed)
    it = make_loader(c, 0, 1, start_step=per_epoch - 1)
    next(it)
    state = it.state()
    it.close()
    resumed = olmax_batches(c, checkpoint.check_state(c, state), 4)
    for (tokens, _), (ref_tokens, _) in zip(resumed, ref[:4]):
        assert np.array_equal(tokens, ref_tokens)


def test_four_olmo_core_ranks_reassembled_equal_olmax_four_hosts_as_a_set(olmo_data, tmp_path):
    seed = 0
    ranks = [olmo_epoch(olmo_loader(olmo_data, tmp_path / "oc", seed, 4, r), 1) for r in range(4)]
    c = cfg(olmo_data, tmp_path, seed)
    _, plan = load_plan(c)
    ours = olmax_batches(c, 0, len(ranks[0]), hosts=4)
    for step, (tokens, example) in enumerate(ours):
        ref_index = np.concatenate([r[step][1] for r in ranks])
        ref_tokens = np.concatenate([r[step][0] for r in ranks])
        assert sorted(instance_ids(plan, example).tolist()) == sorted(ref_index.tolist()), step
        assert sorted(map(tuple, tokens.tolist())) == sorted(map(tuple, ref_tokens.tolist())), step
    # and olmax's 4-host global batch is its 1-host batch, row for row (the host count is not data)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(ours, olmax_batches(c, 0, len(ours))))


def test_permutation_is_olmo_cores_global_indices_file(olmo_data, tmp_path):
    dl = olmo_loader(olmo_data, tmp_path / "oc", seed=5)
    dl.reshuffle(epoch=3)
    theirs = np.asarray(dl.get_global_indices())
    assert np.array_equal(olmo_order.permutation(len(theirs), 5, 3), theirs)


def test_cache_is_memory_mapped_checksummed_and_reused(tmp_path):
    cache = olmo_order.PermutationCache(str(tmp_path))
    perm = cache.get(1000, seed=9, epoch=1)
    assert isinstance(perm, np.memmap) and not perm.flags.writeable
    assert np.array_equal(perm, olmo_order.permutation(1000, 9, 1))
    data_path, meta_path = cache.paths(olmo_order.CacheKey(1000, 9, 1))
    meta = json.load(open(meta_path))
    assert meta["algorithm"] == OLMO_CORE.name and meta["n"] == 1000 and len(meta["sha256"]) == 64
    mtime = os.stat(data_path).st_mtime_ns
    again = olmo_order.PermutationCache(str(tmp_path)).get(1000, seed=9, epoch=1)
    assert os.stat(data_path).st_mtime_ns == mtime and np.array_equal(again, perm)  # not rebuilt
    del perm, again
    raw = np.fromfile(data_path, dtype="<u4")
    raw[[0, 1]] = raw[[1, 0]]  # still a permutation, but not this one
    raw.tofile(data_path)
    with pytest.raises(olmo_order.CacheError, match="sha256"):
        olmo_order.PermutationCache(str(tmp_path)).get(1000, seed=9, epoch=1)


@pytest.mark.parametrize("mask", [0o022, 0o077], ids=["umask022", "umask077"])
def test_cache_files_have_a_plain_files_mode_under_the_umask(tmp_path, mask):
    """Before, the cache's files were chmod 0644 whatever the umask (a private umask was ignored)."""
    with umask(mask):
        olmo_order.PermutationCache(str(tmp_path / "cache")).get(100, seed=1, epoch=1)
    names = os.listdir(tmp_path / "cache")
    assert len(names) == 2 and modes(tmp_path / "cache", names) == dict.fromkeys(names, 0o666 & ~mask)


def test_a_step_past_the_epoch_is_the_next_epochs_first_batch():
    n, ipb = 103, 4  # 25 batches; the last 3 instances of each epoch's order are not read
    assert olmo_order.step_epoch(24, n, ipb) == (1, 24)
    assert olmo_order.step_epoch(25, n, ipb) == (2, 0)
    e, within = olmo_order.epoch_and_offset(np.array([99, 100, 101]), n, ipb)
    assert e.tolist() == [1, 2, 2] and within.tolist() == [99, 0, 1]


def test_order_names_and_the_plan_fingerprint(olmo_data, tmp_path):
    assert order_named("olmo-core") == OLMO_CORE
    with pytest.raises(ValueError, match="grain"):
        LoaderConfig(data=[olmo_data["manifest"]], global_batch_size=IPB, order="olmo")
    _, ours = load_plan(cfg(olmo_data, tmp_path, 0))
    _, grain = load_plan(LoaderConfig(data=[olmo_data["manifest"]], global_batch_size=IPB))
    assert ours.fingerprint != grain.fingerprint  # a checkpoint of one order does not resume the other
    assert ours.counts == tuple(s.records for s in ours.sources)


def test_elastic_resume_2_to_4_to_1_hosts_across_the_epoch_boundary(olmo_data, tmp_path):
    c = cfg(olmo_data, tmp_path, 34521, prefetch=1)
    per_epoch = olmo_order.batches_per_epoch(load_plan(c)[1].size, IPB)
    reference = olmax_batches(c, 0, per_epoch + 4)
    a = olmax_batches(c, 0, per_epoch - 3, hosts=2)
    b = olmax_batches(c, per_epoch - 3, 5, hosts=4)
    rest = olmax_batches(c, per_epoch + 2, 2, hosts=1)
    for (x, ex), (y, ey) in zip(a + b + rest, reference):
        assert np.array_equal(x, y) and np.array_equal(ex, ey)


def test_the_loader_says_at_start_up_that_weights_do_not_apply(olmo_data, tmp_path, caplog):
    with caplog.at_level("WARNING", logger="dataloader.olmo_order"):
        make_loader(cfg(olmo_data, tmp_path, 0), 0, 1).close()
    assert "mixture weights {'web': 1.0, 'code': 1.0, 'math': 1.0}" in caplog.text
    assert "do not apply" in caplog.text
