"""How a user's function reaches the cluster: an import path checked here without importing it,
or the function pickled by value (its module travels with it when it is not installed)."""

import sys
import threading
import time

import cloudpickle
import pytest

from airflow_provider_horovod.exceptions import InvalidParameterError
from airflow_provider_horovod.functions import (
    check_import_path,
    is_import_path,
    pickle_callable,
    required_positional,
    ship_function,
    top_level_names,
)

QUICKSTART = "airflow_provider_horovod.examples.quickstart"


def helper(x):
    return x * 2


def train_here(config):
    """Defined in a test module, which is not installed: it must travel by value."""
    return {"doubled": helper(config["x"]), "module": __name__}


def fails(fn, *args, fix="", **kwargs) -> InvalidParameterError:
    with pytest.raises(InvalidParameterError) as err:
        fn(*args, **kwargs)
    assert fix in str(err.value), str(err.value)
    return err.value


@pytest.mark.parametrize(
    "value, expected",
    [
        ("pkg.mod:fn", True),
        ("pkg:fn", True),
        ("s3://b/x", False),
        ("s3://b/x:y", False),
        ("pkg.mod", False),
        (42, False),
        (None, False),
    ],
)
def test_is_import_path(value, expected):
    assert is_import_path(value) is expected


def test_an_existing_function_passes():
    assert check_import_path("train_fn", f"{QUICKSTART}:train_func") == f"{QUICKSTART}:train_func"
    assert check_import_path("train_fn", "json:dumps") == "json:dumps"  # a C-accelerated stdlib module
    assert check_import_path("train_fn", "airflow_provider_horovod.examples:quickstart")  # a submodule


def test_a_typo_gets_suggestions_from_the_modules_source():
    err = fails(
        check_import_path,
        "train_fn",
        f"{QUICKSTART}:trian_func",
        fix=f"module {QUICKSTART!r} defines no 'trian_func'; check the name (it has train_func",
    )
    assert err.parameter == "train_fn"
    assert err.value == f"{QUICKSTART}:trian_func"


def test_an_unimportable_module():
    fails(
        check_import_path,
        "train_fn",
        "no_such_module_xyz:train",
        fix="module 'no_such_module_xyz' is not importable here",
    )
    fails(check_import_path, "train_fn", "json.no_such_sub:train", fix="is not importable here")


@pytest.mark.parametrize("bad", ["not a path", "pkg.mod:", ":fn", "pkg mod:fn", "pkg.mod:fn-x", "pkg..mod:fn"])
def test_a_malformed_import_path(bad):
    fails(check_import_path, "train_fn", bad, fix='"package.module:function"')
    fails(check_import_path, "train_fn", bad, check_importable=False, fix='"package.module:function"')


def test_code_ships_skips_the_lookup_but_not_the_form():
    ref, files = ship_function("train_fn", "no_such_module_xyz:train", "train_fn.pkl", code_ships=True)
    assert ref == {"import": "no_such_module_xyz:train"}
    assert files == {}
    fails(ship_function, "train_fn", "not a path", "train_fn.pkl", code_ships=True, fix="package.module:function")
    with pytest.raises(InvalidParameterError, match="not importable"):
        ship_function("train_fn", "no_such_module_xyz:train", "train_fn.pkl")


def write_module(folder, name, source):
    path = folder / f"{name}.py"
    path.write_text(source)
    return path


