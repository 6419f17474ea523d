"""How a user's function reaches the cluster: by import path, checked here without importing it, or
pickled by value with cloudpickle (the way HorovodRunner ships it), code from DAG files included."""

from __future__ import annotations

import ast
import difflib
import importlib.util
import os
import sys
import sysconfig
import threading
from collections.abc import Callable
from typing import Any

from airflow_provider_horovod.contract import required_positional
from airflow_provider_horovod.exceptions import InvalidParameterError


def is_import_path(value: Any) -> bool:
    """``"package.module:function"``: a colon, and no ``://`` (which a URI has)."""
    return isinstance(value, str) and ":" in value and "://" not in value


def check_import_path(parameter: str, path: str, *, check_importable: bool = True) -> str:
    module, sep, attr = path.partition(":")
    if not sep or not module or not attr or not all(p.isidentifier() for p in module.split(".") + attr.split(".")):
        raise InvalidParameterError(parameter, path, 'give an import path "package.module:function".')
    if not check_importable:
        return path
    found = importable_module(parameter, path, module, "or pass the function itself")
    name = attr.split(".")[0]
    defined = top_level_names(found)
    # A typo in the function's name would otherwise fail only on the cluster, after the upload.
    if defined is not None and name not in defined and not _is_submodule(module, name):
        public = [n for n in sorted(defined) if not n.startswith("_")]
        hint = difflib.get_close_matches(name, public, n=3) or public[:10]
        raise InvalidParameterError(
            parameter,
            path,
            f"module {module!r} defines no {name!r}; check the name"
            + (f" (it has {', '.join(hint)})." if hint else "."),
        )
    return path


def importable_module(parameter: str, value: Any, module: str, otherwise: str) -> Any:
    """The module's spec, found here without importing it; refused naming ``parameter`` when there is none."""
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise InvalidParameterError(
            parameter,
            value,
            f"module {module!r} is not importable here; install it where Airflow and Ray run, ship it "
            f"with runtime_env (py_modules/working_dir), {otherwise}.",
        )
    return found


def _is_submodule(module: str, name: str) -> bool:
    try:
        return importlib.util.find_spec(f"{module}.{name}") is not None
    except (ImportError, ValueError):  # `module` is not a package
        return False


# CPython 3.11's ast.parse is not safe in concurrent threads (a "recursion depth mismatch" SystemError),
# and tasks may check their functions in threads of one process.
_PARSE_LOCK = threading.Lock()
_PICKLE_BY_VALUE_LOCK = threading.Lock()


def top_level_names(spec) -> set[str] | None:
    """Names a module's source defines at its top level, read without importing it (importing
    could be slow or heavy). None when that cannot be known: no source, `import *`, `__getattr__`."""
    origin = getattr(spec, "origin", None) or ""
    if not origin.endswith(".py") or not os.path.isfile(origin):
        return None
    try:
        with open(origin, encoding="utf-8") as f, _PARSE_LOCK:
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
    return None if "__getattr__" in names else names


def _pickled_by_value_modules(fn: Callable) -> list:
    """Modules whose code must travel inside the pickle: DAG files are not on the cluster."""
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    if module is None or module.__name__ == "__main__":
        return []
    if module.__name__.split(".")[0] == "airflow_provider_horovod":
        return []  # the provider travels with every job
    file = getattr(module, "__file__", None) or ""
    installed = (
        any(part in file for part in ("site-packages", "dist-packages"))
        or not file
        or file.startswith(sysconfig.get_paths()["stdlib"])
    )
    return [] if installed else [module]


def pickle_callable(parameter: str, fn: Any) -> bytes:
    """cloudpickle a function; the module it comes from travels by value unless it is installed."""
    import cloudpickle

    if not callable(fn):
        raise InvalidParameterError(parameter, fn, 'give a function, or an import path "package.module:function".')
    modules = _pickled_by_value_modules(fn)
    # cloudpickle's by-value registry is one per process: operators planning in threads of one process
    # (a backfill's tasks started side by side) would unregister each other's modules.
    with _PICKLE_BY_VALUE_LOCK:
        for module in modules:
            cloudpickle.register_pickle_by_value(module)
        try:
            return cloudpickle.dumps(fn)
        except Exception as err:  # cloudpickle raises many kinds
            raise InvalidParameterError(
                parameter,
                fn,
                f"it cannot be pickled ({type(err).__name__}: {err}); import heavy objects (models, clients, "
                "open files) inside the function instead of capturing them.",
            ) from None
        finally:
            for module in modules:
                cloudpickle.unregister_pickle_by_value(module)


def import_path_of(fn: Any) -> str | None:
    """``"module:qualname"`` for a function the cluster can import by name (from an installed
    package, or the provider's own): no pickle then, and no Python version to match."""
    module_name, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    module = sys.modules.get(module_name or "")
    if module is None or "<" in qualname or _pickled_by_value_modules(fn) or module_name == "__main__":
        return None
    target: Any = module
    for part in qualname.split("."):
        target = getattr(target, part, None)
    return f"{module_name}:{qualname}" if target is fn else None


def ship_function(
    parameter: str,
    fn: Any,
    file_name: str,
    *,
    code_ships: bool = False,
    max_args: int | None = None,
    arity_fix: str = "",
) -> tuple[dict[str, str], dict[str, bytes]]:
    """``({"import": path} or {"pickle": file, "source": its file}, files)`` for a function given as an import path or
    a callable. ``code_ships``: the job's runtime_env brings code, so an import path is not looked
    up here. ``max_args``: how many required positional parameters the function may have."""
    if isinstance(fn, str):
        return {"import": check_import_path(parameter, fn, check_importable=not code_ships)}, {}
    if callable(fn):
        if max_args is not None and required_positional(fn) > max_args:
            raise InvalidParameterError(parameter, fn, arity_fix)
        if path := import_path_of(fn):
            return {"import": path}, {}
        ref = {"pickle": file_name}
        # cloudpickle (3.1.3 on) ships code as "<dynamic-code>": the runtime gives it its file back.
        if isinstance(source := getattr(getattr(fn, "__code__", None), "co_filename", None), str):
            ref["source"] = source
        return ref, {file_name: pickle_callable(parameter, fn)}
    raise InvalidParameterError(parameter, fn, 'give a function, or an import path "package.module:function".')
