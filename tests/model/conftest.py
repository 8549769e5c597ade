"""Fixtures for the model tests (session-scoped: tiny models are built once)."""

from __future__ import annotations

import numpy as np
import pytest

import model
from tests.model.tiny import SEQ_LEN, TINY, randomize, tiny_config


@pytest.fixture(scope="session")
def tiny_cfg() -> model.ModelConfig:
    return tiny_config()


@pytest.fixture(scope="session")
def tiny_params(tiny_cfg) -> dict:
    return randomize(model.abstract_params(tiny_cfg), seed=0)


@pytest.fixture(scope="session")
def tokens() -> np.ndarray:
    return np.random.default_rng(1).integers(0, TINY["vocab_size"], size=(2, SEQ_LEN), dtype=np.int32)
