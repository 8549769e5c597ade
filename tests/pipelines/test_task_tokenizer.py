"""The one task-folder tokenizer check (pipelines.task_tokenizer) that the trainer, the audit's
--eval-tasks and the mixture's decontaminate.tasks make: every recorded key compared with what
the data's vocabulary gives, the fingerprint always, both fingerprints named."""

from __future__ import annotations

import pytest

from contract import TokenizerInfo
from pipelines import task_tokenizer as tt
from pipelines.vocabularies import DOLMA2, PROXY32K


def _info(v, **changes):
    return TokenizerInfo(
        **{
            **dict(name=v.name, vocab_size=v.vocab_size, eos_id=v.eos_id, pad_id=v.pad_id, ranks_sha256=v.ranks_sha256),
            **changes,
        }
    )


def test_the_builders_entry_passes_for_a_manifest_tokenizer_and_for_its_name():
    entry = tt.expected_entry("dolma2")
    assert tt.problem(entry, _info(DOLMA2)) is None and tt.problem(entry, "dolma2") is None
    index_entry = {k: entry[k] for k in ("name", "vocab_size", "fingerprint")}  # what an index records
    assert tt.problem(index_entry, "dolma2") is None
    tt.check("--eval-tasks x", entry, "dolma2")


@pytest.mark.parametrize("changes", [{"pad_id": DOLMA2.eos_id}, {"eos_id": 0}, {"fingerprint": "f" * 64}, {}])
def test_other_ids_are_refused_in_one_line_naming_both_fingerprints(changes):
    entry = {**tt.expected_entry("dolma2"), **changes}
    if not changes:  # another vocabulary's folder under the data's name
        entry = {**tt.expected_entry("dolma2-proxy32k"), "name": "dolma2"}
    with pytest.raises(tt.TaskTokenizerError) as e:
        tt.check("--eval-tasks DIR", entry, _info(DOLMA2))
    msg = str(e.value)
    assert msg.startswith("--eval-tasks DIR was built with another tokenizer than the data's: ") and "\n" not in msg
    assert str(entry["fingerprint"])[:16] in msg and tt.expected_entry("dolma2")["fingerprint"][:16] in msg
    assert all(f"{k} " in msg for k in changes)
    assert "rebuild it with: python -m pipelines.downstream_tasks --tokenizer dolma2" in msg


def test_an_entry_without_a_fingerprint_or_data_of_an_unknown_vocabulary_is_refused():
    entry = {k: v for k, v in tt.expected_entry("dolma2-proxy32k").items() if k != "fingerprint"}
    assert "fingerprint None" in str(tt.problem(entry, "dolma2-proxy32k"))
    with pytest.raises(tt.TaskTokenizerError, match="not one of the vocabularies"):
        tt.problem(tt.expected_entry("dolma2"), _info(PROXY32K, ranks_sha256="0" * 64))
    with pytest.raises(tt.TaskTokenizerError, match="not one of the vocabularies"):
        tt.problem(tt.expected_entry("dolma2"), "gpt2")
