"""OLMo 3 pre-training in JAX: ``python -m trainer.main`` (see trainer/README.md).

config (typed YAML + overrides) · optim (AdamW, schedules, skip step) · loss (CE + z-loss) ·
mesh (devices, global batches) · step (jitted train/eval) · checkpoint (orbax) · logs (metrics,
data log, summary, hashes) · loop (one run) · main (CLI).
"""
