"""Mixture files shipped with olmax (installed with the package so the default run finds them)."""
