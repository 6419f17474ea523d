"""Checks of a Ray ``runtime_env`` (the task's and the connection's default): fields Ray accepts, and no
secret among its ``env_vars`` (Ray shows a job's runtime_env to every dashboard reader). Pure; each
raises ``InvalidParameterError`` naming the parameter, the value and the fix."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from airflow_provider_horovod.exceptions import InvalidParameterError

# Variables that must not travel in runtime_env: Ray shows env_vars to every dashboard reader.
SECRET_ENV_PATTERN = re.compile(r"(SECRET|TOKEN|PASSWORD|CREDENTIAL|ACCESS_KEY)", re.IGNORECASE)


# Ray 2.60's runtime_env fields (ray.runtime_env.RuntimeEnv.known_fields, private ones left out).
RUNTIME_ENV_FIELDS = (
    "conda",
    "config",
    "container",
    "env_vars",
    "excludes",
    "image_uri",
    "java_jars",
    "pip",
    "py_executable",
    "py_modules",
    "uv",
    "worker_process_setup_hook",
    "working_dir",
)


URI_SCHEMES = ("gcs", "s3", "gs", "https", "http", "file", "azure", "abfss")


def masked(runtime_env: Mapping) -> dict:
    """runtime_env as an error shows it: env var values hidden, they may hold credentials."""
    env_vars = runtime_env.get("env_vars")
    if isinstance(env_vars, Mapping):
        return {**runtime_env, "env_vars": {k: "***" for k in env_vars}}
    return dict(runtime_env)


def is_uri(path: str) -> bool:
    return urlparse(path).scheme in URI_SCHEMES and "://" in path


def check_runtime_env(parameter: str, value: Any) -> dict:
    """A runtime_env Ray will accept, checked here: on the cluster a bad one fails the job late."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidParameterError(parameter, value, 'give a dict, e.g. {"pip": ["pandas"], "env_vars": {"A": "1"}}.')
    shown = masked(value)
    unknown = sorted(str(k) for k in value if k not in RUNTIME_ENV_FIELDS)
    if unknown:
        raise InvalidParameterError(
            parameter,
            shown,
            f"unknown field {unknown[0]!r}; Ray's runtime_env fields are: {', '.join(RUNTIME_ENV_FIELDS)}.",
        )
    env_vars = value.get("env_vars") or {}
    if not isinstance(env_vars, Mapping):
        raise InvalidParameterError(parameter, shown, 'env_vars must be a dict of strings, e.g. {"A": "1"}.')
    for key, var in env_vars.items():
        if SECRET_ENV_PATTERN.search(str(key)):
            raise InvalidParameterError(
                parameter,
                shown,
                f"env var {key!r} looks like a secret, and Ray shows runtime_env to every dashboard reader; give "
                "the cluster its credentials (instance role, cluster env) instead.",
            )
        if not isinstance(key, str) or not isinstance(var, str):
            raise InvalidParameterError(
                parameter, shown, f'env var {key!r} must map a string to a string, e.g. {{"A": "1"}}.'
            )
    working_dir = value.get("working_dir")
    if working_dir is not None:
        if not isinstance(working_dir, str):
            raise InvalidParameterError(parameter, shown, "working_dir must be a local folder or a URI (a string).")
        local_zip = working_dir.endswith(".zip") and os.path.isfile(working_dir)
        if not is_uri(working_dir) and not os.path.isdir(working_dir) and not local_zip:
            raise InvalidParameterError(
                parameter,
                shown,
                f"working_dir {working_dir!r} is not a folder here; give an existing local "
                "folder or .zip file (it is uploaded) or a URI.",
            )
    py_modules = value.get("py_modules")
    if py_modules is not None:
        if not isinstance(py_modules, (list, tuple)) or not all(isinstance(m, str) for m in py_modules):
            raise InvalidParameterError(
                parameter, shown, "py_modules must be a list of local folders, .whl files or URIs."
            )
        for module in py_modules:
            if not is_uri(module) and not (
                os.path.isdir(module) or (os.path.isfile(module) and module.endswith((".whl", ".py")))
            ):
                raise InvalidParameterError(
                    parameter,
                    shown,
                    f"py_modules entry {module!r} is neither an existing folder, .py or .whl file here, nor a URI.",
                )
    pip = value.get("pip")
    pip_file = isinstance(pip, str) and os.path.isfile(pip)
    if pip is not None and not (isinstance(pip, (list, tuple, Mapping)) or pip_file):
        raise InvalidParameterError(
            parameter,
            shown,
            'pip must be a list of requirements (e.g. ["pandas==2.2"]), a dict '
            '{"packages": [...]}, or the path of a requirements file.',
        )
    excludes = value.get("excludes")
    if excludes is not None and not (isinstance(excludes, (list, tuple)) and all(isinstance(e, str) for e in excludes)):
        raise InvalidParameterError(parameter, shown, 'excludes must be a list of patterns, e.g. ["*.ckpt"].')
    try:
        json.dumps(dict(value))
    except (TypeError, ValueError) as err:
        raise InvalidParameterError(parameter, shown, f"it must be JSON-serialisable ({err}).") from None
    return dict(value)
