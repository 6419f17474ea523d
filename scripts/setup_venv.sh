#!/usr/bin/env bash
# Create .venv with the whole stack: torch, the patched Horovod build, the provider and its tests'
# needs. Idempotent and cheap when nothing changed (make calls it before demo and test).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3.11}
venv=.venv
stamp=$venv/.ready
inputs=(pyproject.toml scripts/setup_venv.sh scripts/build_horovod.sh)

if [ -f "$stamp" ] && [ -z "$(find "${inputs[@]}" -newer "$stamp")" ]; then
  exit 0
fi

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip)
"${pip[@]}" install -q --upgrade pip
# torch first, at the version pyproject.toml pins: Horovod compiles against it.
torch_pin=$(grep -oE '"torch==[^"]+"' pyproject.toml | tr -d '"')
"${pip[@]}" install -q "$torch_pin"
scripts/build_horovod.sh "$venv/bin/python"
"${pip[@]}" install -q -e '.[test]'
"$venv/bin/horovodrun" --check-build | grep -E '\[X\] (PyTorch|Gloo)' >/dev/null || {
  "$venv/bin/horovodrun" --check-build
  echo "horovod was built without PyTorch or Gloo" >&2
  exit 1
}
touch "$stamp"
