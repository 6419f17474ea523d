"""What differs between Ray minors, probed on the Ray installed here (make test runs this file on the oldest
and the newest tested minor), and the trainer API chosen from the probes. The facts each probe must find
were read from the released wheels (docs/compatibility.md)."""

from __future__ import annotations

import os

import pytest

from airflow_provider_horovod.contract import RAY_ELASTIC_SINCE, ray_minor
from airflow_provider_horovod.exceptions import RayIncompatibleError
from airflow_provider_horovod.runtime import ray_compat
from airflow_provider_horovod.runtime.ray_compat import Choice, choose_trainer

MINOR = ray_minor(ray_compat.ray_version())


@pytest.fixture
def probes(monkeypatch):
    """The probes' results set by the test: every probe passes unless the test says otherwise."""
    found = {probe.key: True for probe in ray_compat.PROBES}
    monkeypatch.setattr(ray_compat, "probe_results", lambda: found)
    return found


# --- the probes, on the Ray installed here ------------------------------------------------------------


def test_a_users_error_in_a_worker_is_classed_as_the_users_on_this_minor():
    """A worker's exception as this minor's Train V2 hands it to the failure policy and the driver (2.50 to
    2.54 wrap it in UserExceptionWithTraceback, 2.55 and later unwrap it): still the user's, with its rank."""
    import pickle

    from ray.train.v2._internal.execution.worker_group.poll import WorkerGroupPollStatus, WorkerStatus
    from ray.train.v2._internal.util import construct_user_exception_with_traceback

    from airflow_provider_horovod import failures

    try:
        1 / 0  # noqa: B018 - the user's bug
    except ZeroDivisionError as err:
        failures.mark_user_error(err, rank=1)
        wrapped = construct_user_exception_with_traceback(err)
    # As the worker actor returns it to the controller.
    status = WorkerStatus(running=False, error=pickle.loads(pickle.dumps(wrapped)))
    error = WorkerGroupPollStatus(worker_statuses={0: WorkerStatus(running=False), 1: status}).get_worker_group_error()
    verdict = failures.of_error(pickle.loads(pickle.dumps(error)), user_code=False)
    assert (verdict.failure_class, verdict.rank, verdict.error_type) == (
        failures.FailureClass.USER_CODE,
        1,
        "ZeroDivisionError",
    )


def test_the_probes_find_what_this_ray_minor_has():
    assert MINOR is not None
    assert MINOR >= (2, 50)
    found = ray_compat.probe_results()
    # Train V2's backend API and Ray's own HorovodTrainer are in every tested minor.
    for key in ("v2_controller", "v2_failure_policy", "v2_context", "v2_callback", "v2_start_timeout"):
        assert found[key], key
    assert found["legacy_trainer"]
    assert found["copy_helpers"]
    assert found["report_methods"]
    assert found["controller_states"]
    # Elastic scaling from 2.55; the coordinator's fresh view from 2.60.
    assert found["elastic_policy"] == (MINOR >= RAY_ELASTIC_SINCE)
    assert found["fresh_elastic_view"] == (MINOR >= (2, 60))


@pytest.mark.skipif(ray_compat.V2_ENABLED_ENV in os.environ, reason="Ray's default is what is checked")
def test_train_v2_is_rays_default_from_2_51():
    assert ray_compat.train_v2_on() == (MINOR >= (2, 51))


def test_auto_on_this_ray_runs_the_api_ray_runs_by_default():
    choice = choose_trainer("auto", False)
    assert choice.trainer_api == ("v2" if ray_compat.train_v2_on() else "legacy")
    assert ray_compat.ray_version() in choice.why
    assert not choice.warnings


def test_elastic_on_this_ray_runs_from_2_55_and_is_refused_before_naming_both_versions():
    if MINOR >= RAY_ELASTIC_SINCE:
        assert choose_trainer("auto", True).trainer_api == "v2"
        return
    with pytest.raises(RayIncompatibleError) as refused:
        choose_trainer("auto", True)
    assert f"Ray {ray_compat.ray_version()}" in str(refused.value)
    assert "Ray 2.55" in str(refused.value)


def test_a_probe_that_breaks_finds_nothing(monkeypatch):
    def broken():
        raise AttributeError("moved")

    ray_compat.probe_results.cache_clear()
    monkeypatch.setattr(ray_compat, "PROBES", (ray_compat.Probe("x", "something", "v2", broken),))
    try:
        assert ray_compat.probe_results() == {"x": False}
        assert ray_compat.missing("v2") == ["something"]
    finally:
        ray_compat.probe_results.cache_clear()


