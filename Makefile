# Two entry points for a newcomer: `make run` and `make test`. Both create .venv when missing.
# Neither needs anything outside the repository; a skipped test fails `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test quick lint bench clean browser

# The explorer page's test drives a real headless browser: Debian's chromium and its
# driver (CI is a fresh Debian machine, as root). Installed only when missing.
BROWSER_PACKAGES := chromium chromium-driver curl

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first, pinned to the local CPU wheel: a bare `torch` requirement would pull a CUDA build.
	$(PY) -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/elmo demo
	@echo "elmo is installed in $(VENV)/bin: run \`. $(VENV)/bin/activate\` to put it on your PATH (README, \"Using it\")"

browser:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null \
	    || ! command -v curl >/dev/null; then \
	  echo "installing $(BROWSER_PACKAGES) (for tests/lookup/test_serve_browser.py)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(BROWSER_PACKAGES); \
	fi

test: $(STAMP) browser
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
