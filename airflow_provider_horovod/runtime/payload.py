"""The job's payload on the cluster: a package shipped as a Ray ``py_module`` holding the spec and
any pickled code (written by ``jobs.request.write_payload`` on the Airflow side). Standard library only."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

from airflow_provider_horovod.spec import SPEC_FILE


def payload_folder(module: str) -> str:
    return list(importlib.import_module(module).__path__)[0]


def read_payload(module: str, spec_class):
    """(spec, payload folder) of the payload package ``module``."""
    folder = payload_folder(module)
    with open(os.path.join(folder, SPEC_FILE), encoding="utf-8") as f:
        return spec_class.from_json(f.read()), folder


def load_callable(ref: dict[str, str], folder: str) -> Callable:
    """A function from ``{"import": "pkg.mod:fn"}`` or ``{"pickle": "<file in the payload>"}``."""
    if "import" in ref:
        module, _, attr = ref["import"].partition(":")
        target: Any = importlib.import_module(module)
        for part in attr.split("."):
            target = getattr(target, part)
        return target
    import cloudpickle

    with open(os.path.join(folder, ref["pickle"]), "rb") as f:
        return cloudpickle.load(f)
