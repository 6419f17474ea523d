"""The payload's functions on the cluster: code shipped by value gets its source file back for tracebacks."""

from airflow_provider_horovod.runtime.payload import DYNAMIC_CODE, with_source_file


def _helper(x):
    return 1 / x


def _shipped(x):
    return _helper(x) + 1


def test_code_shipped_by_value_gets_its_file_back_for_tracebacks():
    import traceback
    import types

    # As cloudpickle >= 3.1.3 ships them: the function and the helper of its file it calls.
    helper = types.FunctionType(_helper.__code__.replace(co_filename=DYNAMIC_CODE), {})
    fn = types.FunctionType(_shipped.__code__.replace(co_filename=DYNAMIC_CODE), {"_helper": helper})
    with_source_file(fn, "/dags/my_dag.py")
    try:
        fn(0)
    except ZeroDivisionError as err:
        frames = traceback.extract_tb(err.__traceback__)
    assert [(f.filename, f.name) for f in frames[-2:]] == [
        ("/dags/my_dag.py", "_shipped"),
        ("/dags/my_dag.py", "_helper"),
    ]
    assert frames[-1].lineno == _helper.__code__.co_firstlineno + 1  # the lines stay right


def test_a_shipped_callable_whose_code_cannot_be_renamed_still_runs():
    import types

    class Model:
        def step(self, x):
            return x + 1

    method = Model().step
    Model.step.__code__ = Model.step.__code__.replace(co_filename=DYNAMIC_CODE)
    fn = types.FunctionType(_shipped.__code__.replace(co_filename=DYNAMIC_CODE), {"_helper": method})
    with_source_file(fn, "/dags/my_dag.py")  # a bound method's code cannot be set through it
    assert fn(1) == 3
    assert fn.__code__.co_filename == "/dags/my_dag.py"
