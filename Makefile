# The two quickstart commands: `make optimize` (the main job) and `make test` (the test suite).
# Each installs what it needs on first use.
.PHONY: setup optimize test lint clean

setup:
	bash .ci/setup-system.sh
	bash .ci/setup-python.sh
	# SGLang lives in its own cached virtual environment (about 11 GB, 4-5 minutes the first time).
	.venv/bin/python -m infra_agent.serving.env --ensure

optimize: setup
	.venv/bin/infra-agent optimize --target throughput

test: setup
	# two workers; a test file and the docker-backend tests each run as one group, the files
	# with SGLang servers first (tests/conftest.py); the 15 slowest tests are listed at the end
	.venv/bin/python -m pytest -q -n 2 --dist loadgroup

lint:
	# ruff and mypy exactly as the tests run them (mypy needs the package by name: tests/test_lint.py)
	.venv/bin/python -m pytest -q tests/test_lint.py

clean:
	rm -rf .venv build *.egg-info
