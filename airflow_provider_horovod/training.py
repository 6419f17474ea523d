"""Pure builders for a training job: ids, storage paths, the checked training spec and the Ray job request.

Nothing here talks to Ray or storage, so everything can be tested (and logged, as a dry run)
without a cluster. Every check raises ``InvalidParameterError`` naming the parameter, the value
and the fix, before anything is submitted.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import inspect
import json
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlparse

from airflow_provider_horovod.exceptions import InvalidParameterError
from airflow_provider_horovod.spec import (
    DATASET_FORMATS,
    TRAINER_APIS,
    TrainingSpec,
    attempt_dir,
)

ENTRYPOINT_MODULE = "airflow_provider_horovod.runtime.job"
TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
ACTIVE_STATES = frozenset({"PENDING", "RUNNING"})
STORAGE_SCHEMES = ("", "file", "s3")
DATASET_SCHEMES = ("", "file", "s3", "gs")
# Job metadata keys (plain strings, readable by anyone with dashboard access: no secrets).
META_PREFIX = "ahp_"
# Variables that must not travel in runtime_env: Ray shows env_vars to every dashboard reader.
SECRET_ENV_PATTERN = re.compile(r"(SECRET|TOKEN|PASSWORD|CREDENTIAL|ACCESS_KEY)", re.IGNORECASE)
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _short_hash(*parts: object) -> str:
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:10]


def safe_name(text: str, max_len: int = 60) -> str:
    """A readable, path- and URL-safe form of an Airflow id (``:`` and ``+`` of run ids go)."""
    return _SAFE.sub("_", text).strip("_")[:max_len] or "x"


def submission_base_id(dag_id: str, task_id: str, run_id: str, map_index: int = -1) -> str:
    """The stem of the Ray submission ids of one task run, known before anything is submitted.

    Readable parts for people, a hash of all four for uniqueness (truncation and sanitising could
    otherwise make two runs collide).
    """
    digest = _short_hash(dag_id, task_id, run_id, map_index)
    return f"ahp-{safe_name(dag_id, 40)}-{safe_name(task_id, 40)}-{digest}"


def attempt_submission_id(base_id: str, attempt: int) -> str:
    return f"{base_id}-a{attempt}"


def run_storage_uri(storage_path: str, dag_id: str, task_id: str, run_id: str, map_index: int = -1) -> str:
    """The task run's own folder: backfills and reruns never share one."""
    run_part = f"{safe_name(run_id, 80)}-{_short_hash(run_id)[:6]}"
    parts = [storage_path.rstrip("/"), safe_name(dag_id, 120), safe_name(task_id, 120), run_part]
    if map_index is not None and map_index >= 0:
        parts.append(f"map-{map_index}")
    return "/".join(parts)


def default_storage_path() -> str:
    home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    return os.path.join(home, "horovod-storage")


# --- checks -------------------------------------------------------------------------------------


def check_num_workers(num_workers: Any) -> int:
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise InvalidParameterError(
            "num_workers", num_workers, "give a whole number of Horovod workers, 1 or more (e.g. 2)."
        )
    return num_workers


def check_storage_path(storage_path: Any) -> str:
    if not isinstance(storage_path, str) or not storage_path.strip():
        raise InvalidParameterError(
            "storage_path", storage_path, "give a local path, a file:// URI or an s3://bucket/prefix URI."
        )
    parsed = urlparse(storage_path)
    if parsed.scheme not in STORAGE_SCHEMES:
        raise InvalidParameterError(
            "storage_path",
            storage_path,
            f"scheme {parsed.scheme!r} is not supported; use a local path, file:// or s3://bucket/prefix.",
        )
    if parsed.scheme == "s3" and not parsed.netloc:
        raise InvalidParameterError("storage_path", storage_path, "name the bucket: s3://bucket/prefix.")
    # file://data/x would silently mean /x on host "data", and file:// alone the worker's cwd.
    if parsed.scheme == "file" and (parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/")):
        raise InvalidParameterError(
            "storage_path", storage_path,
            "a file:// URI takes an absolute path after the third slash: file:///abs/path.",
        )
    if parsed.scheme == "" and not os.path.isabs(storage_path):
        raise InvalidParameterError(
            "storage_path", storage_path, "give an absolute local path (the Ray workers resolve it)."
        )
    return storage_path


def check_json(parameter: str, value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidParameterError(parameter, value, "give a dict (it is passed to train_fn as `config`).")
    try:
        return json.loads(json.dumps(dict(value)))
    except (TypeError, ValueError) as err:
        raise InvalidParameterError(
            parameter, value, f"it must be JSON-serialisable ({err}); pass paths or numbers, not objects."
        ) from None


def check_resources(resources_per_worker: Any, use_gpu: bool) -> dict[str, float] | None:
    if resources_per_worker is None:
        return None
    if not isinstance(resources_per_worker, Mapping):
        raise InvalidParameterError(
            "resources_per_worker", resources_per_worker, 'give a dict such as {"CPU": 1, "GPU": 1}.'
        )
    out: dict[str, float] = {}
    for name, amount in resources_per_worker.items():
        if not isinstance(name, str) or not name:
            raise InvalidParameterError(
                "resources_per_worker", resources_per_worker, f"resource name {name!r} must be a non-empty string."
            )
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not math.isfinite(amount):
            raise InvalidParameterError(
                "resources_per_worker",
                resources_per_worker,
                f"amount {amount!r} of {name!r} is not a number; give e.g. {{{name!r}: 1}}.",
            )
        if amount < 0:
            raise InvalidParameterError(
                "resources_per_worker", resources_per_worker, f"amount of {name!r} is negative; use 0 or more."
            )
        if name.lower() in ("cpu", "gpu", "memory") and name not in ("CPU", "GPU", "memory"):
            raise InvalidParameterError(
                "resources_per_worker",
                resources_per_worker,
                f"unknown resource {name!r}: Ray spells it 'CPU', 'GPU' or 'memory'.",
            )
        out[name] = float(amount)
    if out.get("GPU") and not use_gpu:
        raise InvalidParameterError(
            "resources_per_worker", resources_per_worker, "asks for GPUs while use_gpu=False; set use_gpu=True."
        )
    return out


def check_choice(parameter: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise InvalidParameterError(parameter, value, f"use one of {', '.join(map(repr, choices))}.")
    return value


def check_positive(parameter: str, value: Any, *, allow_none: bool = False, integer: bool = False) -> Any:
    if value is None and allow_none:
        return None
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not 0 < value < math.inf:
        kind = "whole number" if integer else "number"
        raise InvalidParameterError(parameter, value, f"give a {kind} greater than 0.")
    return value


def check_max_failures(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise InvalidParameterError(
            "max_failures", value, "give 0 (no retry), a positive count, or -1 (retry without limit)."
        )
    return value


def check_horovod_env(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidParameterError("horovod_env", value, 'give a dict such as {"HOROVOD_CYCLE_TIME": "1"}.')
    for key in value:
        if not isinstance(key, str) or not key.startswith("HOROVOD_"):
            raise InvalidParameterError(
                "horovod_env", value, f"key {key!r} is not a HOROVOD_* variable; put others in runtime_env."
            )
        if isinstance(value[key], (Mapping, list, tuple, set)) or value[key] is None:
            raise InvalidParameterError(
                "horovod_env", value, f"{key} must be a string or a number, e.g. {{{key!r}: \"1\"}}."
            )
    return {k: str(v) for k, v in value.items()}


def check_nics(value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple, set)) or not all(isinstance(n, str) and n for n in value):
        raise InvalidParameterError("horovod_nics", value, 'give a list of interface names, e.g. ["eth0"].')
    return sorted(value)


def _masked(runtime_env: Mapping) -> dict:
    """runtime_env as an error shows it: env var values hidden, they may hold credentials."""
    env_vars = runtime_env.get("env_vars")
    if isinstance(env_vars, Mapping):
        return {**runtime_env, "env_vars": {k: "***" for k in env_vars}}
    return dict(runtime_env)


def check_runtime_env(value: Any) -> dict:
    """A runtime_env that Ray accepts, checked here: on the cluster a bad one fails the job late."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidParameterError(
            "runtime_env", value, 'give a dict, e.g. {"pip": ["pandas"], "env_vars": {"A": "1"}}.'
        )
    env_vars = value.get("env_vars") or {}
    if not isinstance(env_vars, Mapping):
        raise InvalidParameterError(
            "runtime_env", _masked(value), 'env_vars must be a dict of strings, e.g. {"A": "1"}.'
        )
    for key, var in env_vars.items():
        if SECRET_ENV_PATTERN.search(str(key)):
            raise InvalidParameterError(
                "runtime_env",
                _masked(value),
                f"env var {key!r} looks like a secret, and Ray shows runtime_env to every dashboard "
                "reader; give the cluster its credentials (instance role, cluster env) instead.",
            )
        if not isinstance(key, str) or not isinstance(var, str):
            raise InvalidParameterError(
                "runtime_env", _masked(value), f'env var {key!r} must map a string to a string, e.g. {{"A": "1"}}.'
            )
    try:
        json.dumps(dict(value))
    except (TypeError, ValueError) as err:
        raise InvalidParameterError("runtime_env", _masked(value), f"it must be JSON-serialisable ({err}).") from None
    _check_with_ray(value)
    return dict(value)


def _check_with_ray(value: Mapping) -> None:
    """Ray's own checks (field names, types, local paths exist), run here rather than on the cluster."""
    from ray.runtime_env import RuntimeEnv

    unknown = sorted(str(k) for k in value if k not in RuntimeEnv.known_fields)
    if unknown:
        fields = ", ".join(sorted(f for f in RuntimeEnv.known_fields if not f.startswith("_")))
        raise InvalidParameterError(
            "runtime_env", _masked(value), f"unknown field {unknown[0]!r}; Ray's runtime_env fields are: {fields}."
        )
    try:
        RuntimeEnv(**value)
    except (TypeError, ValueError) as err:
        raise InvalidParameterError("runtime_env", _masked(value), f"Ray refuses it: {err}") from None


def check_import_path(parameter: str, path: str, *, check_importable: bool = True) -> str:
    module, sep, attr = path.partition(":")
    if not sep or not module or not attr or not all(p.isidentifier() for p in module.split(".") + attr.split(".")):
        raise InvalidParameterError(parameter, path, 'give an import path "package.module:function".')
    if check_importable:
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise InvalidParameterError(
                parameter,
                path,
                f"module {module!r} is not importable here; install it where Airflow and Ray run, "
                "ship it with runtime_env (py_modules/working_dir), or pass the function itself.",
            )
        name = attr.split(".")[0]
        defined = _top_level_names(found)
        # A typo in the function's name would otherwise fail only on the cluster, after the upload.
        if defined is not None and name not in defined and not _is_submodule(module, name):
            close = [n for n in sorted(defined) if not n.startswith("_")]
            hint = difflib.get_close_matches(name, close, n=3) or close[:10]
            raise InvalidParameterError(
                parameter,
                path,
                f"module {module!r} defines no {name!r}; check the name"
                + (f" (it has {', '.join(hint)})." if hint else "."),
            )
    return path


def _is_submodule(module: str, name: str) -> bool:
    try:
        return importlib.util.find_spec(f"{module}.{name}") is not None
    except (ImportError, ValueError):  # `module` is not a package
        return False


def _top_level_names(spec) -> set[str] | None:
    """Names a module's source defines at its top level, read without importing it (importing
    could be slow or heavy). None when that cannot be known: no source, `import *`, `__getattr__`."""
    import ast

    origin = getattr(spec, "origin", None) or ""
    if not origin.endswith(".py") or not os.path.isfile(origin):
        return None
    try:
        with open(origin, encoding="utf-8") as f:
            tree = ast.parse(f.read(), origin)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    names: set[str] = set()
    statements = list(tree.body)
    while statements:
        node = statements.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if not isinstance(target, (ast.Attribute, ast.Subscript)):  # `a.b = 1` defines no name
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try, getattr(ast, "TryStar", ast.Try), ast.With, ast.For, ast.While)):
            # Definitions under `if`/`try` (optional imports, fallbacks) count as well.
            for field in ("body", "orelse", "finalbody", "handlers"):
                statements.extend(getattr(node, field, None) or [])
        elif isinstance(node, ast.ExceptHandler):
            statements.extend(node.body)
    if "__getattr__" in names:
        return None
    return names


def _pickled_by_value_modules(fn: Callable) -> list:
    """Modules whose code must travel inside the pickle: DAG files are not on the cluster."""
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    if module is None or module.__name__ == "__main__":
        return []
    if module.__name__.split(".")[0] == "airflow_provider_horovod":
        return []  # the provider travels with every job
    file = getattr(module, "__file__", None) or ""
    installed = any(part in file for part in ("site-packages", "dist-packages"))
    return [] if installed else [module]


def pickle_callable(parameter: str, fn: Any) -> bytes:
    """cloudpickle a function the way HorovodRunner does: DAG-file code goes by value."""
    import cloudpickle

    if not callable(fn):
        raise InvalidParameterError(parameter, fn, 'give a function, or an import path "package.module:function".')
    modules = _pickled_by_value_modules(fn)
    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(fn)
    except Exception as err:  # cloudpickle raises many kinds
        raise InvalidParameterError(
            parameter,
            fn,
            f"it cannot be pickled ({type(err).__name__}: {err}); import heavy objects (models, "
            "clients, open files) inside the function instead of capturing them.",
        ) from None
    finally:
        for module in modules:
            cloudpickle.unregister_pickle_by_value(module)


def check_train_fn(train_fn: Any, runtime_env: dict) -> tuple[dict[str, str], dict[str, bytes]]:
    if isinstance(train_fn, str):
        ships_code = any(runtime_env.get(k) for k in ("working_dir", "py_modules", "pip", "conda", "uv"))
        return {"import": check_import_path("train_fn", train_fn, check_importable=not ships_code)}, {}
    if callable(train_fn):
        params = [
            p for p in inspect.signature(train_fn).parameters.values()
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if len(params) > 1:
            raise InvalidParameterError(
                "train_fn", train_fn, "it must take no argument or one (`config`, from train_loop_config)."
            )
        return {"pickle": "train_fn.pkl"}, {"train_fn.pkl": pickle_callable("train_fn", train_fn)}
    raise InvalidParameterError("train_fn", train_fn, 'give a function, or an import path "package.module:function".')


def dataset_format(uri: str) -> str:
    path = urlparse(uri).path.lower().rstrip("/")
    for ext, fmt in ((".csv", "csv"), (".json", "json"), (".jsonl", "json")):
        if path.endswith(ext):
            return fmt
    return "parquet"


def check_datasets(datasets: Any) -> tuple[dict[str, dict[str, str]], dict[str, bytes]]:
    if datasets is None:
        return {}, {}
    if not isinstance(datasets, Mapping):
        raise InvalidParameterError("datasets", datasets, 'give a dict such as {"train": "s3://bucket/train/"}.')
    specs: dict[str, dict[str, str]] = {}
    files: dict[str, bytes] = {}
    for name, value in datasets.items():
        param = f"datasets[{name!r}]"
        if not isinstance(name, str) or not name.isidentifier():
            raise InvalidParameterError("datasets", datasets, f"dataset name {name!r} must be a simple name like 'train'.")
        if isinstance(value, str):
            parsed = urlparse(value)
            if parsed.scheme not in DATASET_SCHEMES or not value.strip():
                raise InvalidParameterError(
                    param, value, "give a local path, file://, s3:// or gs:// URI of parquet, csv or json files."
                )
            fmt = dataset_format(value)
            if fmt not in DATASET_FORMATS:  # pragma: no cover - dataset_format only returns known ones
                raise InvalidParameterError(param, value, f"use one of {DATASET_FORMATS}.")
            specs[name] = {"uri": value, "format": fmt}
        elif callable(value) and not hasattr(value, "iter_batches"):
            file = f"dataset_{name}.pkl"
            files[file] = pickle_callable(param, value)
            specs[name] = {"pickle": file}
        else:
            raise InvalidParameterError(
                param,
                value,
                "give a URI of parquet/csv/json files, or a function run on the cluster that returns a "
                "ray.data.Dataset (a Dataset object itself cannot travel; wrap it in a function).",
            )
    return specs, files


def required_resources(num_workers: int, use_gpu: bool, resources_per_worker: dict[str, float] | None) -> dict[str, float]:
    """What the workers ask of the cluster in total (Ray Train's defaults: 1 CPU, or 1 GPU)."""
    per_worker = dict(resources_per_worker or {})
    if "CPU" not in per_worker and "GPU" not in per_worker:
        per_worker["CPU"] = 0.0 if use_gpu else 1.0
    if use_gpu and "GPU" not in per_worker:
        per_worker["GPU"] = 1.0
    return {name: amount * num_workers for name, amount in per_worker.items() if amount}


def missing_resources(asked: dict[str, float], cluster: dict[str, float]) -> dict[str, float]:
    """Resources asked for that the cluster does not have at all (an autoscaler may still add them)."""
    return {name: amount for name, amount in asked.items() if cluster.get(name, 0.0) <= 0.0}


def provider_py_module() -> str:
    """The provider's own package folder, for a job's ``runtime_env["py_modules"]``: with it, the
    cluster needs no install of the provider."""
    import airflow_provider_horovod

    return os.path.dirname(os.path.abspath(airflow_provider_horovod.__file__))


def build_runtime_env(user_env: dict, payload_dir: str, trainer_api: str, horovod_env: dict[str, str]) -> dict:
    """The job's runtime_env: the provider and the payload travel as py_modules."""
    env = dict(user_env)
    env["py_modules"] = [provider_py_module(), payload_dir, *(user_env.get("py_modules") or [])]
    env_vars = {**horovod_env, **(user_env.get("env_vars") or {})}
    if trainer_api == "legacy":
        # Ray 2.60 refuses HorovodTrainer under Train V2; the flag must be set before ray.train loads.
        env_vars["RAY_TRAIN_V2_ENABLED"] = "0"
    env["env_vars"] = env_vars
    return env


def build_entrypoint(payload_module: str) -> str:
    return f"python -m {ENTRYPOINT_MODULE} {payload_module}"


def build_job_metadata(spec: TrainingSpec, *, dag_id: str, task_id: str, run_id: str, map_index: int,
                       asked: dict[str, float]) -> dict[str, str]:
    """Plain strings that let a sensor (or a later try) find the job's result."""
    return {
        "airflow_dag_id": dag_id,
        "airflow_task_id": task_id,
        "airflow_run_id": run_id,
        "airflow_map_index": str(map_index),
        f"{META_PREFIX}storage_uri": spec.storage_uri,
        f"{META_PREFIX}attempt": str(spec.attempt),
        f"{META_PREFIX}result_uri": spec.result_uri,
        f"{META_PREFIX}num_workers": str(spec.num_workers),
        f"{META_PREFIX}resources": json.dumps(asked, sort_keys=True),
    }


def resume_candidates(storage_uri: str, attempt: int) -> list[str]:
    """Earlier attempts' folders, newest first: the runtime resumes from the newest checkpoint."""
    return [attempt_dir(storage_uri, n) for n in range(attempt - 1, 0, -1)]


def check_trainer_api(value: Any) -> str:
    return check_choice("trainer_api", value, TRAINER_APIS)
