"""What the job steps need of a Ray cluster is one Protocol, which the hook and the tests' fake both
provide: the steps take either, so a test hands its fake in instead of reaching into an operator."""

import inspect

import pytest

from airflow_provider_horovod.hooks.ray import RayHook
from airflow_provider_horovod.jobs.api import RayJobsApi
from unit.fakes import FakeRay

CALLS = sorted(
    name
    for name, member in vars(RayJobsApi).items()
    if not name.startswith("_") and (callable(member) or isinstance(member, property))
)


def test_the_protocol_names_the_calls_the_steps_make():
    assert CALLS == [
        "a_get_cluster_resources",
        "a_get_job_info",
        "a_get_job_logs",
        "a_get_log_tail",
        "a_stop_job",
        "aclose",
        "endpoint",
        "get_cluster_resources",
        "get_job_info",
        "get_job_url",
        "ray_version",
        "stop_job",
        "submit_job",
    ]


@pytest.mark.parametrize("provider", [RayHook, FakeRay()], ids=["hook", "fake"])
def test_the_hook_and_the_fake_both_provide_every_call_alike(provider):
    for name in CALLS:
        wanted = getattr(RayJobsApi, name)
        if isinstance(wanted, property):  # the hook's is a cached property, the fake's an attribute
            assert name in dir(provider) or name in vars(provider), name
            continue
        member = getattr(provider, name, None)
        assert member is not None, f"{provider} lacks {name}"
        assert inspect.iscoroutinefunction(member) == inspect.iscoroutinefunction(wanted), name
        params = [p for p in inspect.signature(wanted).parameters if p != "self"]
        theirs = inspect.signature(member).parameters
        assert all(p in theirs for p in params) or any(p.kind is p.VAR_KEYWORD for p in theirs.values()), (
            name,
            params,
            list(theirs),
        )
