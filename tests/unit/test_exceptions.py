"""The provider's errors: one base a user's handler (or Airflow's retry_policy) can match, messages
that name the bad value and the fix, and the job's identity kept on a job's error."""

import inspect

import pytest

from airflow_provider_horovod import exceptions
from airflow_provider_horovod.exceptions import HorovodProviderError, InvalidParameterError, RayJobError


@pytest.mark.parametrize(
    "error",
    [
        cls
        for _, cls in inspect.getmembers(exceptions, inspect.isclass)
        if issubclass(cls, Exception) and cls.__module__ == exceptions.__name__
    ],
)
def test_every_error_of_the_provider_is_one_of_its_own(error):
    assert issubclass(error, HorovodProviderError)


def test_an_invalid_parameter_names_the_value_and_the_fix():
    err = InvalidParameterError("num_workers", 0, "give a whole number of Horovod workers, 1 or more (e.g. 2).")
    assert str(err) == "Invalid num_workers=0: give a whole number of Horovod workers, 1 or more (e.g. 2)."
    assert (err.parameter, err.value) == ("num_workers", 0)
    assert isinstance(err, ValueError)


def test_a_job_error_keeps_the_job():
    err = RayJobError(
        "Ray job x ended FAILED", submission_id="x", status="FAILED", error_type="JOB_ENTRYPOINT_COMMAND_ERROR"
    )
    assert (err.submission_id, err.status, err.error_type) == ("x", "FAILED", "JOB_ENTRYPOINT_COMMAND_ERROR")
