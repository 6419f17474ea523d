"""Ray's internals, reached from one place: the only module of the provider that imports Ray Train's
private modules (``ray.train.v2._internal...``, ``ray.train._internal...``) or Ray Data's autoscaling
coordinator, which move between Ray minors. The rest of the runtime asks this module.

It probes for what exists (a module, a class, a method, a parameter) rather than comparing version
strings. What differs across the tested minors (``contract.RAY_VERSIONS``, docs/compatibility.md):

- Train V2 is Ray's default from 2.51; 2.50 runs Train V1 unless ``RAY_TRAIN_V2_ENABLED=1``. With
  ``trainer_api="auto"`` the runtime runs the provider's V2 backend where Train V2 is on, and Ray's own
  ``HorovodTrainer`` where it is off (``choose_trainer``).
- Ray Train's elastic scaling policy comes with 2.55 (``num_workers=(min, max)``).
- Ray Data's autoscaling coordinator answers from a fresh view of the nodes (``recompute``) from 2.60;
  before that an elastic run uses Ray's own policy, which sees a lost or a new node up to 20 s late.
- Train V2 hands a worker's exception to the failure policy and the driver wrapped in its
  ``UserExceptionWithTraceback`` before 2.55 (``failures.worker_exception`` unwraps it: the failure classes
  are told apart by names and attributes on both sides, without Ray).

A Ray older than the range is refused at the job's start (``contract.check_ray_version``). A newer,
untested minor runs with a warning when every probe the chosen trainer needs passes, and fails at
the job's start naming the probes that do not (``choose_trainer``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import json
import os
from collections.abc import Callable
from typing import Any

from airflow_provider_horovod.contract import (
    RAY_ELASTIC_SINCE,
    TrainerApi,
    check_ray_version,
    elastic_ray_problem,
    minor_text,
    untested_ray_version,
)
from airflow_provider_horovod.exceptions import RayIncompatibleError

# Ray Train's private modules the runtime uses.
V2_CONSTANTS = "ray.train.v2._internal.constants"
V2_CONTROLLER = "ray.train.v2._internal.execution.controller.controller"
V2_CONTROLLER_STATES = "ray.train.v2._internal.execution.controller.state"
V2_CALLBACKS = "ray.train.v2._internal.execution.callback"
V2_FAILURE_HANDLING = "ray.train.v2._internal.execution.failure_handling"
V2_CONTEXT = "ray.train.v2._internal.execution.context"
V2_ELASTIC = "ray.train.v2._internal.execution.scaling_policy.elastic"
V2_UTIL = "ray.train.v2._internal.util"
V2_TRAINER = "ray.train.v2.api.data_parallel_trainer"
V1_SESSION = "ray.train._internal.session"
V1_HOROVOD = "ray.train.horovod.horovod_trainer"
AUTOSCALING_COORDINATOR = "ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator"
# Ray Train's one helper that copies a checkpoint, in each API's storage module (runtime.uploads routes it).
COPY_HELPER_MODULES = ("ray.train._internal.storage", "ray.train.v2._internal.execution.storage")
COPY_HELPER = "_pyarrow_fs_copy_files"
# Where each API's ``ray.train.report`` lands, and for V2 the step where the ranks agree on the name of a
# checkpoint's folder (runtime.history.History records both).
REPORT_METHODS = (
    (V2_CONTEXT, "TrainContext", "_sync_checkpoint_dir_name_across_ranks"),
    (V1_SESSION, "_TrainSession", None),
)
# Read by V2's controller from the driver's environment: its wait for a worker group, its polls, a preemption watcher.
WORKER_GROUP_START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
HEALTH_CHECK_INTERVAL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"
# V2's callbacks that start actors a provider job does without, where the Ray has them (lean_callbacks).
PLACEMENT_GROUP_CLEANER = ("ray.train.v2._internal.callbacks.placement_group_callback", "PlacementGroupCleanerCallback")
DATASETS_CALLBACK = ("ray.train.v2._internal.callbacks.datasets", "DatasetsCallback")
WORKER_GROUP_CALLBACK = ("ray.train.v2._internal.execution.callback", "WorkerGroupCallback")
V2_ENABLED_ENV = "RAY_TRAIN_V2_ENABLED"
# The controller states that replace a running worker group, and why (runtime.horovod_backend's segments).
# PreemptingState comes with 2.58; before it a preemption is a restart.
CHANGE_OF_STATE = {"ResizingState": "resize", "RestartingState": "restart", "PreemptingState": "preempt"}
# Needed by an elastic run, or by nothing: without an optional probe the runtime falls back (a slower
# upload, no metric history, Ray's own elastic view, fewer segment reasons) and says so.
ELASTIC, OPTIONAL = "elastic", "optional"


# --- probes ----------------------------------------------------------------------------------------


def _attr(module: str, *names: str) -> Any:
    """``module.names[0].names[1]...``; None when any part is missing (or the module fails to import)."""
    try:
        target: Any = importlib.import_module(module)
    except ImportError:
        return None
    for name in names:
        target = getattr(target, name, None)
        if target is None:
            return None
    return target


def _params(fn: Any) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _v2_controller_takes_policies() -> bool:
    run = _attr(V2_TRAINER, "DataParallelTrainer", "_initialize_and_run_controller")
    controller = _attr(V2_CONTROLLER, "TrainController")
    return callable(run) and {"failure_policy", "scaling_policy"} <= _params(controller)


def _v2_failure_policy() -> bool:
    decision = _attr(V2_FAILURE_HANDLING, "FailureDecision")
    return callable(_attr(V2_FAILURE_HANDLING, "create_failure_policy")) and hasattr(decision, "RAISE")


def _v2_train_context_checkpoint() -> bool:
    context = _attr(V2_CONTEXT, "TrainContext")
    return (
        callable(_attr(V2_CONTEXT, "get_train_context"))
        and dataclasses.is_dataclass(context)
        and "checkpoint" in {f.name for f in dataclasses.fields(context)}
    )


def _v2_controller_callback() -> bool:
    return callable(_attr(V2_CALLBACKS, "ControllerCallback", "after_controller_state_update")) and callable(
        _attr(V2_CALLBACKS, "WorkerCallback", "before_worker_shutdown")
    )


def _v2_worker_group_start_timeout() -> bool:
    return _attr(V2_CONSTANTS, "WORKER_GROUP_START_TIMEOUT_S_ENV_VAR") == WORKER_GROUP_START_TIMEOUT_ENV


def _legacy_trainer() -> bool:
    return _attr(V1_HOROVOD, "HorovodTrainer") is not None and _attr("ray.train.horovod", "HorovodConfig") is not None


def _elastic_policy() -> bool:
    return _attr(V2_ELASTIC, "ElasticScalingPolicy") is not None


def _fresh_elastic_view() -> bool:
    policy = _attr(V2_ELASTIC, "ElasticScalingPolicy")
    coordinator = _attr(AUTOSCALING_COORDINATOR, "_AutoscalingCoordinatorActor", "get_reserved_resources")
    return (
        policy is not None
        and callable(getattr(policy, "_get_reserved_resources", None))
        and hasattr(policy, "GET_RESERVED_RESOURCES_INTERVAL_S")
        and "recompute" in _params(coordinator)
        and callable(_attr(V2_UTIL, "time_monotonic"))
    )


def _copy_helpers() -> bool:
    return all(callable(_attr(module, COPY_HELPER)) for module in COPY_HELPER_MODULES)


def _report_methods() -> bool:
    return all(
        callable(_attr(module, cls, "report")) and (sync is None or callable(_attr(module, cls, sync)))
        for module, cls, sync in REPORT_METHODS
    )


def _controller_states() -> bool:
    return all(_attr(V2_CONTROLLER_STATES, name) is not None for name in ("ResizingState", "RestartingState"))


@dataclasses.dataclass(frozen=True)
class Probe:
    """One thing the runtime uses. ``needed_by``: the trainer API (``v2``, ``legacy``) or ``ELASTIC`` run
    that cannot go without it; ``OPTIONAL`` when the runtime does without it, as ``fallback`` says, for
    the runs ``used_by`` names (``v2``, ``legacy``, ``ELASTIC``, or None: every run)."""

    key: str
    what: str
    needed_by: str
    check: Callable[[], bool]
    fallback: str = ""
    used_by: str | None = None


PROBES = (
    Probe("v2_controller", "V2 trainer whose controller takes policies", "v2", _v2_controller_takes_policies),
    Probe("v2_failure_policy", "V2 failure policy (create_failure_policy, FailureDecision)", "v2", _v2_failure_policy),
    Probe("v2_context", "V2 train context with a checkpoint field", "v2", _v2_train_context_checkpoint),
    Probe(
        "v2_callback",
        "V2 controller and worker callbacks (after_controller_state_update, before_worker_shutdown)",
        "v2",
        _v2_controller_callback,
    ),
    Probe("v2_start_timeout", "V2 worker-group start timeout variable", "v2", _v2_worker_group_start_timeout),
    Probe("legacy_trainer", "Train V1 HorovodTrainer and HorovodConfig", TrainerApi.LEGACY.value, _legacy_trainer),
    Probe("elastic_policy", "V2 elastic scaling policy", ELASTIC, _elastic_policy),
    Probe(
        "fresh_elastic_view",
        "the autoscaling coordinator's fresh view of the nodes (recompute)",
        OPTIONAL,
        _fresh_elastic_view,
        "Ray's own elastic policy, which sees a lost or a new node up to 20 s late",
        ELASTIC,
    ),
    Probe(
        "copy_helpers",
        "Ray Train's checkpoint copy helper",
        OPTIONAL,
        _copy_helpers,
        "checkpoints go to S3 through pyarrow, one file after another",
    ),
    Probe(
        "report_methods",
        "Ray Train's report methods",
        OPTIONAL,
        _report_methods,
        "no metric history (the Training view's curves, MLflow metrics)",
    ),
    Probe(
        "controller_states",
        "V2 controller's resize and restart states",
        OPTIONAL,
        _controller_states,
        "segments say 'failure' for every restart",
        "v2",
    ),
)
PROBE_KEYS = {probe.key: probe for probe in PROBES}


@functools.cache
def probe_results() -> dict[str, bool]:
    """Every probe's key -> whether what it looks for is there (run once per process)."""
    results = {}
    for probe in PROBES:
        try:
            results[probe.key] = bool(probe.check())
        except Exception:  # noqa: BLE001 - a probe that breaks finds nothing
            results[probe.key] = False
    return results


def has(key: str) -> bool:
    return probe_results()[key]


def missing(needed_by: str) -> list[str]:
    """What the probes of ``needed_by`` look for and did not find."""
    return [p.what for p in PROBES if p.needed_by == needed_by and not has(p.key)]


def fallbacks(api: str, elastic: bool) -> list[str]:
    """What a run of ``api`` does without, on this Ray: each missing optional probe's fallback."""
    runs = {api, ELASTIC} if elastic else {api}
    return [
        f"{p.what} is missing: {p.fallback}"
        for p in PROBES
        if p.needed_by == OPTIONAL and (p.used_by is None or p.used_by in runs) and not has(p.key)
    ]


def ray_version() -> str:
    import ray

    return ray.__version__


def train_v2_on() -> bool:
    """Whether ``ray.train`` runs Train V2 in this process (``RAY_TRAIN_V2_ENABLED``, else Ray's default)."""
    is_v2_enabled = _attr(V2_CONSTANTS, "is_v2_enabled")
    return bool(is_v2_enabled()) if callable(is_v2_enabled) else False


# --- the choice -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Choice:
    """The trainer API the job runs, why, and what to warn about (printed in the job's log)."""

    trainer_api: str
    why: str
    warnings: tuple[str, ...] = ()


def choose_trainer(requested: str, elastic: bool, *, version: str | None = None, v2_on: bool | None = None) -> Choice:
    """The trainer API for a spec asking ``requested`` (``auto``, ``v2``, ``legacy``) on this Ray, or
    ``RayIncompatibleError`` naming the version and the fix. ``version``/``v2_on``: this process's when None."""
    version = ray_version() if version is None else version
    v2_on = train_v2_on() if v2_on is None else v2_on
    if problem := check_ray_version(version):
        raise RayIncompatibleError(f"This Ray cluster cannot run the job: {problem}")
    warnings = [w for w in (untested_ray_version(version),) if w]
    if elastic and (lacking := missing(ELASTIC)):
        # The probe decides; the version words the message (the first minor that has it).
        raise RayIncompatibleError(
            elastic_ray_problem(version)
            or f"elastic training (num_workers=(min, max)) needs Ray Train's elastic scaling, which the cluster's "
            f"Ray {version} lacks ({'; '.join(lacking)}); Ray {minor_text(RAY_ELASTIC_SINCE)} and the newer tested "
            "minors have it."
        )
    if requested == TrainerApi.AUTO.value:
        if elastic or v2_on:
            api = TrainerApi.V2.value
            why = (
                "an elastic num_workers needs Train V2"
                if elastic and not v2_on
                else f"Ray {version} runs Ray Train V2 (RAY_TRAIN_V2_ENABLED on, or Ray's default)"
            )
        else:
            api = TrainerApi.LEGACY.value
            why = f"Ray {version} runs Ray Train V1 (its default before 2.51, or RAY_TRAIN_V2_ENABLED=0)"
    else:
        api, why = requested, "as trainer_api asks"
    if api == TrainerApi.V2.value and not v2_on:
        raise RayIncompatibleError(
            f"trainer_api={requested!r} runs Ray Train V2, which is off in this job ({V2_ENABLED_ENV}=0 in its "
            f"environment, or Ray {version}'s default): leave {V2_ENABLED_ENV} unset, or use trainer_api='legacy'."
        )
    if api == TrainerApi.LEGACY.value and v2_on:
        raise RayIncompatibleError(
            f"trainer_api='legacy' runs Ray's HorovodTrainer under Train V1, which is off in this job: the provider "
            f"sets {V2_ENABLED_ENV}=0 for it; do not set it otherwise in the job's runtime_env."
        )
    if lacking := missing(api):
        raise RayIncompatibleError(
            f"Ray {version} lacks what trainer_api={api!r} uses: {'; '.join(lacking)}. "
            + (
                "Run the cluster on a tested Ray minor (docs/compatibility.md)"
                if warnings
                else "This Ray installation looks incomplete: reinstall ray[default,train]"
            )
            + (", or use trainer_api='legacy'." if api == TrainerApi.V2.value else ".")
        )
    if without := fallbacks(api, elastic):
        warnings.append(f"Ray {version}: " + "; ".join(without) + ".")
    return Choice(api, why, tuple(warnings))


# --- what the runtime uses --------------------------------------------------------------------------


def controller_callback_base() -> type:
    """Ray Train V2's base class of controller callbacks."""
    return importlib.import_module(V2_CALLBACKS).ControllerCallback


def worker_callback_base() -> type:
    """Ray Train V2's base class of worker callbacks (run in each worker; ``before_worker_shutdown`` runs
    when Ray Train stops the workers, before it kills them)."""
    return importlib.import_module(V2_CALLBACKS).WorkerCallback


def controller_change(state: Any) -> str | None:
    """Why the controller leaves a running worker group in ``state``: "resize", "restart", "preempt", or None."""
    return CHANGE_OF_STATE.get(type(state).__name__)


def default_failure_policy(failure_config: Any) -> Any:
    """Ray Train V2's own failure policy for ``failure_config``."""
    return importlib.import_module(V2_FAILURE_HANDLING).create_failure_policy(failure_config)


def failure_decision_raise() -> Any:
    """The failure decision that ends the run (V2's ``FailureDecision.RAISE``)."""
    return importlib.import_module(V2_FAILURE_HANDLING).FailureDecision.RAISE


def with_controller_args(trainer: Any, make: Callable[[dict], dict]) -> Any:
    """The V2 trainer, its controller built with ``make(kwargs)`` added to the arguments Ray gives it
    (a failure policy, a scaling policy): V2 has no public way to pass them."""
    start = trainer._initialize_and_run_controller

    def started(**kwargs: Any) -> Any:
        return start(**{**kwargs, **make(kwargs)})

    trainer._initialize_and_run_controller = started
    return trainer


