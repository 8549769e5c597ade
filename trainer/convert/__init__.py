"""Checkpoint conversion: `python -m trainer.convert SUBCOMMAND` (see trainer/README.md)."""
