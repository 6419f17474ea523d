"""The job's payload on the cluster: its spec, and the functions it names (imported, or unpickled with
their source file kept for tracebacks)."""

from __future__ import annotations

import importlib
import os
import types
from collections.abc import Callable
from typing import Any, TypeVar

from airflow_provider_horovod.contract import SPEC_FILE

T = TypeVar("T")


def read_payload(module: str, spec_class: type[T]) -> tuple[T, str]:
    """(spec, payload folder) of the payload package ``module``, which the Airflow side shipped as a
    Ray ``py_module`` holding the spec and any pickled code."""
    folder = list(importlib.import_module(module).__path__)[0]
    with open(os.path.join(folder, SPEC_FILE), encoding="utf-8") as f:
        return spec_class.from_json(f.read()), folder  # type: ignore[attr-defined]


def load_callable(ref: dict[str, str], folder: str) -> Callable:
    """A function from ``{"import": "pkg.mod:fn"}`` or ``{"pickle": "<file in the payload>"}``."""
    if "import" in ref:
        module, _, attr = ref["import"].partition(":")
        target: Any = importlib.import_module(module)
        for part in attr.split("."):
            if not hasattr(target, part):  # an import path that does not resolve here: configuration
                raise ImportError(f"{ref['import']} does not resolve on the cluster: {module} has no {part!r}")
            target = getattr(target, part)
        return target
    import cloudpickle

    with open(os.path.join(folder, ref["pickle"]), "rb") as f:
        fn = cloudpickle.load(f)
    if ref.get("source"):
        with_source_file(fn, ref["source"])
    return fn


# cloudpickle (3.1.3 on) names the code it ships by value so; tracebacks then lose the user's file.
DYNAMIC_CODE = "<dynamic-code>"


def _with_file(code: types.CodeType, source: str) -> types.CodeType:
    consts = tuple(_with_file(c, source) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=source if code.co_filename == DYNAMIC_CODE else code.co_filename, co_consts=consts)


def with_source_file(fn: Any, source: str) -> None:
    """Give a function shipped by value, and the functions of its file it calls (its globals), back
    their file name, so tracebacks and a failure's "own frames" name the user's file and line."""
    shipped = [fn, *(getattr(fn, "__globals__", None) or {}).values()]
    for each in shipped:
        code = getattr(each, "__code__", None)
        if isinstance(code, types.CodeType) and code.co_filename == DYNAMIC_CODE:
            try:
                each.__code__ = _with_file(code, source)
            except (AttributeError, TypeError, ValueError):  # a bound method, say: only the name is lost
                pass