def set_initial_checkpoint(checkpoint: Any) -> None:
    """In a V2 worker: ``ray.train.get_checkpoint()`` returns ``checkpoint`` until the run has one of its own."""
    context = importlib.import_module(V2_CONTEXT).get_train_context()
    if context.checkpoint is None:
        context.checkpoint = checkpoint


def startup_timed_out(err: BaseException | None) -> bool:
    """Train V2 gave up waiting for its workers' resources (``WorkerGroupStartupTimeoutError``), in the
    error, its controller failure, or among its causes."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        failure = getattr(err, "controller_failure", None)
        if type(err).__name__ == "WorkerGroupStartupTimeoutError" or startup_timed_out(failure):
            return True
        err = err.__cause__ or err.__context__
    return False


class NoDatasets:
    """Stands for Ray Train's dataset shard provider in the workers of a run given no datasets: asking
    for a shard fails as with Ray's own provider, saying why."""

    def get_dataset_shard(self, dataset_info: Any) -> Any:
        raise KeyError(
            f"Dataset shard for {dataset_info.dataset_name!r} not found: the training was given no datasets. "
            "Pass them with the operator's `datasets`."
        )


@functools.cache
def _no_datasets_callback_class() -> type:
    base = _attr(*WORKER_GROUP_CALLBACK)

    class NoDatasetsCallback(base):  # type: ignore[misc, valid-type]
        """V2's datasets callback for a run without datasets, without its DatasetManager actor."""

        def before_init_train_context(self, workers: Any) -> dict:
            return {"dataset_shard_provider": [NoDatasets()] * len(workers)}

    return NoDatasetsCallback


