# forq: the two commands a newcomer needs are `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: venv demo web test lint docs bench chaos clean

# forq installs editable in setuptools' strict mode: build/__editable__.forq-*/ lays the
# package out as installed (forq/ -> jobs/, forq/supervisor/ -> supervisor/, ...) in
# links to the repository's files, which mypy, pyright and IDEs follow (the default
# mode's import hook is invisible to them). No build isolation: a relink needs no index.
EDITABLE := --no-build-isolation --config-settings editable_mode=strict
PIP_QUIET = > $(VENV)/pip.log 2>&1 || { cat $(VENV)/pip.log; exit 1; }

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip 'setuptools>=77' $(PIP_QUIET)
	$(VENV)/bin/pip install --quiet $(EDITABLE) -e '.[test]' $(PIP_QUIET)
	touch $(STAMP)

# The links are made at install time: a file added, moved or removed under the package
# folders since then is relinked here, before every target (tests/layout.py compares the
# links with pyproject.toml's layout: about 0.1 s; a relink, only when they differ: ~3 s).
venv: $(STAMP)
	@$(PY) -m tests.layout 2>/dev/null || { echo "relinking forq's editable install"; \
		$(VENV)/bin/pip install --quiet --no-deps $(EDITABLE) -e . $(PIP_QUIET); }

demo: venv
	$(PY) -m forq.supervisor.cli.demo

# demo traffic (two supervisors, three queues) plus the dashboard at http://127.0.0.1:8080/
web: venv
	$(PY) -m forq.web.demo $(WEB_ARGS)

test: venv
	$(VENV)/bin/ruff check .
	$(PY) -m tests.typecheck
	$(DOCS_BUILD)
	$(PY) -m forq.testing.redis -- $(VENV)/bin/pytest $(PYTEST_ARGS)

# the documentation site (docs/, mkdocs.yml) into build/site; --strict: any warning (a
# broken link, a page missing from the nav) fails it. The variable hides Material's
# end-of-life banner, which is not about this site.
DOCS_BUILD = NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

docs: venv
	$(DOCS_BUILD)

lint: venv
	$(VENV)/bin/ruff check .
	$(PY) -m tests.typecheck

bench: venv
	$(PY) -m bench

chaos: venv
	$(PY) -m chaos

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache
