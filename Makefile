# The README's two commands: `make demo` and `make test`. Both build .venv on first use.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# torch 2.13.0's CPU wheel lies in /opt/wheels on these machines; pip also finds it there via its config.
FIND    := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)

.PHONY: demo test bench install clean browser pdf-libs

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(FIND) "torch==2.13.0"
	$(BIN)/python -m pip install -q $(FIND) -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/setflow demo $(DEMO_ARGS)

# the browser test drives Debian's Chromium (no browser download): installed here when absent
# and apt-get can (root); else that one test skips and says why
browser:
	@test -x /usr/bin/chromium || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "make: /usr/bin/chromium is absent and could not be installed: the browser test will skip"

# WeasyPrint (the PDF export) wants HarfBuzz's subsetter to embed only the glyphs a PDF uses:
# installed here when absent and apt-get can (root); without it PDFs embed whole fonts
pdf-libs:
	@ldconfig -p | grep -q libharfbuzz-subset.so.0 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libharfbuzz-subset0 >/dev/null; } || \
	  echo "make: libharfbuzz-subset0 is absent and could not be installed: PDFs embed whole fonts"

# ruff first (seconds): a lint error fails the run before the suite starts
# in two processes (pytest-xdist, a test file to each, the longest files first: tests/conftest.py's
# FIRST, kept in that order by --no-loadscope-reorder); `make test PYTEST_ARGS=` runs it serially
PYTEST_ARGS ?= -n 2 --dist loadfile --no-loadscope-reorder

test: $(STAMP) browser pdf-libs
	$(BIN)/ruff check .
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/decode.py
	$(BIN)/python bench/quality.py
	$(BIN)/python bench/resume.py
	$(BIN)/python bench/load.py
	$(BIN)/python bench/documents.py
	$(BIN)/python bench/api.py
	$(BIN)/python bench/agent.py
	$(BIN)/python bench/batch.py
	$(BIN)/python bench/qwen.py --quick

clean:
	rm -rf $(VENV) .pytest_cache
