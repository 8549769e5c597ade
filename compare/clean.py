"""--downstream_clean: each task's clean-subset metrics (downstream.clean_from's keys, ending " clean")
judged in place of its full ones, on whichever side logged them; which side did is said in the
summary and the page, and a comparison where neither did is UNKNOWN (never the full metrics judged
in their place without a word)."""

from __future__ import annotations

import dataclasses
from typing import Any

from .curves import Curves
from .downstream import CLEAN, clean_view, is_key


def has_clean(c: Curves) -> bool:
    """Whether the side logged any task's clean-subset metrics (keys ending " clean")."""
    return any(k.endswith(CLEAN) and is_key(k[: -len(CLEAN)]) for k in (*c.values, *c.nonfinite))


@dataclasses.dataclass(frozen=True)
class CleanViews:
    """--downstream_clean: each side's curves with its clean-subset metrics in place of its full
    ones (`clean_view`), whether each side logged any, and the note that says which is judged."""

    run: Curves
    reference: Curves
    run_has: bool
    reference_has: bool

    @property
    def note(self) -> str:
        if self.run_has and self.reference_has:
            return "clean subsets on both sides (keys ending ' clean')"
        if not (self.run_has or self.reference_has):
            return (
                "--downstream_clean, but neither the run nor the reference logged clean-subset metrics (keys "
                "ending ' clean', logged with downstream.clean_from): the clean subsets cannot be judged, and "
                "the full metrics shown are not judged in their place"
            )
        has, lacks = ("run", "reference") if self.run_has else ("reference", "run")
        return (
            f"the {has}'s clean-subset metrics (keys ending ' clean') against the {lacks}'s full metrics: "
            f"the {lacks} logged no clean subsets"
        )


def clean_views(run: Curves, ref: Curves) -> CleanViews:
    return CleanViews(clean_view(run), clean_view(ref), has_clean(run), has_clean(ref))


def with_clean(result: dict[str, Any], clean: CleanViews) -> dict[str, Any]:
    """The downstream verdict of a --downstream_clean comparison: which side's clean subsets were
    judged (`clean`, said in the summary); UNKNOWN, each macro too, when neither side logged any."""
    info = {"run": clean.run_has, "reference": clean.reference_has, "note": clean.note}
    out = {**result, "clean": info, "summary": f"{clean.note}; {result['summary']}"}
    if clean.run_has or clean.reference_has:
        return out
    macros = {
        k: {**m, "passed": None, "summary": f"UNKNOWN: no clean subsets (--downstream_clean); {m['summary']}"}
        for k, m in result["macros"].items()
    }
    return {**out, "passed": None, "macros": macros, "summary": f"UNKNOWN: {out['summary']}"}