# --- the choice, from the probes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "requested, v2_on, chosen",
    [("auto", True, "v2"), ("auto", False, "legacy"), ("v2", True, "v2"), ("legacy", False, "legacy")],
)
def test_auto_follows_whether_train_v2_is_on_and_explicit_apis_are_kept(probes, requested, v2_on, chosen):
    choice = choose_trainer(requested, False, version="2.55.1", v2_on=v2_on)
    assert choice == Choice(chosen, choice.why)
    assert choice.why


def test_an_api_whose_train_version_is_off_is_refused_saying_what_to_do(probes):
    with pytest.raises(RayIncompatibleError, match="RAY_TRAIN_V2_ENABLED=0.*trainer_api='legacy'"):
        choose_trainer("v2", False, version="2.55.1", v2_on=False)
    with pytest.raises(RayIncompatibleError, match="trainer_api='legacy' runs Ray's HorovodTrainer under Train V1"):
        choose_trainer("legacy", False, version="2.55.1", v2_on=True)


def test_elastic_without_the_policy_names_the_version_and_the_first_minor_that_has_it(probes):
    probes["elastic_policy"] = False
    for requested in ("auto", "v2"):
        with pytest.raises(RayIncompatibleError) as refused:
            choose_trainer(requested, True, version="2.54.1", v2_on=True)
        assert "the cluster's Ray 2.54.1 lacks" in str(refused.value)
        assert "Ray 2.55" in str(refused.value)
    probes["elastic_policy"] = True
    assert choose_trainer("auto", True, version="2.60.0", v2_on=True).trainer_api == "v2"


def test_elastic_without_a_fresh_view_runs_on_rays_own_policy_and_says_so(probes):
    probes["fresh_elastic_view"] = False
    (warning,) = choose_trainer("auto", True, version="2.57.1", v2_on=True).warnings
    assert "Ray 2.57.1" in warning
    assert "up to 20 s late" in warning
    assert not choose_trainer("auto", False, version="2.57.1", v2_on=True).warnings  # not elastic: not used


def test_a_ray_older_than_the_range_is_refused(probes):
    with pytest.raises(RayIncompatibleError, match=r"Ray 2\.49\.2.*tested: 2\.50 to 2\.60"):
        choose_trainer("auto", False, version="2.49.2", v2_on=True)


def test_a_newer_ray_runs_with_a_warning_when_the_probes_pass_and_is_refused_naming_what_is_missing(probes):
    choice = choose_trainer("auto", False, version="2.61.0", v2_on=True)
    assert choice.trainer_api == "v2"
    assert "Ray 2.61.0 is newer than the minors" in choice.warnings[0]
    probes["v2_context"] = False
    with pytest.raises(RayIncompatibleError) as refused:
        choose_trainer("auto", False, version="2.61.0", v2_on=True)
    message = str(refused.value)
    assert "Ray 2.61.0 lacks what trainer_api='v2' uses: V2 train context with a checkpoint field" in message
    assert "tested Ray minor" in message
    assert "trainer_api='legacy'" in message


# --- what the runtime uses ----------------------------------------------------------------------------


def test_the_controller_changes_that_replace_a_worker_group():
    from ray.train.v2._internal.execution.controller import state

    assert ray_compat.controller_change(state.ResizingState(scaling_decision=None)) == "resize"
    assert ray_compat.controller_change(state.RunningState()) is None


def test_controller_arguments_are_added_to_those_ray_gives():
    class Trainer:
        def _initialize_and_run_controller(self, **kwargs):
            return kwargs

    trainer = ray_compat.with_controller_args(Trainer(), lambda given: {"failure_policy": sorted(given)})
    assert trainer._initialize_and_run_controller(scaling_policy="ray's") == {
        "scaling_policy": "ray's",
        "failure_policy": ["scaling_policy"],
    }


def test_a_startup_timeout_is_found_in_the_error_its_controller_failure_or_its_causes():
    class WorkerGroupStartupTimeoutError(Exception):
        pass

    class ControllerError(Exception):
        def __init__(self, failure):
            self.controller_failure = failure

    assert ray_compat.startup_timed_out(ControllerError(WorkerGroupStartupTimeoutError()))
    try:
        raise RuntimeError("fit failed") from WorkerGroupStartupTimeoutError()
    except RuntimeError as err:
        assert ray_compat.startup_timed_out(err)
    assert not ray_compat.startup_timed_out(RuntimeError("other"))
