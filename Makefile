# The two entry points of the README quickstart. Both create .venv when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: demo test test-extra test-fast install clean lessons compile-7b compile-long compile-check check fix sample-proxy-long

# make demo: the package alone (what the demo runs); make test: plus the test extra (the reference
# implementations the tests compare with: torch CPU, transformers, ai2-olmo-core) and the `tpu` extra
# (jax[tpu]: libtpu, the TPU compiler, for python -m trainer.compile and its tests; on a machine
# without a chip the tests keep JAX on the CPU, tests/conftest.py).
# Each install says what it brings, how big and how long before pip starts (pip is quiet until done).
# Sizes: the package's install measured on a fresh clone (issue 55: 1.8 GB, ~2.5 min); the extras'
# the du of a .venv with them all (4.1 GB) less that.
$(STAMP): pyproject.toml
	@echo "== installing olmax and its dependencies (JAX, Apache Beam, ...) into $(VENV): the first time about 1.8 GB and 2-3 minutes, quiet until done"
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $(STAMP)

install: $(STAMP)

$(TEST_STAMP): $(STAMP)
	@echo "== adding the test and tpu extras (torch CPU, transformers, OLMo-core, olmo_eval, libtpu) into $(VENV): the first time about 2.3 GB more and a few minutes, quiet until done"
	$(BIN)/python -m pip install -q -e '.[test,tpu]'
	touch $(TEST_STAMP)

# the dev extra: ruff, mypy and import-linter (pinned), and pre-commit; mypy needs the package's own dependencies too
$(DEV_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(DEV_STAMP)

# make check: lint, formatting, types and the import layers (import-linter's contracts), zero
# findings (configured in pyproject.toml; CI runs it before make test). make fix: the formatter and ruff's safe fixes (what is left is fixed by hand).
check: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m mypy
	$(BIN)/lint-imports

fix: $(DEV_STAMP)
	$(BIN)/ruff check --fix --exit-zero .
	$(BIN)/ruff format .

RUN_DIR ?= runs/demo
REPORT_DIR ?= out/audit

# tokenize the embedded sample → train the tiny model on it → audit data and run. Quiet: a line per
# stage and the seconds it took, the job's summary table, a progress line every 5 steps, the audit's verdicts.
TOOK = echo "   took $$(( $$(date +%s) - t )) s"
demo: $(STAMP)
	@echo "== 1/3 tokenize the embedded sample (Apache Beam, DirectRunner) -> out/sample"
	@t=$$(date +%s); $(BIN)/python -m pipelines.tokenize --output out/sample && $(TOOK)
	@rm -rf $(RUN_DIR)
	@echo "== 2/3 train the tiny model on it (20 steps, CPU) -> $(RUN_DIR)"
	@t=$$(date +%s); $(BIN)/python -m trainer.main --run_dir $(RUN_DIR) log.progress_every=5 && $(TOOK)
	@echo "== 3/3 audit the data and the run (and the data against the recipe's downstream tasks) -> $(REPORT_DIR)"
	@t=$$(date +%s); $(BIN)/python -m audit --data out/sample/manifest.json --run $(RUN_DIR) --out $(REPORT_DIR) \
		--eval-tasks trainer/configs/downstream/tiny && $(TOOK)
	@echo
	@echo "shards + manifest: out/sample/manifest.json"
	@echo "training metrics:  $(RUN_DIR)/metrics.jsonl  (summary: $(RUN_DIR)/summary.json)"
	@echo "audit report:      $(REPORT_DIR)/report.html  (verdicts: $(REPORT_DIR)/audit.json)"

# the case study's two failures replayed: correct vs double sharding vs bf16 Adam moments, each
# compared with the correct run and audited (measured 18 minutes wall on the 2 cores shared with
# other jobs, load 3-4.5: bench/RESULTS.md#lessons); then the contamination lesson: planted task
# instances vs the same data decontaminated, audited, scored on the clean subset (38 minutes at
# load 9-13: bench/RESULTS.md, "Lessons: contamination"). out/lessons/index.html; one of them:
# python -m lessons --out out/lessons --lessons loss|contamination
lessons: $(STAMP)
	$(BIN)/python -m lessons --out out/lessons

# make test: the whole suite, what CI runs, on two pytest-xdist workers; a file's tests stay on one
# worker (--dist loadfile: its module fixtures are built once), and the session fixtures (Beam jobs,
# the reference trainer run) are built once for both (tests/shared.py). make test-fast: the
# developer's loop, without the tests marked slow (CI still runs them), the chip tests and the
# compile checks.
TEST_WORKERS ?= 2
# --no-loadscope-reorder: the files are dealt out in tests/conftest.py's order (the longest first),
# not xdist's default (the files with the most tests first, which left the longest ones for the end)
PYTEST_PARALLEL = $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 --durations-min=20

test: $(TEST_STAMP)
	$(PYTEST_PARALLEL) tests

# test-extra: the proofs marked ci_extra (OLMo-core's own checkpoints continued, its padded head and its
# evaluator, the bounds/bf16/scale runs; olmo_eval; conversions under a memory cap; bench smoke runs):
# ~10 min on 2 cores, run by CI in its own step after make test
test-extra: $(TEST_STAMP)
	$(PYTEST_PARALLEL) -m ci_extra tests

test-fast: $(TEST_STAMP)
	$(PYTEST_PARALLEL) -m "not slow and not tpu and not compile_check" tests

# the OLMo 3 7B stage-1 step compiled for TPU slices by libtpu on this CPU (tests/trainer/test_compile_7b.py).
# compile-7b: one step on v5p-64 (~2 min of one core: a third of a 2-core make test's compile work
# in one test, so CI runs it in its own step after make test); compile-check: that one and the rest
# (full logits vs chunked loss, the recipe's batch on v5p-8: minutes each)
compile-7b: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -m compile_7b tests/trainer/test_compile_7b.py

# compile-long: the 65k one-chip proxy step's memory plan for v5e:1x1 (tests/trainer/test_compile_long.py,
# compile_plan): trainer.compile stopped at the compiler's buffer assignment, where the fit is decided,
# its total checked against the capacity: ~1 min of CPU (49-62 s measured; the report ~2 min after the
# start on a lightly loaded 2-core box; the test 5 min of wall time at load 8-12, 12 min at load 13-19).
# CI runs it after compile-7b. The whole compiles (the 32k and 65k proxies, the backend's code generation
# too: 12 min of CPU for the 65k one, tens of minutes of wall time) run in make compile-check.
compile-long: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -m compile_plan tests/trainer/test_compile_long.py

compile-check: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -m "compile_check or compile_7b or compile_long or compile_plan" tests/trainer/test_compile_7b.py tests/trainer/test_compile_long.py tests/trainer/test_compile_stage3.py tests/trainer/test_compile_context.py

# sample-proxy-long: the data of the long one-chip proxy recipes (olmo3-7b-proxy-v5e{,-mxu}-{32k,65k}.yaml):
# the embedded sample at 32,768 and 65,536 tokens, best-fit packed (~25 s each on 2 cores)
sample-proxy-long: $(STAMP)
	$(BIN)/python -m pipelines.tokenize --mixture data_manifests/mixtures/sample-proxy-32k.yaml --output out/sample-proxy-32k
	$(BIN)/python -m pipelines.tokenize --mixture data_manifests/mixtures/sample-proxy-65k.yaml --output out/sample-proxy-65k

clean:
	rm -rf out runs .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
