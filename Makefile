# mtc: `make run` starts the whole stack with a demo local cluster; `make test` runs the tests.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv

.PHONY: setup run test lint bench stop-clusters clean

setup: ## install Debian packages and the .venv (idempotent)
	@bash scripts/setup.sh

run: setup ## migrate, start Redis, accounting (MariaDB + slurmdbd), two Celery workers (operations, polls + beat), gunicorn, the demo cluster
	@bash scripts/run.sh

test: setup ## start a private Redis (and MariaDB + slurmdbd), run every test, clean up
	@bash scripts/test.sh $(ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: setup
	$(VENV)/bin/python bench/cluster_ready.py

stop-clusters: setup ## stop every local cluster's daemons (files stay; `make run` restarts them)
	$(VENV)/bin/python manage.py migrate --noinput -v0
	$(VENV)/bin/python manage.py mtc daemons stop

clean:
	rm -rf $(VENV)
