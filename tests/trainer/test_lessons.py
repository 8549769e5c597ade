"""`make lessons`: the three runs differ from the correct one in exactly their one setting."""
import dataclasses

import pytest

from trainer.compare import lessons
from trainer.config import load_config


def test_each_lesson_run_differs_from_the_correct_run_in_its_one_setting():
    cfg = lessons.LessonsConfig()
    runs = {name: load_config(lessons.TINY, lessons.overrides(cfg, "m/manifest.json", name)) for name in lessons.RUNS}
    correct = runs["correct"]
    assert correct.UNSAFE_double_sharding_experiment_hosts == 0
    assert (correct.optimizer.mu_dtype, correct.optimizer.nu_dtype) == ("float32", "float32")
    assert not correct.allow_low_precision_optimizer_state
    assert (correct.steps, correct.global_batch_size, correct.data) == (cfg.steps, cfg.global_batch_size,
                                                                        ("m/manifest.json",))
    changed = {name: {k for k, v in dataclasses.asdict(c).items() if v != dataclasses.asdict(correct)[k]}
               for name, c in runs.items()}
    assert changed == {"correct": set(), "double_sharding": {"UNSAFE_double_sharding_experiment_hosts"},
                       "bf16_moments": {"optimizer", "allow_low_precision_optimizer_state"}}
    assert runs["bf16_moments"].optimizer == dataclasses.replace(correct.optimizer, mu_dtype="bfloat16",
                                                                 nu_dtype="bfloat16")


def test_bf16_moments_without_the_opt_in_are_refused():
    from trainer.config import check_state_precision

    cfg = lessons.LessonsConfig()
    bad = [o for o in lessons.overrides(cfg, "m/manifest.json", "bf16_moments")
           if not o.startswith("allow_low_precision")]
    with pytest.raises(ValueError, match="refusing low-precision optimizer state"):
        check_state_precision(load_config(lessons.TINY, bad))
