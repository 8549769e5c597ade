"""Mixture YAMLs: sample.yaml (the default), olmo3-stage1.yaml, olmo3-stage2.yaml."""
