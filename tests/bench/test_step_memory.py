"""The footprint probe of bench.step_memory: the bisection finds the largest ballast that fits."""

from __future__ import annotations

import pytest

from bench.step_memory import largest_that_fits


@pytest.mark.parametrize("largest", [0, 1, 7, 63, 64])
def test_bisection_finds_the_largest_size_that_fits(largest):
    asked: list[int] = []

    def fits(n: int) -> bool:
        asked.append(n)
        return n <= largest * 10

    assert largest_that_fits(fits, 640, 10) == largest * 10
    assert len(asked) <= 7 and all(n % 10 == 0 and 0 < n <= 640 for n in asked)


def test_bisection_rounds_down_to_the_resolution():
    assert largest_that_fits(lambda n: n <= 250, 1000, 100) == 200
