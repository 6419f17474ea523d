"""The checks of a script run (``train_script``, ``script_args``), on the Airflow side before anything is
submitted: which script, found where, and which folder travels with the job as its ``working_dir``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from airflow_provider_horovod.exceptions import InvalidParameterError
from airflow_provider_horovod.functions import importable_module


def check_script_args(parameter: str, value: Any) -> list[str] | None:
    """A list of strings, as a shell hands them to the script (numbers are refused: quote them)."""
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise InvalidParameterError(
            parameter,
            value,
            'give a list of strings, e.g. ["--epochs", "90"] (shlex.split turns a command line into one).',
        )
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise InvalidParameterError(
                parameter,
                value,
                f"item {i} is a {type(item).__name__}; every argument is a string, e.g. {str(item)!r}.",
            )
    return list(value)


def check_script(
    parameter: str, value: Any, *, dag_folder: str | None, runtime_env: Mapping[str, Any], code_ships: bool
) -> tuple[dict[str, Any], str | None]:
    """``({"path": path in the working_dir} or {"module": name}, the folder to ship as working_dir or None)``.

    A file is found relative to the DAG file's folder (or absolute). Its own folder travels with the job,
    unless ``runtime_env`` names a local ``working_dir`` already: then the script must lie inside it.
    ``code_ships``: the runtime_env brings code, so a module is not looked up here."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidParameterError(parameter, value, 'give a script file ("train.py") or "-m package.module".')
    value = value.strip()
    if value.startswith("-m"):
        return check_module(parameter, value[2:].strip(), code_ships=code_ships), None
    path = value if os.path.isabs(value) or not dag_folder else os.path.join(dag_folder, value)
    if not os.path.isfile(path):
        raise InvalidParameterError(
            parameter,
            value,
            f"no such file ({os.path.abspath(path)}); give a path relative to the DAG file's folder, or an "
            "absolute one.",
        )
    path = os.path.abspath(path)
    working_dir = runtime_env.get("working_dir")
    if isinstance(working_dir, str) and "://" not in working_dir:
        root = os.path.abspath(working_dir)
        if os.path.commonpath([root, path]) != root:
            raise InvalidParameterError(
                parameter,
                value,
                f"the script is outside runtime_env's working_dir ({root}), the folder that travels with the job; "
                "move it there, or leave working_dir out to ship the script's own folder.",
            )
        return {"path": os.path.relpath(path, root)}, None
    if working_dir:  # a working_dir already on the cluster (a URI): the script is named by its file name there
        return {"path": os.path.basename(path)}, None
    return {"path": os.path.basename(path)}, os.path.dirname(path)


def check_module(parameter: str, module: str, *, code_ships: bool) -> dict[str, Any]:
    """``-m package.module``: a dotted name; importable here unless the job's runtime_env brings code."""
    if not module or not all(part.isidentifier() for part in module.split(".")):
        raise InvalidParameterError(parameter, f"-m {module}", 'give "-m package.module", a dotted module name.')
    if not code_ships:
        importable_module(parameter, f"-m {module}", module, "or give the script's file")
    return {"module": module}
