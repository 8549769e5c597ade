"""libtpu_flags: a recipe's compiler flags reach LIBTPU_INIT_ARGS before the backend starts, an
operator's own value wins, a bad flag is refused at load, and a recipe without flags records the
same config bytes as before the key existed (tests/trainer/test_config_record.py's digests)."""

from __future__ import annotations

import argparse
import os

import pytest

from trainer import libtpu_flags
from trainer.config.loading import ConfigError
from trainer.config.schema import load_config

VMEM = {"xla_tpu_scoped_vmem_limit_kib": 98304}


def test_the_recipes_flags_are_appended_after_the_environments():
    env = {"LIBTPU_INIT_ARGS": "--xla_enable_async_all_gather=true"}
    assert libtpu_flags.apply({**VMEM, "xla_tpu_megacore_fusion": False}, env) == []
    assert env["LIBTPU_INIT_ARGS"] == (
        "--xla_enable_async_all_gather=true --xla_tpu_scoped_vmem_limit_kib=98304 --xla_tpu_megacore_fusion=false"
    )
    fresh: dict[str, str] = {}
    libtpu_flags.apply(VMEM, fresh)
    assert fresh == {"LIBTPU_INIT_ARGS": "--xla_tpu_scoped_vmem_limit_kib=98304"}


def test_a_flag_the_environment_sets_keeps_the_environments_value():
    env = {"LIBTPU_INIT_ARGS": "--xla_tpu_scoped_vmem_limit_kib=65536"}
    assert libtpu_flags.apply(VMEM, env) == ["xla_tpu_scoped_vmem_limit_kib"]
    assert env["LIBTPU_INIT_ARGS"] == "--xla_tpu_scoped_vmem_limit_kib=65536"
    untouched: dict[str, str] = {}
    assert libtpu_flags.apply({}, untouched) == [] and untouched == {}  # no flags: the variable is not created


def test_flags_are_recorded_only_when_a_recipe_sets_them():
    assert "libtpu_flags" not in load_config(None).to_dict()
    cfg = load_config(None, ["libtpu_flags.xla_tpu_scoped_vmem_limit_kib=98304"])
    assert cfg.libtpu_flags == VMEM and cfg.to_dict()["libtpu_flags"] == VMEM


@pytest.mark.parametrize("override", ["libtpu_flags.--xla_x=1", "libtpu_flags.Xla=1", "libtpu_flags.xla_x='a b'"])
def test_a_malformed_flag_is_refused_at_load(override):
    with pytest.raises(ConfigError, match="libtpu_flags"):
        load_config(None, [override])


def test_trainer_main_sets_them_before_jax_starts(monkeypatch):
    """init_jax puts the recipe's flags into the environment (JAX's backend, started later, reads them)."""
    from trainer import main

    monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
    cfg = load_config(None, ["libtpu_flags.xla_tpu_scoped_vmem_limit_kib=98304"])
    args = argparse.Namespace(coordinator=None, num_processes=None, process_id=None, distributed=False)
    main.init_jax(args, cfg)
    assert os.environ["LIBTPU_INIT_ARGS"] == "--xla_tpu_scoped_vmem_limit_kib=98304"
