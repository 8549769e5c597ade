"""One reader of a finished run: its seq_len, tokens per step, tokenizer and data, by one fallback policy.

    done = FinishedRun.read(run)                   # a run directory (contract.rundir.RunDir)
    done = FinishedRun.read(run, step_meta=meta)   # one checkpoint step of it (its meta item)
    done.seq_len, done.global_batch_size, done.tokens_per_step, done.tokenizer,
    done.data_fingerprints, done.source

The fallback policy (``FALLBACK``), the same for every fact: the first of these that says it.
  1. run.json (``contract.run.RunRecord``): the trainer writes it at every start, before the first
     step. A damaged one is refused (``RunRecordError``), never taken for "no record".
  2. the config the run recorded: a checkpoint step's meta (its ``seq_len``, the data's, and its
     ``config``), else the run's config.json (``config``): global_batch_size and seq_len as the
     config typed them; what the config leaves out (seq_len None, the tokenizer, the fingerprints)
     from the manifests its ``data`` names, loaded through the contract (fingerprints recomputed).
  3. nothing says it: ``FinishedRunError`` (a ``Refused``) naming what was looked for. The tokenizer
     alone may be unknown (None: a record from before run.json that names no data).
A fact is read when it is asked for: a comparison given its tokens per step reads no manifest.
``seq_len_of(seq_len, data)`` is step 2's seq_len rule for a config that has not run yet
(``trainer.compile``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import Refused
from .manifest import Manifest, ManifestError, TokenizerInfo
from .run import RunRecord, RunRecordError
from .rundir import RunDir

STEP_META = "the step's meta"  # where a checkpoint step's own record is read (``step_meta``)
FALLBACK = (RunDir.RUN_RECORD, STEP_META, RunDir.CONFIG)  # the order the facts are looked for in


class FinishedRunError(Refused, ValueError):
    """A fact of a run that nothing it recorded says, or a record that cannot be read (the message
    names the run and what was looked for)."""


@dataclasses.dataclass(frozen=True)
class FinishedRun:
    """What a finished run recorded about its data (``read``); each fact by ``FALLBACK``."""

    run: RunDir
    record: RunRecord | None  # run.json, when the run has one
    config: Mapping[str, Any] | None  # the recorded config (read only without run.json), else None
    meta_seq_len: int | None  # a step's meta: the data's seq_len (the start-up's Checked.seq_len)
    source: str  # where the facts come from: one of FALLBACK, or "" (nothing recorded)

    @classmethod
    def read(cls, run: RunDir, step_meta: Mapping[str, Any] | None = None) -> FinishedRun:
        """The run's record: run.json if it has one, else ``step_meta`` (a checkpoint step's meta
        item, when a step is read), else its config.json. FinishedRunError for a damaged file."""
        if run.run_record.is_file():
            try:
                return cls(run, RunRecord.load(run), None, None, RunDir.RUN_RECORD)
            except RunRecordError as e:  # (it names the file)
                raise FinishedRunError(str(e)) from None
            except OSError as e:
                raise FinishedRunError(f"{run.run_record}: {e}") from None
        if step_meta is not None:
            seq_len = step_meta.get("seq_len")
            config = step_meta.get("config") or {}
            return cls(run, None, _mapping(config, STEP_META), None if seq_len is None else int(seq_len), STEP_META)
        if run.config.is_file():
            try:
                config = json.loads(run.config.read_text(encoding="utf-8"))["config"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise FinishedRunError(
                    f"{run.config}: cannot be read as the run's config ({type(e).__name__}: {e})"
                ) from None
            return cls(run, None, _mapping(config, str(run.config)), None, RunDir.CONFIG)
        return cls(run, None, None, None, "")

    # -- the facts
    @property
    def seq_len(self) -> int:
        """The data's sequence length."""
        if self.record is not None:
            return self.record.seq_len
        if self.meta_seq_len is not None:
            return self.meta_seq_len
        typed = (self.config or {}).get("seq_len")
        if typed is not None:
            return int(typed)
        if self._data():
            return self._manifests[0].seq_len
        raise FinishedRunError(f"{self.run}: the run's seq_len is not known ({self._looked_in()})")

    @property
    def global_batch_size(self) -> int:
        """Examples per optimizer step, over all hosts."""
        if self.record is not None:
            return self.record.global_batch_size
        G = (self.config or {}).get("global_batch_size")
        if G is None:
            raise FinishedRunError(f"{self.run}: the run's global_batch_size is not known ({self._looked_in()})")
        try:
            return int(G)
        except (TypeError, ValueError):
            raise FinishedRunError(f"{self.run}: global_batch_size {G!r} in {self.source} is not an integer") from None

    @property
    def tokens_per_step(self) -> int:
        """Tokens one optimizer step reads (PAD included): global_batch_size × seq_len."""
        return self.global_batch_size * self.seq_len

    @property
    def tokenizer(self) -> TokenizerInfo | None:
        """The data's tokenizer; None when nothing the run recorded names it or its data."""
        if self.record is not None:
            return self.record.tokenizer
        return self._manifests[0].tokenizer if self._data() else None

    @property
    def data_fingerprints(self) -> tuple[str, ...]:
        """Each manifest's fingerprint, in the run's data order."""
        if self.record is not None:
            return self.record.manifest_fingerprints
        if not self._data():
            raise FinishedRunError(f"{self.run}: the run's data is not known ({self._looked_in()})")
        return tuple(m.fingerprint for m in self._manifests)

    # -- step 2's manifests
    def _data(self) -> tuple[str, ...]:
        data = (self.config or {}).get("data") or ()
        return (data,) if isinstance(data, str) else tuple(str(p) for p in data)

    @functools.cached_property
    def _manifests(self) -> tuple[Manifest, ...]:
        try:
            return tuple(Manifest.load(p) for p in self._data())
        except ManifestError as e:
            raise FinishedRunError(f"{self.run}: the manifest its {self.source} names is refused: {e}") from None
        except OSError as e:
            raise FinishedRunError(f"{self.run}: the manifest its {self.source} names cannot be read: {e}") from None

    def _looked_in(self) -> str:
        if not self.source:
            return f"no {RunDir.RUN_RECORD} and no {RunDir.CONFIG}"
        return f"no {RunDir.RUN_RECORD}, and {self.source} records neither it nor a manifest"


def seq_len_of(seq_len: int | None, data: Sequence[str | os.PathLike[str]]) -> int:
    """A config's data seq_len by step 2's rule: the one it types, else its first manifest's
    (fingerprint recomputed). FinishedRunError when it types none and that manifest cannot be read."""
    if seq_len is not None:
        return seq_len
    if not data:
        raise FinishedRunError("the config sets no seq_len and names no data")
    try:
        return Manifest.load(os.fspath(data[0])).seq_len
    except (OSError, ValueError) as e:
        raise FinishedRunError(f"the config sets no seq_len and its manifest {data[0]} cannot be read ({e})") from None


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise FinishedRunError(f"{where}: the recorded config is {type(value).__name__}, not an object")
    return value
