# Two commands do all the set-up: `make run` (the demo on http://127.0.0.1:8000) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PORT ?= 8000
# The demo's clock: 4 simulated minutes per second, so the replayed cluster fills up within minutes.
DEMO_SIMULATION_SPEED ?= 240

# The test suite runs the production stack for real.
TEST_DATABASE_URL ?= postgresql://postgres@127.0.0.1:5432/postgres
TEST_REDIS_URL ?= redis://127.0.0.1:6379/14
# Its own Redis database, so a concurrent `make test` (which flushes its database) cannot disturb it.
BENCH_REDIS_URL ?= redis://127.0.0.1:6379/5

.PHONY: install run test lint bench docs system-deps clean docker-config

$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed

# Debian's Chromium for the browser tests (never a browser download) and a Compose CLI to check docker/.
system-deps:
	@missing=""; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	{ docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1; } || missing="$$missing docker-compose"; \
	if [ -n "$$missing" ]; then \
		echo "installing from Debian:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

run: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py seed_demo --if-empty
	SIMULATION_SPEED=$${SIMULATION_SPEED:-$(DEMO_SIMULATION_SPEED)} $(PY) manage.py serve --port $(PORT)

test: install system-deps
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: install
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(BENCH_REDIS_URL) $(PY) -m bench.run --out bench/results/report.json

# The documentation site from docs/ into site/, offline; --strict makes a broken link or anchor, or a page
# left out of the nav, an error (mkdocs.yml's validation settings).
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --clean

docker-config:
	@if docker compose version >/dev/null 2>&1; then SECRET_KEY=check docker compose -f docker/compose.yaml config --quiet; \
	else SECRET_KEY=check docker-compose -f docker/compose.yaml config --quiet; fi && echo "docker/compose.yaml is valid"

clean:
	rm -rf $(VENV) var site .pytest_cache .ruff_cache .hypothesis
