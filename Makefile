# The two set-up commands of the README. Each creates the virtual environment on
# first use (CPU torch first, so nothing pulls a CUDA build), then runs.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/toolpolicy demo

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) runs
