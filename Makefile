# forq: the two commands a newcomer needs are `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo web test lint docs bench chaos clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m forq.supervisor.cli.demo

# demo traffic (two supervisors, three queues) plus the dashboard at http://127.0.0.1:8080/
web: $(STAMP)
	$(PY) -m forq.web.demo $(WEB_ARGS)

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m tests.typecheck
	$(DOCS_BUILD)
	$(PY) -m forq.testing.redis -- $(VENV)/bin/pytest $(PYTEST_ARGS)

# the documentation site (docs/, mkdocs.yml) into build/site; --strict: any warning (a
# broken link, a page missing from the nav) fails it. The variable hides Material's
# end-of-life banner, which is not about this site.
DOCS_BUILD = NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

docs: $(STAMP)
	$(DOCS_BUILD)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m tests.typecheck

bench: $(STAMP)
	$(PY) -m bench

chaos: $(STAMP)
	$(PY) -m chaos

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache
