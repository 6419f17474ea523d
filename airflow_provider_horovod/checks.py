"""Parameter checks. Each returns the checked value or raises ``InvalidParameterError`` naming the
parameter, the value and the fix; they run before anything is submitted. Pure. A check of one value
takes the parameter's name and the value, as an operator's declaration calls it (``parameters.Param``)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

from airflow_provider_horovod.contract import META_PREFIX, RESERVED_META_KEYS, TrainerApi, elastic_ray_problem
from airflow_provider_horovod.exceptions import InvalidParameterError

STORAGE_SCHEMES = ("", "file", "s3")
DATASET_SCHEMES = ("", "file", "s3", "gs")


NUM_WORKERS_FIX = (
    "give a whole number of Horovod workers, 1 or more (e.g. 2), or an elastic range [min, max] of "
    "whole numbers with 1 <= min <= max (e.g. [2, 4])."
)


def check_num_workers(value: Any, trainer_api: Any = None) -> int | list[int]:
    """A number of workers, or an elastic ``[min, max]`` (a tuple or a two-element list; a rendered
    template's JSON text such as ``"[2, 4]"`` or ``"4"`` means the same). ``[n, n]`` is ``n``.
    Ray's HorovodTrainer (``trainer_api="legacy"``) takes a number only."""
    checked = _num_workers(value)
    if isinstance(checked, list) and trainer_api == TrainerApi.LEGACY.value:
        raise InvalidParameterError(
            "num_workers",
            value,
            "trainer_api='legacy' (Ray's HorovodTrainer) has no elastic "
            "training: give a number of workers, or use trainer_api='auto' or 'v2' for a range.",
        )
    return checked


def check_ray_features(ray_version: str | None, spec: Any) -> None:
    """Before submitting: what the job asks for that the cluster's Ray lacks (its dashboard's version; the
    runtime probes again at the job's start). An elastic ``num_workers`` needs Ray Train's elastic scaling."""
    if getattr(spec, "elastic", False) and (problem := elastic_ray_problem(ray_version)):
        raise InvalidParameterError("num_workers", spec.num_workers, problem)


def _num_workers(value: Any) -> int | list[int]:
    given = value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise InvalidParameterError("num_workers", given, NUM_WORKERS_FIX) from None
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(_whole(n) for n in value):
        low, high = value
        if not 1 <= low <= high:
            raise InvalidParameterError(
                "num_workers", given, f"min {low} must be at least 1 and at most max {high}; " + NUM_WORKERS_FIX
            )
        return low if low == high else [low, high]
    if not _whole(value) or value < 1:
        raise InvalidParameterError("num_workers", given, NUM_WORKERS_FIX)
    return value


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_storage_path(value: Any) -> str:
    """The storage root, normalised: an absolute local path, or ``s3://bucket/prefix``."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidParameterError(
            "storage_path", value, "give a local path, a file:// URI or an s3://bucket/prefix URI."
        )
    parsed = urlparse(value)
    if parsed.scheme not in STORAGE_SCHEMES:
        raise InvalidParameterError(
            "storage_path",
            value,
            f"scheme {parsed.scheme!r} is not supported; use a local path, file:// or s3://bucket/prefix.",
        )
    if parsed.scheme == "s3" and not parsed.netloc:
        raise InvalidParameterError("storage_path", value, "name the bucket: s3://bucket/prefix.")
    # file://data/x would silently mean /x on host "data", and file:// alone the worker's cwd.
    if parsed.scheme == "file" and (parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/")):
        raise InvalidParameterError(
            "storage_path", value, "a file:// URI takes an absolute path after the third slash: file:///abs/path."
        )
    if parsed.scheme == "" and not os.path.isabs(value):
        raise InvalidParameterError("storage_path", value, "give an absolute local path (the Ray workers resolve it).")
    # Local paths as Ray Train needs them (absolute, no scheme); s3:// as it is, without a trailing slash.
    if parsed.scheme == "s3":
        return f"s3://{parsed.netloc}{parsed.path}".rstrip("/")
    return os.path.abspath(parsed.path if parsed.scheme == "file" else value)


def check_json(parameter: str, value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidParameterError(parameter, value, "give a dict (it is passed to the function as `config`).")
    try:
        return json.loads(json.dumps(dict(value)))
    except (TypeError, ValueError) as err:
        raise InvalidParameterError(
            parameter, value, f"it must be JSON-serialisable ({err}); pass paths or numbers, not objects."
        ) from None


def check_args(parameter: str, value: Any) -> list:
    """Positional arguments: a list of JSON values."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise InvalidParameterError(parameter, value, "give a list of arguments.")
    try:
        return json.loads(json.dumps(list(value)))
    except (TypeError, ValueError) as err:
        raise InvalidParameterError(
            parameter, value, f"it must be JSON-serialisable ({err}); pass paths or numbers, not objects."
        ) from None


def check_resources(value: Any, use_gpu: bool, parameter: str = "resources_per_worker") -> dict[str, float] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidParameterError(parameter, value, 'give a dict such as {"CPU": 1, "GPU": 1}.')
    out: dict[str, float] = {}
    for name, amount in value.items():
        if not isinstance(name, str) or not name:
            raise InvalidParameterError(parameter, value, f"resource name {name!r} must be a non-empty string.")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not math.isfinite(amount):
            raise InvalidParameterError(
                parameter, value, f"amount {amount!r} of {name!r} is not a number; give e.g. {{{name!r}: 1}}."
            )
        if amount < 0:
            raise InvalidParameterError(parameter, value, f"amount of {name!r} is negative; use 0 or more.")
        if name.lower() in ("cpu", "gpu", "memory") and name not in ("CPU", "GPU", "memory"):
            raise InvalidParameterError(
                parameter, value, f"unknown resource {name!r}: Ray spells it 'CPU', 'GPU' or 'memory'."
            )
        out[name] = float(amount)
    if out.get("GPU") and not use_gpu:
        raise InvalidParameterError(parameter, value, "asks for GPUs while use_gpu=False; set use_gpu=True.")
    return out


def check_choice(parameter: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise InvalidParameterError(parameter, value, f"use one of {', '.join(map(repr, choices))}.")
    return value


def check_name(parameter: str, value: Any) -> str | None:
    """None, or a non-empty string (a metric's name)."""
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise InvalidParameterError(parameter, value, "give a non-empty string, or None.")
    return value


def check_bool(parameter: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidParameterError(parameter, value, "give True or False.")
    return value


def check_positive(parameter: str, value: Any, *, allow_none: bool = False, integer: bool = False) -> Any:
    if value is None and allow_none:
        return None
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not 0 < value < math.inf:
        kind = "whole number" if integer else "number"
        raise InvalidParameterError(parameter, value, f"give a {kind} greater than 0.")
    return value


def check_seconds(parameter: str, value: Any, *, allow_none: bool = False) -> float | None:
    """Seconds (0 or more) or a timedelta, as a float."""
    if value is None and allow_none:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < math.inf:
        raise InvalidParameterError(parameter, value, "give seconds (0 or more) or a timedelta.")
    if seconds > (longest := timedelta.max.total_seconds()):  # Airflow makes a timedelta of them
        raise InvalidParameterError(parameter, value, f"give at most {longest:.0f} seconds (a timedelta's most).")
    return float(seconds)


def check_max_failures(parameter: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise InvalidParameterError(
            parameter, value, "give 0 (no retry), a positive count, or -1 (retry without limit)."
        )
    return value


def check_horovod_env(parameter: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidParameterError(parameter, value, 'give a dict such as {"HOROVOD_CYCLE_TIME": "1"}.')
    for key in value:
        if not isinstance(key, str) or not key.startswith("HOROVOD_"):
            raise InvalidParameterError(
                parameter, value, f"key {key!r} is not a HOROVOD_* variable; put others in runtime_env."
            )
        if isinstance(value[key], (Mapping, list, tuple, set)) or value[key] is None:
            raise InvalidParameterError(parameter, value, f'{key} must be a string or a number, e.g. {{{key!r}: "1"}}.')
    return {k: str(v) for k, v in value.items()}


def check_nics(parameter: str, value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    # A list, not a set: the order matters (each host uses the first of them it has).
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(n, str) and n for n in value):
        raise InvalidParameterError(
            parameter,
            value,
            "give a list of interface names in order of preference, "
            'e.g. ["eth0"] or ["ens5", "eth0"]: each host uses the first of them it has.',
        )
    return list(dict.fromkeys(value))


def dataset_format(uri: str) -> str:
    path = urlparse(uri).path.lower().rstrip("/")
    for ext, fmt in ((".csv", "csv"), (".json", "json"), (".jsonl", "json")):
        if path.endswith(ext):
            return fmt
    return "parquet"


def check_conn_id(parameter: str, value: Any, fix: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidParameterError(parameter, value, fix)
    return value


def check_ray_conn_id(parameter: str, value: Any) -> str:
    return check_conn_id(
        parameter,
        value,
        "give the id of a connection of type 'ray', or leave the default 'ray_default' (an embedded "
        "local Ray cluster when no such connection exists).",
    )


def check_submission_id(parameter: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidParameterError(
            parameter,
            value,
            "give the Ray job's submission id, e.g. \"{{ ti.xcom_pull(task_ids='train', key='submission_id') }}\".",
        )
    sid = value.strip()
    if sid == "None":
        # What "{{ ti.xcom_pull(...) }}" renders to when the upstream task pushed nothing.
        raise InvalidParameterError(
            "submission_id",
            sid,
            "the template rendered None: the task it pulls from pushed no submission id; check task_ids and "
            "key='submission_id' in xcom_pull.",
        )
    if any(c in sid for c in "/?#") or any(c.isspace() for c in sid):
        raise InvalidParameterError(
            "submission_id",
            sid,
            "a Ray submission id has no spaces, '/', '?' or '#'; give the id as the Ray dashboard shows it "
            "(e.g. 'raysubmit_...', or 'ahp-...-a1' for HorovodTrainOperator's jobs).",
        )
    return sid


def check_datasets(value: Any, *, code_ships: bool = False) -> tuple[dict[str, dict[str, str]], dict[str, bytes]]:
    """Datasets as the spec holds them (``{"uri", "format"}``, or a function that builds one on the
    cluster), and the files that carry pickled functions."""
    from airflow_provider_horovod.functions import is_import_path, ship_function

    if value is None:
        return {}, {}
    if not isinstance(value, Mapping):
        raise InvalidParameterError("datasets", value, 'give a dict such as {"train": "s3://bucket/train/"}.')
    specs: dict[str, dict[str, str]] = {}
    files: dict[str, bytes] = {}
    for name, item in value.items():
        parameter = f"datasets[{name!r}]"
        if not isinstance(name, str) or not name.isidentifier():
            raise InvalidParameterError("datasets", value, f"dataset name {name!r} must be a simple name like 'train'.")
        if is_import_path(item) or (callable(item) and not hasattr(item, "iter_batches")):
            ref, shipped = ship_function(parameter, item, f"dataset_{name}.pkl", code_ships=code_ships)
            specs[name], files = ref, {**files, **shipped}
        elif isinstance(item, str) and item.strip() and urlparse(item).scheme in DATASET_SCHEMES:
            specs[name] = {"uri": item, "format": dataset_format(item)}
        else:
            raise InvalidParameterError(
                parameter,
                item,
                "give a local path, file://, s3:// or gs:// URI of parquet, csv or json files, or a function run on "
                'the cluster that returns a ray.data.Dataset ("package.module:function", or the function itself; a '
                "Dataset object cannot travel, wrap it in a function).",
            )
    return specs, files


MIN_CREDENTIALS_TTL_S, MAX_CREDENTIALS_TTL_S = 900, 129600  # what STS GetSessionToken accepts


def check_forwarding(forward: Any, aws_conn_id: str | None, ttl_s: Any) -> bool:
    check_bool("forward_aws_credentials", forward)
    if not forward:
        return False
    if not aws_conn_id:
        raise InvalidParameterError(
            "forward_aws_credentials",
            forward,
            "set aws_conn_id to the AWS connection whose keys get the session credentials, or leave it False.",
        )
    whole = isinstance(ttl_s, int) and not isinstance(ttl_s, bool)
    if not whole or not MIN_CREDENTIALS_TTL_S <= ttl_s <= MAX_CREDENTIALS_TTL_S:
        raise InvalidParameterError(
            "aws_credentials_ttl_seconds",
            ttl_s,
            f"give whole seconds from {MIN_CREDENTIALS_TTL_S} to {MAX_CREDENTIALS_TTL_S} (what STS accepts).",
        )
    return True


TAGS_EXAMPLE = '{"team": "ranking", "model": "ctr", "cost_centre": "cc-4711"}'
PRICE_KEYS = ("cpu_hour", "gpu_hour", "currency")


def check_job_tags(parameter: str, value: Any) -> dict[str, str]:
    """The user's job tags: strings to strings (Ray's job metadata), none on the provider's or Ray's keys."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidParameterError(parameter, value, f"give a dict of strings, e.g. {TAGS_EXAMPLE}.")
    for key, text in value.items():
        if not isinstance(key, str) or not key.strip():
            raise InvalidParameterError(parameter, value, f"tag name {key!r} must be a non-empty string.")
        if not isinstance(text, str):
            raise InvalidParameterError(
                parameter,
                value,
                f"tag {key!r} has the {type(text).__name__} {text!r}: "
                f"Ray's job metadata holds strings only; give it as {str(text)!r}.",
            )
        if key.startswith(META_PREFIX) or key in RESERVED_META_KEYS:
            raise InvalidParameterError(
                parameter,
                value,
                f"tag {key!r} is reserved: the provider names its own metadata {META_PREFIX}* and "
                f"{', '.join(RESERVED_META_KEYS[:-1])} (and Ray {RESERVED_META_KEYS[-1]}); rename the tag.",
            )
    return dict(value)


def check_prices(parameter: str, value: Any) -> dict[str, Any] | None:
    """Prices per CPU-hour and GPU-hour (and their currency), which turn the cost's seconds into an amount."""
    if value is None:
        return None
    example = '{"cpu_hour": 0.048, "gpu_hour": 2.45, "currency": "USD"}'
    if not isinstance(value, Mapping) or not value:
        raise InvalidParameterError(parameter, value, f"give a dict such as {example}, or None.")
    # Keys of any type (a hand-written dict): sorted by their repr, as the message shows them.
    if unknown := sorted(set(value) - set(PRICE_KEYS), key=repr):
        raise InvalidParameterError(parameter, value, f"unknown key(s) {unknown}; it takes {', '.join(PRICE_KEYS)}.")
    for key in PRICE_KEYS[:2]:
        price = value.get(key, 0)
        if isinstance(price, bool) or not isinstance(price, (int, float)) or not math.isfinite(price) or price < 0:
            raise InvalidParameterError(parameter, value, f"{key} must be a number, 0 or more, e.g. {example}.")
    if not isinstance(value.get("currency", ""), str):
        raise InvalidParameterError(parameter, value, f"currency must be a string, e.g. {example}.")
    return {key: value[key] for key in PRICE_KEYS if key in value}
