"""The contract's source extensions (issue 11): format/dtype/split of mixture sources, the
remainder of token-file sources, and the data orders a run may name."""

from __future__ import annotations

import json

import pytest

import contract as c
from tests.contract.test_contract import _manifest


def _with(fn):
    m = json.loads(json.dumps(_manifest()))
    fn(m)
    return c.with_fingerprint(m)


def test_tokens_sources_with_their_remainder_are_valid():
    def tokens(m):
        m["mixture"]["sources"][0].update(format="tokens", dtype="uint16", split="heldout")
        m["sources"]["a"]["remainder"] = {"tokens": 3, "documents": 1}

    m = c.Manifest.from_json(_with(tokens))
    assert c.source_format(m.mixture_sources()[0]) == c.TOKENS
    assert c.source_format({"name": "x"}) == c.JSONL  # absent = jsonl


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda m: m["mixture"]["sources"][0].update(format="npy"), "format 'npy' not in"),
        (lambda m: m["mixture"]["sources"][0].update(format="tokens", dtype="int64"), "dtype 'int64' not in"),
        (lambda m: m["mixture"]["sources"][0].update(split="test"), "split 'test' not in"),
        (lambda m: m["sources"]["a"].update(remainder={"tokens": 1}), "remainder: must be {tokens, documents}"),
    ],
)
def test_malformed_source_extensions_are_contract_errors(edit, message):
    with pytest.raises(c.ManifestError, match=message):
        c.validate(_with(edit))


def test_orders_by_config_name():
    assert c.order_named("grain") == c.INDEX_SHUFFLE and c.order_named("olmo-core") == c.OLMO_CORE
    assert c.OLMO_CORE.to_json() == {"name": "olmo-core.numpy_fsl", "version": 1}
    with pytest.raises(ValueError, match=r"unknown data order 'x'; choose one of \['grain', 'olmo-core'\]"):
        c.order_named("x")
