# The two commands of the README:
#   make demo   -- create .venv if needed, install, run the main job on its default
#   make test   -- same set-up, run the test suite
# and the documentation:
#   make docs   -- same set-up plus the `docs` extra, build docs/_build/html (warnings are errors)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.popgrad-installed
DOCS_STAMP := $(VENV)/.popgrad-docs-installed
SPHINXOPTS ?=

.PHONY: demo test docs docs-clean bench bench-deps mutants install clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/popgrad run

# One worker per logical CPU (at most 4; each compiles its own numba kernels). Work stealing: each worker
# starts on its own contiguous half of the tests and an idle one takes from the end of another's queue, so
# a module's tests mostly share a worker and its module-scoped fixtures run once.
# `$(PY) -m pytest -q` (no -n) runs the same suite in one process. PYTEST_ARGS: more options, e.g.
# `make test PYTEST_ARGS="--durations=30"`.
TEST_WORKERS ?= logical
PYTEST_ARGS ?=
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --maxprocesses 4 --dist worksteal $(PYTEST_ARGS)

$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

# The Sphinx site (README.md, "Documentation"): the gallery runs every example with --quick.
# Incremental: sphinx-gallery reruns only the examples that changed; `make docs-clean` starts over.
docs: $(DOCS_STAMP)
	MPLBACKEND=Agg $(PY) -m sphinx -b html -W --keep-going $(SPHINXOPTS) docs docs/_build/html
	@echo "open docs/_build/html/index.html"

docs-clean:
	rm -rf docs/_build docs/generated docs/auto_examples docs/api.rst docs/sg_execution_times.rst

# The benchmark (benchmarks/README.md): popgrad vs NumPy and JAX peers, exact vs sampled, JIT, roofline.
# JAX is optional (`make bench-deps` installs the `bench` extra); without it the JAX peer is skipped.
bench: $(STAMP)
	$(PY) benchmarks/run.py

bench-deps: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'

# Mutation check (mutation/README.md): wrong formulas planted in a copy, the tests that must catch them run.
# Minutes, not seconds: not part of `make test` or CI.
mutants: $(STAMP)
	$(PY) mutation/mutants.py --all --out mutation/last_run.md

clean: docs-clean
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
