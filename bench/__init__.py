"""Benchmarks, run by hand from the repository root as modules: ``python -m bench.tokenize``,
``python -m bench.loader``, ``python -m bench.model``, ``python -m bench.train``, ``python -m bench.audit``.

A package (not a folder of scripts) so that ``bench/tokenize.py`` never shadows the standard
library's ``tokenize``: running ``python -m bench.X`` puts the repository root, not ``bench/``,
on ``sys.path``. Not installed with the project (see pyproject's packages).
"""
