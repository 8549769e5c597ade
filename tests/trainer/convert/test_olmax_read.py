"""trainer.convert.olmax_read: a saved step read leaf by leaf (and layer by layer) equals what was
saved, bit for bit, Adam's moments found under the skip step's wrapper; torn, damaged and foreign
inputs are refused with one line."""

from __future__ import annotations

import shutil

import jax
import numpy as np
import pytest

from tests.trainer.checkpoint_fixtures import flip_byte, saved
from trainer.convert.olmax_read import OlmaxStep, OlmaxStepRefused, find_step_dir


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("olmax_read")
    ckpt, params, opt_state = saved(root, [2, 3])
    ckpt.close()
    return root, params, opt_state


def _leaf(tree, path):
    for k in path:
        tree = tree[k]
    return np.asarray(tree)


def test_each_parameter_read_alone_is_the_saved_array_bit_for_bit(run):
    root, params, _ = run
    step = OlmaxStep.open(root, items=("params", "opt_state"))
    assert step.step == 3
    tensors = step.tensors("params")
    assert {t.path for t in tensors} == {("embed", "embedding"), ("lm_head", "kernel")}
    for t in tensors:
        want = _leaf(params, t.path)
        assert t.shape == want.shape and t.dtype == want.dtype.name
        assert step.read(t).tobytes() == want.tobytes()
        assert step.read(t, 2).tobytes() == want[2].tobytes()  # one row of the leading axis alone


def test_adam_moments_and_count_are_found_under_the_skip_step_wrapper(run):
    root, params, opt_state = run
    step = OlmaxStep.open(root, step=2, items=("params", "opt_state"))
    adam = step.adam()
    assert adam is not None and adam.count.path == ("inner_state", "1", "count")
    inner = opt_state.inner_state[1]
    for path in (("embed", "embedding"), ("lm_head", "kernel")):
        assert step.read(adam.mu[path]).tobytes() == _leaf(inner.mu, path).tobytes()
        assert step.read(adam.nu[path]).tobytes() == _leaf(inner.nu, path).tobytes()
    assert int(step.read(adam.count)) == int(jax.device_get(inner.count)) == 1
    names = {t.path[0] for t in step.tensors("opt_state")}
    assert {"losses", "grad_norms", "seen"} <= names  # the skip step's own leaves are listed too


def test_a_run_directory_its_checkpoints_folder_and_a_step_directory_name_the_same_step(run):
    root = run[0]
    assert find_step_dir(root) == find_step_dir(root / "checkpoints") == root / "checkpoints" / "3"
    assert find_step_dir(root / "checkpoints" / "2") == root / "checkpoints" / "2"
    with pytest.raises(OlmaxStepRefused, match="has no step 7 \\(it has 2, 3\\)"):
        find_step_dir(root, 7)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda s: (s / "olmax_checksums.json").unlink(), "a torn step: no olmax_checksums.json"),
        (lambda s: (s / "params" / "commit_success.txt").unlink(), "params/ has no commit_success.txt"),
        (lambda s: s.rename(s.with_name("3.orbax-checkpoint-tmp-1")), "a torn step \\(orbax's temporary"),
        (lambda s: flip_byte(max((s / "params").rglob("d/*"), key=lambda p: p.stat().st_size)), "sha256 mismatch"),
    ],
    ids=["unsealed", "no-commit-marker", "orbax-tmp-dir", "flipped-byte"],
)
def test_a_torn_or_damaged_step_is_refused_before_any_tensor_is_read(run, tmp_path, damage, message):
    copy = tmp_path / "run"
    shutil.copytree(run[0], copy)
    step_dir = copy / "checkpoints" / "3"
    damage(step_dir)
    target = step_dir if step_dir.exists() else step_dir.with_name("3.orbax-checkpoint-tmp-1")
    with pytest.raises(OlmaxStepRefused, match=message):
        OlmaxStep.open(target)


def test_a_directory_that_holds_no_olmax_step_is_refused_in_one_line(tmp_path):
    (tmp_path / "model_and_optim").mkdir()
    with pytest.raises(OlmaxStepRefused, match="is not an olmax checkpoint step") as e:
        OlmaxStep.open(tmp_path)
    assert "\n" not in str(e.value)
    with pytest.raises(OlmaxStepRefused, match="no such file"):
        OlmaxStep.open(tmp_path / "missing")
