#!/usr/bin/env bash
# The documentation site's tools: pyproject.toml's `docs` dependency group in an environment of its own. The
# API reference is read from the sources (mkdocstrings' static analysis), so neither Airflow nor the provider
# is installed here, and `make docs` needs nothing else set up first.
#
# Usage: scripts/setup_docs_env.sh VENV PYTHON   e.g. scripts/setup_docs_env.sh .venv-docs 3.11
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$1 python=$2

# The group as pyproject.toml lists it; installed again only when that list changed.
wanted=$("python$python" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["dependency-groups"]["docs"]))')
stamp=$venv/.ready
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
  exit 0
fi
source scripts/versions.env
source scripts/uv.sh
uv_venv "$venv" "$python"
mapfile -t requirements <<<"$wanted"
"$uv" pip install -q -p "$venv/bin/python" "${requirements[@]}"
printf '%s\n' "$wanted" >"$stamp"
