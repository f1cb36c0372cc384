#!/usr/bin/env bash
# Create .venv with infra-agent and its test extras. torch is installed first, pinned to the
# CPU build that lies on CI machines' disk, so nothing resolves to a multi-GB CUDA build.
set -euo pipefail
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml setup.py | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q torch==2.13.0
  .venv/bin/pip install -q -e '.[all]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi
