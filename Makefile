# The two commands of the README:
#   make demo   -- create .venv if needed, install, run the main job on its default
#   make test   -- same set-up, run the test suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.popgrad-installed

.PHONY: demo test bench install clean

$(STAMP): setup.cfg setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/popgrad run

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/bench_exact.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