def test_top_level_names_read_from_source(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.syspath_prepend(str(tmp_path))
    write_module(
        tmp_path,
        "ahp_names_mod",
        (
            "import os, json as js\n"
            "from collections import OrderedDict as OD\n"
            "A = 1\n"
            "B: int = 2\n"
            "C, (D, E) = 3, (4, 5)\n"
            "os.environ_x = 1\n"
            "def f(): pass\n"
            "async def g(): pass\n"
            "class K: pass\n"
            "if A:\n"
            "    def under_if(): pass\n"
            "else:\n"
            "    def in_else(): pass\n"
            "try:\n"
            "    import fast_thing\n"
            "except ImportError:\n"
            "    def fallback(): pass\n"
            "finally:\n"
            "    FIN = 1\n"
        ),
    )
    names = top_level_names(importlib.util.find_spec("ahp_names_mod"))
    assert names == {
        "os",
        "js",
        "OD",
        "A",
        "B",
        "C",
        "D",
        "E",
        "f",
        "g",
        "K",
        "under_if",
        "in_else",
        "fast_thing",
        "fallback",
        "FIN",
    }


@pytest.mark.parametrize(
    "source", ["from os.path import *\n", "def __getattr__(name):\n    return name\n", "def broken(:\n"]
)
def test_names_unknowable_from_source_are_not_refused(tmp_path, monkeypatch, source):
    monkeypatch.syspath_prepend(str(tmp_path))
    name = f"ahp_dyn_{abs(hash(source))}"
    write_module(tmp_path, name, source)
    assert check_import_path("train_fn", f"{name}:anything") == f"{name}:anything"


def test_a_function_from_a_test_module_is_pickled_by_value(monkeypatch):
    data = pickle_callable("train_fn", train_here)
    # The module is not importable where the function lands: it must not be needed.
    monkeypatch.setitem(sys.modules, __name__, None)
    loaded = cloudpickle.loads(data)
    assert loaded({"x": 21}) == {"doubled": 42, "module": __name__}


def test_by_value_registration_does_not_outlive_the_call():
    pickle_callable("train_fn", train_here)
    assert __name__ not in cloudpickle.list_registry_pickle_by_value()


def test_functions_of_one_module_pickled_in_threads_at_once_each_travel(monkeypatch):
    """A backfill's tasks planned side by side in one process: one thread's unregistering must not break
    another's pickle (cloudpickle's registry is one per process)."""
    import concurrent.futures

    dumps = cloudpickle.dumps

    def slow_dumps(fn):  # widens the window between register and unregister, as a loaded machine does
        time.sleep(0.05)
        return dumps(fn)

    monkeypatch.setattr(cloudpickle, "dumps", slow_dumps)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        pickles = list(pool.map(lambda _: pickle_callable("train_fn", train_here), range(16)))
    assert all(cloudpickle.loads(data)({"x": 1})["doubled"] == 2 for data in pickles)
    assert __name__ not in cloudpickle.list_registry_pickle_by_value()


def test_the_providers_own_functions_go_by_reference():
    from airflow_provider_horovod.examples.quickstart import train_func

    data = pickle_callable("train_fn", train_func)
    assert QUICKSTART.encode() in data
    assert cloudpickle.loads(data) is train_func


def test_a_lambda_and_a_closure_travel():
    factor = 3
    assert cloudpickle.loads(pickle_callable("fn", lambda c: c * factor))(2) == 6


def test_ship_function_of_a_callable():
    ref, files = ship_function("train_fn", train_here, "train_fn.pkl", max_args=1)
    # Its file travels beside it: cloudpickle >= 3.1.3 ships code as "<dynamic-code>".
    assert ref == {"pickle": "train_fn.pkl", "source": __file__}
    assert list(files) == ["train_fn.pkl"]
    assert cloudpickle.loads(files["train_fn.pkl"])({"x": 1})["doubled"] == 2


def no_args():
    pass


def with_defaults(config=None, other=1):
    pass


def star_args(*args, **kwargs):
    pass


def keyword_only(config, *, flag):
    pass


def two_args(config, other):
    pass


@pytest.mark.parametrize(
    "fn, n",
    [
        (no_args, 0),
        (train_here, 1),
        (with_defaults, 0),
        (star_args, 0),
        (keyword_only, 1),
        (two_args, 2),
        (lambda a, b, c=1: 0, 2),
    ],
)
def test_required_positional(fn, n):
    assert required_positional(fn) == n


def test_the_arity_check():
    fix = "it must take no argument or one (`config`)."
    err = fails(ship_function, "train_fn", two_args, "f.pkl", max_args=1, arity_fix=fix, fix=fix)
    assert err.parameter == "train_fn"
    assert err.value is two_args
    assert ship_function("train_fn", two_args, "f.pkl")[0] == {"pickle": "f.pkl", "source": __file__}  # no limit asked
    for fn in (no_args, with_defaults, star_args):
        ship_function("train_fn", fn, "f.pkl", max_args=1, arity_fix=fix)


class HoldsALock:
    def __init__(self):
        self.lock = threading.Lock()

    def __call__(self, config):
        return self.lock


def test_unpicklable_objects_are_refused_with_the_fix():
    lock = threading.Lock()
    err = fails(pickle_callable, "train_fn", lambda config: lock, fix="cannot be pickled")
    assert "import heavy objects" in str(err)
    assert err.parameter == "train_fn"
    fails(ship_function, "datasets['x']", HoldsALock(), "d.pkl", fix="cannot be pickled")


@pytest.mark.parametrize("bad", [42, None, ["pkg:fn"]])
def test_neither_a_function_nor_a_path(bad):
    fails(ship_function, "train_fn", bad, "f.pkl", fix="give a function")
    fails(pickle_callable, "train_fn", bad, fix="give a function")
