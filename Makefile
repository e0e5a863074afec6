# The README's two commands: `make demo` and `make test`. Both build .venv on first use.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# torch 2.13.0's CPU wheel lies in /opt/wheels on these machines; pip also finds it there via its config.
FIND    := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)

.PHONY: demo test bench install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(FIND) "torch==2.13.0"
	$(BIN)/python -m pip install -q $(FIND) -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/setflow demo

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/decode.py
	$(BIN)/python bench/quality.py
	$(BIN)/python bench/resume.py
	$(BIN)/python bench/load.py

clean:
	rm -rf $(VENV) .pytest_cache
