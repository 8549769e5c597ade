"""trainer.checkpointing.rules proved directly: no files, no orbax, no collectives. (The rules the
processes agree by are proved in test_checkpoint_processes.py, shape_differences in test_checkpoint.py.)"""

from __future__ import annotations

from trainer.checkpointing.rules import (
    CHECKSUMS,
    LEGACY,
    UNSEALED,
    CheckpointError,
    listing_reason,
    no_intact_error,
    resume_verdict,
    write_failed,
)

DAMAGED = "sha256 mismatch in 1 file(s), e.g. params/d/x"


def test_a_step_without_checksums_is_a_crash_if_marked_pending_else_legacy_and_trusted_only_when_told():
    assert resume_verdict(None, False, False) == (None, False)
    assert resume_verdict(DAMAGED, False, True) == (DAMAGED, False)  # damage is never trusted
    assert resume_verdict(UNSEALED, True, True) == (UNSEALED, False)  # nor a step a crash left unsealed
    assert resume_verdict(UNSEALED, False, False) == (LEGACY, False)
    assert resume_verdict(UNSEALED, False, True) == (None, True)  # sealed now, then taken


def test_no_intact_step_refuses_to_start_unless_every_step_only_lacks_its_checksums():
    assert no_intact_error("ck", []) is None  # a fresh run
    assert no_intact_error("ck", [(8, UNSEALED), (4, UNSEALED)]) is None  # a crash before the first checksums
    error = no_intact_error("ck", [(8, UNSEALED), (4, DAMAGED)])
    assert isinstance(error, CheckpointError)
    assert str(error).startswith(
        f"no intact checkpoint in ck:\n  step 8: {UNSEALED}\n  step 4: {DAMAGED}\n"
        "refusing to start this run from scratch over them"
    )
    assert "trust_unverified" not in str(error)
    assert str(no_intact_error("ck", [(4, LEGACY)])).endswith(
        "; to resume a step written without checksums, add the override checkpoint.trust_unverified=true"
    )


def test_a_listing_fits_its_checksum_file_file_for_file():
    items, recorded = ("params", "meta"), {"params/a": "0", "meta/m": "1"}
    assert listing_reason(items, recorded, ["meta/m", "params/a"]) is None
    assert listing_reason(items, {"params/a": "0"}, ["params/a"]) == f"{CHECKSUMS} records no file of item(s) meta"
    assert listing_reason(items, recorded, ["params/a"]) == "1 recorded file(s) missing, e.g. meta/m"
    assert (
        listing_reason(items, recorded, ["meta/m", "params/a", "params/b"])
        == f"1 file(s) not in {CHECKSUMS}, e.g. params/b"
    )


def test_a_failed_write_names_the_step_to_resume_from():
    assert write_failed(10, "No space left on device", 5).startswith(
        "writing checkpoint 10 failed (No space left on device): it was not saved; the newest saved checkpoint is 5"
    )
    assert write_failed(4, "File too large", None).endswith("run the same command to start again")
