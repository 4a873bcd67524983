# Two set-up commands: `make book` and `make test` (see README.md).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
HTML   := _build/html/index.html

.PHONY: help book test lab clean unit site-tests

help:
	@echo "make book   install into $(VENV) and build the site ($(HTML))"
	@echo "make test   install, run the tests, build the book, test the built site"
	@echo "make lab    open the chapters as notebooks in JupyterLab"
	@echo "make clean  remove $(VENV), _build and caches"

# The environment: rebuilt when the pins or the package metadata change.
$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	# Build matplotlib's font cache now: on a fresh machine its one-time notice
	# on stderr would otherwise become a build warning in the first chapter.
	MPLBACKEND=Agg $(PY) -c "import matplotlib.pyplot"
	touch $@

# Every chapter is executed (cached in _build/.jupyter_cache); warnings are errors.
book: $(STAMP)
	mkdir -p _build
	$(VENV)/bin/jupyter-book build . -n -W --keep-going 2>&1 | tee _build/build.log
	@echo "Built: $(CURDIR)/$(HTML)"

unit: $(STAMP)
	$(PY) -m pytest -m "not built_book" -q

site-tests: $(STAMP)
	$(PY) -m pytest -m built_book -q

test: unit book site-tests

lab: $(STAMP)
	$(VENV)/bin/jupyter lab --ServerApp.jpserver_extensions="{'jupytext': True}" book/

clean:
	rm -rf $(VENV) _build .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
