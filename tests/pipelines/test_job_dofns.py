"""Our Beam DoFns are ones Beam accepts without a warning (e.g. no `yield` mixed with `return value`),
and the dedup key pass emits nothing for a file that cannot be read whole."""

from __future__ import annotations

import gzip
import inspect
import logging

import apache_beam as beam

from pipelines import job


def _dofn_classes() -> list[type]:
    return [
        c
        for _, c in inspect.getmembers(job, inspect.isclass)
        if issubclass(c, beam.DoFn) and c.__module__ == job.__name__
    ]


def test_every_dofn_of_the_job_is_wrapped_by_beam_without_a_warning(caplog):
    classes = _dofn_classes()
    assert job.DocKeys in classes and job.PickKept in classes
    with caplog.at_level(logging.WARNING):
        for cls in classes:
            beam.ParDo(cls.__new__(cls))  # ParDo inspects `process`; no constructor arguments needed
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == []


def test_doc_keys_of_an_unreadable_file_are_not_emitted(tmp_path):
    good, bad = tmp_path / "good.jsonl.gz", tmp_path / "bad.jsonl.gz"
    lines = b'{"id": "a", "text": "hello"}\n{"id": "b", "text": "world"}\n'
    good.write_bytes(gzip.compress(lines))
    bad.write_bytes(gzip.compress(lines)[:-12])  # truncated: the file cannot be read to its end
    keys = list(job.DocKeys().process(("web", str(good), 0, 1)))
    assert [k[1][1] for k in keys] == ["a", "b"]
    assert list(job.DocKeys().process(("web", str(bad), 0, 1))) == []