def lean_callbacks(callbacks: list, *, has_datasets: bool) -> list:
    """V2's callbacks without the actors a provider job does not use, each one more process to start (seconds
    of CPU for its imports). The placement-group cleaner, a detached actor per run, removes the workers'
    placement group should the controller die while the driver lives on (a notebook); a provider job's driver
    ends when ``fit()`` does, and Ray removes a job's placement groups with the job; the controller also waits
    for the cleaner after the workers start and at the end. The datasets callback starts a DatasetManager
    actor whether or not the run has datasets. A Ray without these callbacks keeps what it has."""
    cleaner, datasets = _attr(*PLACEMENT_GROUP_CLEANER), _attr(*DATASETS_CALLBACK)
    no_datasets = datasets is not None and not has_datasets
    return [
        _no_datasets_callback_class()() if no_datasets and isinstance(c, datasets) else c
        for c in callbacks
        if cleaner is None or not isinstance(c, cleaner)
    ]


def worker_setup_hook_env(hook: str) -> dict[str, str]:
    """The variables that have Ray run ``hook`` (an import path) as each worker process of a runtime env starts,
    as Ray sets them for a job's ``worker_process_setup_hook``; {} when the job has a hook of its own (kept)."""
    from ray._private import ray_constants
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    job = json.loads(os.environ.get(RAY_JOB_CONFIG_JSON_ENV_VAR) or "{}").get("runtime_env") or {}
    name = ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR
    return {} if "worker_process_setup_hook" in job or name in os.environ else {name: hook}
