# uv for the set-up scripts (sourced, from the checkout's root, after scripts/versions.env): $uv is the
# pinned uv, installed from PyPI by pip into .build/uv-VERSION the first time (a few seconds; under a lock,
# since make runs several set-up scripts at once). uv makes and fills the environments many times faster
# than pip, and, like pip here, writes no bytecode at install time (Python writes what it imports).
#
# uv does not read pip's configuration, so the index settings pip has here (its configuration files and
# PIP_* variables) are handed to it, unless UV_* variables already say otherwise: where pip finds its
# packages (a CPU build of torch among them, on some machines), uv finds them too.
uv_dir=.build/uv-$UV
uv=$PWD/$uv_dir/bin/uv
if [ ! -x "$uv" ]; then
  mkdir -p .build
  (
    flock 8
    if [ ! -x "$uv" ]; then
      rm -rf "$uv_dir.partial"
      "python$PYTHON_CLUSTER" -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-deps \
        --target "$uv_dir.partial" "uv==$UV"
      mv "$uv_dir.partial" "$uv_dir"
    fi
  ) 8>.build/uv.lock
fi

# The value pip takes for a setting: its PIP_ variable, else its configuration's install or global section.
pip_config=$("python$PYTHON_CLUSTER" -m pip config list 2>/dev/null || true)
pip_setting() {
  local section value
  for section in :env: install global; do
    value=$(sed -n "s/^$section\.$1='\(.*\)'\$/\1/p" <<<"$pip_config")
    if [ -n "$value" ]; then
      echo "$value"
      return
    fi
  done
}
find_links=$(pip_setting find-links)
index_url=$(pip_setting index-url)
extra_index_url=$(pip_setting extra-index-url)
constraint=$(pip_setting constraint)
# uv takes its find-links comma-separated; pip's lists are space- or line-separated.
[ -z "$find_links" ] || export UV_FIND_LINKS=${UV_FIND_LINKS-$(tr -s ' \n' ',' <<<"$find_links" | sed 's/,$//')}
[ -z "$index_url" ] || export UV_DEFAULT_INDEX=${UV_DEFAULT_INDEX-$index_url}
[ -z "$constraint" ] || export UV_CONSTRAINT=${UV_CONSTRAINT-$constraint}
if [ -n "$extra_index_url" ]; then
  export UV_INDEX=${UV_INDEX-$extra_index_url}
  # pip takes the best version from all its indexes; uv's default takes the first index that has the package
  # at all, which misses releases an extra index lacks.
  export UV_INDEX_STRATEGY=${UV_INDEX_STRATEGY-unsafe-best-match}
fi
unset find_links index_url extra_index_url constraint
# uv never downloads a Python of its own here: each environment names the interpreter it is made from.
export UV_PYTHON_DOWNLOADS=never

# python_of MINOR: the path of that Python minor's interpreter, pyenv's where there is one (uv is given
# the path: pyenv's shims pick a version by PYENV_VERSION).
python_of() {
  PYENV_VERSION=$(pyenv versions --bare 2>/dev/null | grep -E "^$1\.[0-9]+$" | tail -1) \
    "python$1" -c 'import sys; print(sys.executable)'
}

# uv_venv VENV MINOR [OPTION...]: makes the environment VENV on Python MINOR, unless it is there.
uv_venv() {
  [ -x "$1/bin/python" ] || "$uv" venv -q -p "$(python_of "$2")" "${@:3}" "$1"
}
