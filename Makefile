# pgrace developer tasks. `make help` lists them.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.DEFAULT_GOAL := help
.PHONY: help install test test-fast coverage lint docs format typecheck demo pictures bench conformance docker clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(BIN)/.installed ## Create the virtualenv in .venv with pgrace and the dev tools

# make test's worker processes, each with its own embedded server (tests/conftest.py). The tests mostly wait on
# PostgreSQL, so more workers than CPUs still pays: JOBS=1 runs the suite in one process.
JOBS ?= 3
# The thorough tier (tests/tiers.py): whole explorations and soundness comparisons that repeat, at many times the
# cost, what faster tests check. make test leaves it out; PGRACE_THOROUGH=1 make test runs everything, as CI does.
TIER := $(if $(filter-out 0,$(PGRACE_THOROUGH)),, and not thorough)

# The suite starts pgrace in hundreds of child processes: each imports it compiled once, not compiled anew, even where
# PYTHONDONTWRITEBYTECODE is set (the caches go to .venv, out of the tree).
test: export PYTHONDONTWRITEBYTECODE :=
test: export PYTHONPYCACHEPREFIX := $(abspath $(VENV))/pycache
test: install lint docs ## Lint, type-check, build the docs and run the test suite (PGRACE_THOROUGH=1: all of it)
	$(BIN)/pytest -q -n $(JOBS) --dist loadgroup -m "not timing and not alone$(TIER)"
	$(BIN)/pytest -q -p no:xdist -m "(timing or alone)$(TIER)"

test-fast: install ## The tests that need no server, corpus, browser or Docker and are quick (no PostgreSQL is started)
	PGRACE_NO_SERVER=1 $(BIN)/pytest -q -m "not server and not corpus and not browser and not docker and not slow"

coverage: install ## The fast tier's coverage of the engine and the reduced search, line by line (no PostgreSQL)
	PGRACE_NO_SERVER=1 $(BIN)/pytest -q -m "not server and not corpus and not browser and not docker and not slow" \
		--cov=pgrace.engine --cov=pgrace.drivers.reduce --cov-report=term-missing

lint: install ## ruff (lint and format check), mypy --strict, no import cycle, the layers contract
	$(BIN)/ruff check pgrace tests bench tools
	$(BIN)/ruff format --check pgrace tests bench tools
	$(BIN)/mypy
	$(BIN)/python -m tools.import_graph
	$(BIN)/lint-imports

docs: install ## Build the documentation site into site/ (mkdocs build --strict, offline)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

format: install ## Apply ruff's formatting and safe fixes
	$(BIN)/ruff check --fix pgrace tests bench tools
	$(BIN)/ruff format pgrace tests bench tools

demo: install ## Run the lost-update scenario, bug then fix
	$(BIN)/pgrace run lost-update
	$(BIN)/pgrace run lost-update --fix

pictures: install ## Redraw the screenshots in docs/ (needs chromium)
	$(BIN)/python -m tools.screenshot docs

bench: install ## Run every benchmark in bench/
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

docker: install ## The Docker tests on a local engine and images (tools/docker_ci.py; as root)
	PGRACE_REQUIRE_DOCKER=1 $(PYTHON) -m tools.docker_ci run -- $(BIN)/pytest -q tests/test_docker.py

conformance: install ## Run PostgreSQL's isolation corpus (CORPUS=../shared/pg-isolation), byte for byte
	$(BIN)/python bench/conformance.py $(CORPUS)

clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
