# Two set-up commands: `make book` and `make test` (see README.md).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
HTML   := _build/html/index.html
# JupyterLab reads default settings from <venv>/share/jupyter/lab/settings/overrides.d:
# this one makes a double click open a chapter (MyST markdown) as a notebook, and
# keeps JupyterLab from asking to fetch news from the web.
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings/overrides.d/lnorm-jupytext.json
# Extra options for `make lab`, e.g. LAB_ARGS=--no-browser on a remote machine.
LAB_ARGS ?=
# Jupyter refuses to run as root (containers) unless told to.
ROOT_ARGS := $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: help book test lab clean lint unit slow site-tests lab-tests

help:
	@echo "make book   install into $(VENV) and build the site ($(HTML))"
	@echo "make test   install; lint, unit and doctests, slow tests, the book, the built site, the chapters in JupyterLab"
	@echo "make lab    open the chapters as notebooks in JupyterLab"
	@echo "make clean  remove $(VENV), _build and caches"

# The environment: rebuilt when the pins or the package metadata change.
$(STAMP): requirements.txt pyproject.toml
	@# Fail here, not halfway through pip with "no matching distribution": the
	@# pins (numpy, matplotlib, ipykernel) need Python 3.11.
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
		|| { echo "$(PYTHON) is older than Python 3.11; run e.g. make PYTHON=python3.11 $(MAKECMDGOALS)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	# Build matplotlib's font cache now: on a fresh machine its one-time notice
	# on stderr would otherwise become a build warning in the first chapter.
	MPLBACKEND=Agg $(PY) -c "import matplotlib.pyplot"
	touch $@

# Every chapter is executed (cached in _build/.jupyter_cache); warnings are errors.
# --all re-reads every page (from the cache: nothing unchanged is executed again),
# so a rebuild reports every warning again instead of only those of changed pages.
book: $(STAMP)
	mkdir -p _build
	$(VENV)/bin/jupyter-book build . --all -n -W --keep-going 2>&1 | tee _build/build.log
	@echo "Built: $(CURDIR)/$(HTML)"

# ruff, configured in pyproject.toml, over the package, the tests and the book's hooks.
lint: $(STAMP)
	$(VENV)/bin/ruff check lnorm tests dev lab book/_ext book/prose.py

# The unit and property tests, and every docstring example of the package.
unit: $(STAMP)
	$(PY) -m pytest -m "not built_book and not slow and not lab" -q --durations=15 \
		--doctest-modules lnorm tests book/prose.py

# Sanitizer runs of the CUDA sources on the CPU, their negative controls, and
# the CPU runs of the longest rows.
slow: $(STAMP)
	$(PY) -m pytest -m slow -q --durations=10

# The built site: pages in headless Chromium (tests/site), links, numbering.
# Without a site its tests would all skip and pass for nothing: stop instead.
site-tests: $(STAMP)
	@test -f $(HTML) || { echo "no site at $(HTML): run make book first"; exit 1; }
	$(PY) -m pytest -m built_book -q --durations=10

# The chapters run in JupyterLab, as a learner runs them (tests/lab).
lab-tests: $(STAMP)
	$(PY) -m pytest tests/lab -m lab -q --durations=5 -p no:cacheprovider

# In this order, also under `make -j`: unit tests, slow tests, the book, then the
# site and the chapters in JupyterLab.
test: $(STAMP)
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory unit
	$(MAKE) --no-print-directory slow
	$(MAKE) --no-print-directory book
	@# Side by side: JupyterLab's kernel runs the chapters on one core while
	@# Chromium checks the site's pages on another. Each prints when it ends.
	$(MAKE) --no-print-directory -j2 --output-sync=target site-tests lab-tests

$(LAB_SETTINGS): $(STAMP) Makefile
	mkdir -p $(@D)
	echo '{"@jupyterlab/docmanager-extension:plugin": {"defaultViewers": {"markdown": "Jupytext Notebook", "myst": "Jupytext Notebook"}},' > $@
	echo ' "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}' >> $@

# JupyterLab serves the repository, opened in book/: jupytext finds jupytext.toml
# as its command line does. lab/jupyter_server_config.py (found through
# JUPYTER_CONFIG_PATH) saves a chapter only where the learner edited it.
# jupytext's server extension needs no flag: its wheel enables it in
# $(VENV)/etc/jupyter/jupyter_server_config.d/jupytext.json.
lab: $(STAMP) $(LAB_SETTINGS)
	@echo "Chapters open as notebooks (jupytext); run them top to bottom with Run > Run All Cells."
	JUPYTER_CONFIG_PATH=$(CURDIR)/lab$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH} \
		$(VENV)/bin/jupyter lab $(ROOT_ARGS) $(LAB_ARGS)

clean:
	rm -rf $(VENV) _build .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
