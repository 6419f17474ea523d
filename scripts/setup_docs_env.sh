#!/usr/bin/env bash
# The documentation site's tools: pyproject.toml's `docs` dependency group in an environment of its own. The
# API reference is read from the sources (mkdocstrings' static analysis), so neither Airflow nor the provider
# is installed here, and `make docs` needs nothing else set up first.
#
# Usage: scripts/setup_docs_env.sh VENV PYTHON   e.g. scripts/setup_docs_env.sh .venv-docs 3.11
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$1 python=$2

[ -x "$venv/bin/python" ] || PYENV_VERSION=$(pyenv versions --bare 2>/dev/null | grep -E "^$python\.[0-9]+$" | tail -1) \
  "python$python" -m venv "$venv"
# The group as pyproject.toml lists it; installed again only when that list changed.
wanted=$("$venv/bin/python" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["dependency-groups"]["docs"]))')
stamp=$venv/.ready
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
  exit 0
fi
mapfile -t requirements <<<"$wanted"
"$venv/bin/python" -m pip install -q --no-compile "${requirements[@]}"
printf '%s\n' "$wanted" >"$stamp"
