"""HorovodTrainOperator: Horovod training on a Ray cluster, from one Airflow task."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_horovod.operators.ray import BaseRayJobOperator, Started

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_horovod.hooks.ray import RayHook
    from airflow_provider_horovod.ids import TaskRun
    from airflow_provider_horovod.jobs.protocol import JobEvent
    from airflow_provider_horovod.jobs.request import JobRequest
    from airflow_provider_horovod.spec import TrainingSpec


@dataclasses.dataclass(frozen=True)
class Training:
    """The checked input of one task run: the spec (its attempt still to be chosen), the files that
    travel with it and the user's runtime_env."""

    spec: TrainingSpec
    files: dict[str, bytes]
    runtime_env: dict


class HorovodTrainOperator(BaseRayJobOperator):
    """Train with Horovod on a Ray cluster (Ray Train), and push the verified checkpoint URI to XCom.

    One task run is one training job: its submission id comes from the dag id, task id, run id and
    map index, so a retry or a restarted worker re-attaches to a running job, reuses a succeeded one
    and, after a failed or stopped one, submits the next attempt, resuming from its last checkpoint.

    :param train_fn: the function every worker runs: a callable (shipped with cloudpickle; code in
        DAG files travels by value) or an import path ``"package.module:function"``. It takes no
        argument or one (``config``). Written for Ray's ``HorovodTrainer``, it runs unchanged.
    :param train_loop_config: dict passed to ``train_fn`` as ``config`` (templated).
    :param datasets: dict name -> URI of parquet/csv/json files (templated; read with Ray Data on
        the cluster), or a function run on the cluster returning a ``ray.data.Dataset`` (a callable,
        or an import path). ``"train"`` is sharded across workers.
    :param num_workers: number of Horovod workers (ranks).
    :param use_gpu: one GPU per worker.
    :param resources_per_worker: Ray resources per worker, e.g. ``{"CPU": 2, "GPU": 1}``.
    :param checkpoint_num_to_keep: checkpoints kept per attempt (None: all).
    :param checkpoint_score_attribute: metric that ranks checkpoints (None: the latest is best).
    :param checkpoint_score_order: ``"max"`` or ``"min"``.
    :param max_failures: worker-failure retries inside one job (-1: without limit).
    :param horovod_timeout_s: Horovod rendezvous timeout.
    :param horovod_nics: network interfaces Horovod may use.
    :param horovod_env: ``HOROVOD_*`` tuning variables (fusion threshold, cycle time, autotune),
        set in every worker (templated).
    :param runtime_env: extra Ray runtime env (pip, working_dir, env_vars), merged over the
        connection's default (templated). No secrets: Ray shows it to every dashboard reader.
    :param trainer_api: ``"v2"`` (default): Ray Train V2's ``DataParallelTrainer`` with the
        provider's own Horovod backend; ``"legacy"``: Ray's own ``HorovodTrainer`` (Train V1, run
        with ``RAY_TRAIN_V2_ENABLED=0``; Ray plans to remove it). The same training function runs
        on both, with the same result.
    :param forward_aws_credentials: give the job short-lived AWS session credentials (STS
        ``GetSessionToken`` through ``aws_conn_id``) for its S3 storage and datasets, for clusters
        without S3 access of their own. Off by default; the long-lived keys never leave Airflow, and
        the session credentials travel with the job's code, not in its ``runtime_env``.
    :param aws_credentials_ttl_seconds: how long forwarded credentials stay valid (900 to 129600);
        longer than the training may run.
    :param check_cluster_resources: fail before submitting when the cluster has none of a resource
        the workers ask for. Turn off for autoscaling clusters that add such nodes on demand.
    :param horovod_timeline: record Horovod's timeline on rank 0 (Chrome-tracing JSON, as
        ``HOROVOD_TIMELINE`` does) and store it next to the attempt's checkpoints; its URI is in XCom as
        ``timeline_uri``. Off by default: it slows training markedly.
    :param materialize_datasets: read the datasets into Ray's object store before the workers start
        (default). A training waiting for its workers then holds none of the CPUs its reads need, so
        trainings queued on a busy cluster run one after another instead of starving each other.
        False: stream them while the workers train, for datasets bigger than the object store (give
        Ray Data CPUs of its own then: a cluster whose CPUs all go to workers cannot read).
    :param storage_path, aws_conn_id, ray_conn_id, deferrable, wait_for_completion, poll_interval_seconds,
        pending_timeout_seconds, stall_timeout_seconds: see
        :class:`~airflow_provider_horovod.operators.ray.BaseRayJobOperator`
        (``storage_path`` holds the checkpoints and the result record).
    """

    template_fields: Sequence[str] = (
        "train_loop_config",
        "datasets",
        "storage_path",
        "horovod_env",
        "runtime_env",
        "ray_conn_id",
        "aws_conn_id",
    )
    template_fields_renderers = {"train_loop_config": "json", "runtime_env": "json", "horovod_env": "json"}
    ui_color = "#e6f1f2"

    def __init__(
        self,
        *,
        train_fn: Callable | str,
        train_loop_config: dict | None = None,
        datasets: dict[str, Any] | None = None,
        num_workers: int = 2,
        use_gpu: bool = False,
        resources_per_worker: dict[str, float] | None = None,
        checkpoint_num_to_keep: int | None = None,
        checkpoint_score_attribute: str | None = None,
        checkpoint_score_order: str = "max",
        max_failures: int = 0,
        horovod_timeout_s: int = 30,
        horovod_nics: list[str] | None = None,
        horovod_env: dict[str, str] | None = None,
        runtime_env: dict | None = None,
        trainer_api: str = "v2",
        forward_aws_credentials: bool = False,
        aws_credentials_ttl_seconds: int = 12 * 3600,
        check_cluster_resources: bool = True,
        materialize_datasets: bool = True,
        horovod_timeline: bool = False,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.train_fn = train_fn
        self.train_loop_config = train_loop_config
        self.datasets = datasets
        self.num_workers = num_workers
        self.use_gpu = use_gpu
        self.resources_per_worker = resources_per_worker
        self.checkpoint_num_to_keep = checkpoint_num_to_keep
        self.checkpoint_score_attribute = checkpoint_score_attribute
        self.checkpoint_score_order = checkpoint_score_order
        self.max_failures = max_failures
        self.horovod_timeout_s = horovod_timeout_s
        self.horovod_nics = horovod_nics
        self.horovod_env = horovod_env
        self.runtime_env = runtime_env
        self.trainer_api = trainer_api
        self.forward_aws_credentials = forward_aws_credentials
        self.aws_credentials_ttl_seconds = aws_credentials_ttl_seconds
        self.check_cluster_resources = check_cluster_resources
        self.materialize_datasets = materialize_datasets
        self.horovod_timeline = horovod_timeline

    # --- building the job: pure, and checked before anything is submitted ---------------------

    def train_call(self) -> tuple[Any, Any] | None:
        """The arguments every worker calls ``train_fn`` with (``@task.horovod``); None: Ray Train's
        ``train_fn(config)`` with ``train_loop_config``."""
        return None

    def check(self, task_run: TaskRun) -> Training:
        """Every parameter checked into a spec for attempt 1, with the files that travel with it."""
        from airflow_provider_horovod import checks
        from airflow_provider_horovod.functions import ship_function
        from airflow_provider_horovod.jobs.request import python_version
        from airflow_provider_horovod.spec import TRAINER_APIS, TrainingSpec

        self.check_wait_parameters()
        use_gpu = checks.check_bool("use_gpu", self.use_gpu)
        runtime_env = checks.check_runtime_env(self.runtime_env)
        code_ships = any(runtime_env.get(k) for k in ("working_dir", "py_modules", "pip", "conda", "uv"))
        call = self.train_call()
        train_fn, fn_files = ship_function("train_fn", self.train_fn, "train_fn.pkl", code_ships=code_ships,
                                           max_args=None if call else 1,
                                           arity_fix="it must take no argument or one (`config`, from train_loop_config).")
        datasets, ds_files = checks.check_datasets(self.datasets, code_ships=code_ships)
        checks.check_forwarding(self.forward_aws_credentials, self.aws_conn_id, self.aws_credentials_ttl_seconds)
        storage_uri = self.check_storage(task_run)
        checks.check_bool("check_cluster_resources", self.check_cluster_resources)
        spec = TrainingSpec(
            submission_id=task_run.submission_id(1),
            train_fn=train_fn,
            storage_uri=storage_uri,
            train_loop_config=checks.check_json("train_loop_config", self.train_loop_config),
            datasets=datasets,
            num_workers=checks.check_num_workers(self.num_workers),
            use_gpu=use_gpu,
            resources_per_worker=checks.check_resources(self.resources_per_worker, use_gpu),
            trainer_api=checks.check_choice("trainer_api", self.trainer_api, TRAINER_APIS),
            checkpoint_num_to_keep=checks.check_positive(
                "checkpoint_num_to_keep", self.checkpoint_num_to_keep, allow_none=True, integer=True),
            checkpoint_score_attribute=self.checkpoint_score_attribute,
            checkpoint_score_order=checks.check_choice("checkpoint_score_order", self.checkpoint_score_order,
                                                       ("max", "min")),
            max_failures=checks.check_max_failures(self.max_failures),
            horovod_timeout_s=checks.check_positive("horovod_timeout_s", self.horovod_timeout_s, integer=True),
            horovod_nics=checks.check_nics(self.horovod_nics),
            horovod_env=checks.check_horovod_env(self.horovod_env),
            pending_timeout_s=self.pending_timeout_seconds,
            python_version=python_version(),
            materialize_datasets=checks.check_bool("materialize_datasets", self.materialize_datasets),
            horovod_timeline=checks.check_bool("horovod_timeline", self.horovod_timeline),
            train_args=checks.check_args("op_args", call[0]) if call else None,
            train_kwargs=checks.check_json("op_kwargs", call[1]) if call else None,
        )
        return Training(spec, {**fn_files, **ds_files}, runtime_env)

    def request(self, training: Training, task_run: TaskRun, attempt: int, resume: bool,
                extra_files: dict[str, bytes] | None = None) -> JobRequest:
        """The Ray request of one attempt (pure)."""
        from airflow_provider_horovod.jobs.request import training_request
        from airflow_provider_horovod.spec import attempt_dir

        spec = dataclasses.replace(
            training.spec, submission_id=task_run.submission_id(attempt), attempt=attempt,
            resume_from=[attempt_dir(training.spec.storage_uri, n) for n in range(attempt - 1, 0, -1)] if resume else [])
        return training_request(spec, {**training.files, **(extra_files or {})}, training.runtime_env, task_run)

    # --- execution ------------------------------------------------------------------------------

    def start(self, context: Context, hook: RayHook) -> Started:
        from airflow_provider_horovod.ids import TaskRun
        from airflow_provider_horovod.jobs.submit import consumed_in, find_or_submit

        task_run = TaskRun.of(context["ti"])
        training = self.check(task_run)
        self.check_storage_reachable(hook, training.spec.storage_uri)
        storage = self.storage

        def make_request(attempt) -> JobRequest:
            self.check_resources(hook, training.spec)
            storage.check_bucket(training.spec.storage_uri)
            return self.request(training, task_run, attempt.number, attempt.resume, self.forwarded_credentials())

        attempt = find_or_submit(hook, task_run, make_request, consumed=consumed_in(storage, training.spec.storage_uri),
                                 logger=self.log)
        return Started(attempt.submission_id, attempt.number, training.spec.storage_uri)

    def complete(self, context: Context, event: JobEvent) -> dict:
        from airflow_provider_horovod.jobs.finish import finish, push_result

        result = finish(event, dashboard_url=self.hook.get_job_url(event.submission_id), storage=self.storage,
                        try_number=getattr(context["ti"], "try_number", None))
        self.log.info("Checkpoint: %s  metrics: %s", result["checkpoint_uri"], result["metrics"])
        return push_result(context, result)

    def check_resources(self, hook: RayHook, spec: TrainingSpec) -> None:
        import json

        from airflow_provider_horovod.exceptions import RayJobPendingTimeoutError

        if not self.check_cluster_resources:
            return
        asked, cluster = spec.total_resources(), hook.get_cluster_resources()
        if missing := sorted(name for name in asked if cluster.get(name, 0.0) <= 0.0):
            raise RayJobPendingTimeoutError(
                f"The workers ask for {json.dumps(asked, sort_keys=True)} but the cluster has none of {missing} (it "
                f"has {json.dumps(cluster, sort_keys=True)}). Use use_gpu=False or a cluster with such nodes; for an "
                "autoscaling cluster set check_cluster_resources=False.", status="NOT_SUBMITTED")

    def forwarded_credentials(self) -> dict[str, bytes]:
        """The payload file of forwarded AWS session credentials, when asked for."""
        if not self.forward_aws_credentials:
            return {}
        import json

        from airflow_provider_horovod.credentials import SESSION_FILE, session_credentials

        session = session_credentials(self.aws_conn_id, self.aws_credentials_ttl_seconds)
        self.log.info("Forwarding AWS session credentials of connection %r, valid until %s.", self.aws_conn_id,
                      session["expiration"])
        return {SESSION_FILE: json.dumps(session).encode()}

