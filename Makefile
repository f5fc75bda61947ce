# Two entry points for a newcomer: `make run` and `make test`. Both create .venv when missing.
# Their data is in the repository; `make test` also installs the Debian packages below when
# their commands are missing, and a skipped test fails it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test quick lint bench clean system-packages

# System packages some tests drive, installed with apt-get only when missing (CI is a fresh
# Debian machine, as root): Debian's chromium and its driver for the explorer page's
# browser test, curl for the README's serve commands, a Java runtime for pyspark
# (tests/lookup/test_engines.py), pdftotext for the corpus recipe's PDF reader
# (tests/model/test_corpus_pdf.py).
SYSTEM_PACKAGES := chromium chromium-driver curl default-jre-headless poppler-utils
SYSTEM_COMMANDS := chromium chromedriver curl java pdftotext

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first, pinned to the local CPU wheel: a bare `torch` requirement would pull a CUDA build.
	$(PY) -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/elmo demo
	@echo "elmo is installed in $(VENV)/bin: run \`. $(VENV)/bin/activate\` to put it on your PATH (README, \"Using it\")"

system-packages:
	@missing=""; for c in $(SYSTEM_COMMANDS); do command -v $$c >/dev/null || missing="$$missing $$c"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing $(SYSTEM_PACKAGES) (missing:$$missing) for the browser, README, engine and PDF tests"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(SYSTEM_PACKAGES); \
	fi

test: $(STAMP) system-packages
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -rs

# The edit loop: lint, then every test not marked slow (Ray clusters, browser, end to end),
# stopping at the first failure. `make test` is the whole suite.
quick: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -x -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
