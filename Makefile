# The two commands of the README:
#   make demo   -- create .venv if needed, install, run the main job on its default
#   make test   -- same set-up, run the test suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.popgrad-installed

.PHONY: demo test bench bench-deps mutants install clean

$(STAMP): setup.cfg setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/popgrad run

test: $(STAMP)
	$(PY) -m pytest -q

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

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
