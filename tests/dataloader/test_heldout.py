"""Held-out evaluation sets (dataloader.heldout): OLMo-core's padded LM-evaluation instances,
instance for instance, and the packed sets' records; batches and host slices."""

from __future__ import annotations

import numpy as np
import olmo_core.data as oc  # the oracle (test extra, pinned): missing, these tests fail, never skip
import pytest
from olmo_core.data import DataMix, TokenizerConfig

from contract import HELDOUT, Manifest
from dataloader import heldout
from dataloader.loader import batch_fields
from dataloader.plan import sources_from_manifests
from dataloader.source import SplitSource
from pipelines.dolma2_tokenizer import EOS_ID, PAD_ID
from tests.dataloader.olmo_fixtures import write_validation_mix

L = 32


@pytest.fixture(scope="module")
def validation(tmp_path_factory):
    root = tmp_path_factory.mktemp("validation")
    base, manifest = write_validation_mix(str(root), L)
    return root, base, Manifest.load(manifest)


def olmo_core_instances(root, base) -> dict[str, list[dict]]:
    """OLMo-core's LM-evaluation dataset as its OLMo 3 recipes build it, on the same files:
    {label: its instances in dataset order}."""
    cfg = oc.NumpyPaddedFSLDatasetConfig.from_data_mix(
        DataMix.v3_small_ppl_validation,
        mix_base_dir=base,
        sequence_length=L,
        tokenizer=TokenizerConfig.dolma2(),
        work_dir=str(root / "olmo-core-work"),
    )
    ds = cfg.build()
    ds.prepare()
    out: dict[str, list[dict]] = {}
    for i in range(len(ds)):
        item = ds[i]
        out.setdefault(item["metadata"]["label"], []).append(item)
    return out


def test_padded_instances_are_olmo_cores_instance_for_instance(validation):
    """AI2's v3-small-ppl-validation mix (OLMo-core's own DataMix, NumpyPaddedFSLDatasetConfig as its
    OLMo 3 recipes build it) and olmax's padded sets from the tokenize job on the same token files:
    the same instances in the same order, token for token, and the same positions counted
    (label_mask = loss_mask: OLMo-core's targets are exactly olmax's)."""
    root, base, manifest = validation
    want = olmo_core_instances(root, base)
    labels = heldout.choose_sets([manifest], None)
    assert labels == list(want)  # every label, in the mix file's order
    sets = heldout.open_sets([manifest], labels, heldout.PADDED)
    files = {src["name"]: src["paths"] for src in manifest["mixture"]["sources"]}
    truncated = cut_files = tails = 0
    for s in sets:
        ref = want[s.label]
        assert s.size() == len(ref), s.label
        got = s.instances(np.arange(len(ref)))
        ids = np.stack([r["input_ids"].numpy() for r in ref])
        mask = np.stack([r["label_mask"].numpy() for r in ref]).astype(np.int32)
        assert np.array_equal(got["tokens"], ids), s.label
        assert np.array_equal(got["loss_mask"], mask), s.label
        truncated += int(((mask.sum(1) == L) & (ids[:, -1] != EOS_ID)).sum())
        [path] = files[s.label]
        file = np.fromfile(path, "<u4")
        cut_files += int(file[-1] != EOS_ID)
        tails += int(s.source.num_records == len(file) // L + 1)  # the remainder's documents, kept
    heldout.close_sets(sets)
    # the cases exercised: documents cut to L, a file ending mid-document, remainders holding documents
    assert truncated > 0 and cut_files == 1 and tails > 0


def test_padded_fields_count_every_document_id_but_the_first_and_no_fill():
    tokens = np.array([[5, 6, EOS_ID, 9], [7, 7, 7, 7], [0, 0, 0, 0]], np.uint32)
    f = heldout.padded_fields(tokens, np.array([3, 4, 0]), PAD_ID)
    assert f["tokens"].tolist() == [[5, 6, EOS_ID, PAD_ID], [7, 7, 7, 7], [PAD_ID] * 4]
    assert f["loss_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]]
    assert f["positions"].tolist() == [[0, 1, 2, 0], [0, 1, 2, 3], [0, 0, 0, 0]]
    assert f["segment_ids"].tolist() == f["loss_mask"].tolist()


def test_documents_end_at_eos_are_cut_to_max_len_and_ids_after_the_last_eos_are_none():
    ids = np.array([1, 2, EOS_ID, 3, 4, 5, 6, 7, EOS_ID, 8, 9], np.uint32)
    starts, lengths, nxt = heldout.document_spans(ids, EOS_ID, offset=100, first_start=100, max_len=4)
    assert starts.tolist() == [100, 103] and lengths.tolist() == [3, 4] and nxt == 109
    # a chunk without EOS continues the open document
    s2, l2, n2 = heldout.document_spans(np.array([1, 2], np.uint32), EOS_ID, 111, nxt, 4)
    assert len(s2) == 0 and n2 == nxt


def test_a_capped_padded_set_scans_only_what_it_needs_and_agrees_with_a_full_scan(validation, monkeypatch):
    _, _, manifest = validation
    monkeypatch.setattr(heldout, "SCAN_RECORDS", 1)  # the scan in its smallest steps, across shards
    label = heldout.choose_sets([manifest], None)[0]
    [capped] = heldout.open_sets([manifest], [label], heldout.PADDED)
    [full] = heldout.open_sets([manifest], [label], heldout.PADDED)
    assert capped.size(3) == 3 and capped._count < full.size()
    a, b = capped.instances(np.arange(5)), full.instances(np.arange(5))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    heldout.close_sets([capped, full])


def test_packed_sets_are_the_sources_heldout_records_and_batches_pad_past_the_end(validation):
    _, _, manifest = validation
    labels = heldout.choose_sets([manifest], None)
    [packed] = heldout.open_sets([manifest], labels[:1], heldout.PACKED)
    spec = next(s for s in sources_from_manifests([manifest], HELDOUT) if s.name == labels[0])
    records = SplitSource(manifest, spec, HELDOUT).read(np.arange(spec.records))
    G = 4
    n = heldout.num_batches(packed, G, None)
    assert n == -(-spec.records // G)
    rows = [heldout.host_batch(packed, b, G, h, 2) for b in range(n) for h in range(2)]
    tokens = np.concatenate([r["tokens"] for r in rows])
    assert np.array_equal(tokens[: spec.records], records.astype(np.int32))
    assert (tokens[spec.records :] == PAD_ID).all() and not np.concatenate([r["loss_mask"] for r in rows])[
        spec.records :
    ].any()
    want = batch_fields(records.astype(np.int32), EOS_ID, PAD_ID)
    assert np.array_equal(np.concatenate([r["loss_mask"] for r in rows])[: spec.records], want["loss_mask"])
    assert heldout.num_batches(packed, G, 1) == 1
    heldout.close_sets([packed])


def test_unknown_eval_sets_are_refused_naming_the_choices(validation):
    _, _, manifest = validation
    with pytest.raises(ValueError, match="eval.sets names \\['nope'\\].*c4_en-validation"):
        heldout.choose_sets([manifest], ["nope"])
