# Two entry points for a newcomer: `make run` and `make test`. Both create .venv when missing.
# Neither needs anything outside the repository; a skipped test fails `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint bench clean java

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first, pinned to the local CPU wheel: a bare `torch` requirement would pull a CUDA build.
	$(PY) -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/elmo demo
	@echo "elmo is installed in $(VENV)/bin: run \`. $(VENV)/bin/activate\` to put it on your PATH (README, \"Using it\")"

test: $(STAMP) java
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -rs

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# A Java runtime for pyspark (tests/lookup/test_engines.py), from Debian when java is missing.
java:
	command -v java >/dev/null || (apt-get update && apt-get install -y default-jre-headless)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
