"""HorovodTrainOperator: Horovod training on a Ray cluster, from one Airflow task."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_horovod.contract import (
    ELASTIC_RESIZE_MONITOR_INTERVAL_S,
    HOROVOD_TIMEOUT_S,
    NUM_WORKERS,
    TrainerApi,
)
from airflow_provider_horovod.links.mlflow import MlflowRunLink
from airflow_provider_horovod.operators.ray import BaseRayJobOperator

if TYPE_CHECKING:
    from airflow.sdk import BaseOperatorLink, Context

    from airflow_provider_horovod.contract import TaskRun
    from airflow_provider_horovod.jobs.wait import WaitPolicy
    from airflow_provider_horovod.plan import JobPlan


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
    :param num_workers: number of Horovod workers (ranks); or an elastic range ``(min, max)`` (a
        two-element list from JSON params or a template means the same; Train V2 only): the run starts
        once ``min`` workers fit, grows toward ``max`` as room appears, and after a lost node restarts
        Horovod at the new size from the last reported checkpoint (a lost node counts against
        ``max_failures``; preempted ones do not). The resource check and ``pending_timeout_seconds``
        count ``min`` (templated).
    :param elastic_resize_monitor_interval_s: an elastic run looks for room to grow this often (Ray
        Train's ``ScalingConfig(elastic_resize_monitor_interval_s)``); each resize restarts the workers.
    :param use_gpu: one GPU per worker.
    :param resources_per_worker: Ray resources per worker, e.g. ``{"CPU": 2, "GPU": 1}``.
    :param checkpoint_num_to_keep: checkpoints kept per attempt (None: all).
    :param checkpoint_score_attribute: metric that ranks checkpoints (None: the latest is best).
    :param checkpoint_score_order: ``"max"`` or ``"min"``.
    :param max_failures: worker-failure retries inside one job (-1: without limit).
    :param horovod_timeout_s: Horovod rendezvous timeout.
    :param horovod_nics: candidate network interface names, in order of preference: each node uses
        the first of them it has for Gloo (and all it has for NCCL), so names may differ between hosts.
        Default: the interface of the address Ray uses for the node (docs/multi-node.md). With
        ``trainer_api="legacy"``, the first name only, on every host.
    :param horovod_env: ``HOROVOD_*`` tuning variables (fusion threshold, cycle time, autotune),
        set in every worker (templated).
    :param runtime_env: extra Ray runtime env (pip, working_dir, env_vars), merged over the
        connection's default (templated). No secrets: Ray shows it to every dashboard reader.
    :param trainer_api: ``"auto"`` (default): the job chooses on the cluster, Train V2 where the
        cluster's Ray runs it (its default from Ray 2.51, and needed for elastic ``num_workers``), Ray's
        own ``HorovodTrainer`` where not; the task log, the result record and XCom's ``trainer_api`` say
        which ran. ``"v2"``: Ray Train V2's ``DataParallelTrainer`` with the provider's own Horovod
        backend; ``"legacy"``: Ray's own ``HorovodTrainer`` (Train V1, run with
        ``RAY_TRAIN_V2_ENABLED=0``; Ray plans to remove it). The same training function runs on both,
        with the same result (docs/compatibility.md: which Ray minor runs which).
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
    :param mlflow_tracking_uri: log the training to an MLflow tracking server that the Ray cluster
        reaches (``http(s)://host:port``, or ``databricks``), from rank 0: the parameters
        (``train_loop_config`` or the ``@task.horovod`` call's, world size, trainer), every
        ``ray.train.report``'s metrics at its step, the checkpoint URI and the Airflow identifiers as
        tags. A retry's next attempt goes on with the same run. The cluster needs ``mlflow-skinny``
        (the ``[mlflow]`` extra); Airflow needs nothing of MLflow. None (default): no tracking
        (templated).
    :param mlflow_conn_id: instead of ``mlflow_tracking_uri``, a connection whose host is the tracking
        URI (or a host name with ``port`` and ``schema`` ``http``/``https``); its ``login`` and
        ``password`` (basic auth), or a ``password`` alone (a token), reach the job with its code,
        never in its ``runtime_env`` (templated).
    :param mlflow_experiment_name: the MLflow experiment (created when missing); default: the DAG's
        id (templated).
    :param storage_path, aws_conn_id, ray_conn_id, deferrable, wait_for_completion, poll_interval_seconds,
        pending_timeout_seconds, stall_timeout_seconds, retry_on_user_error, job_tags, prices: see
        :class:`~airflow_provider_horovod.operators.ray.BaseRayJobOperator`
        (``storage_path`` holds the checkpoints and the result record).
    """

    template_fields: Sequence[str] = (
        "num_workers",
        "train_loop_config",
        "datasets",
        "storage_path",
        "horovod_env",
        "runtime_env",
        "ray_conn_id",
        "aws_conn_id",
        "job_tags",
        "mlflow_tracking_uri",
        "mlflow_conn_id",
        "mlflow_experiment_name",
    )
    template_fields_renderers = {"train_loop_config": "json", "runtime_env": "json", "horovod_env": "json"}
    ui_color = "#e6f1f2"
    operator_extra_links: tuple[BaseOperatorLink, ...] = (*BaseRayJobOperator.operator_extra_links, MlflowRunLink())

    def __init__(
        self,
        *,
        train_fn: Callable | str,
        train_loop_config: dict | None = None,
        datasets: dict[str, Any] | None = None,
        num_workers: int | Sequence[int] | str = NUM_WORKERS,
        elastic_resize_monitor_interval_s: float = ELASTIC_RESIZE_MONITOR_INTERVAL_S,
        use_gpu: bool = False,
        resources_per_worker: dict[str, float] | None = None,
        checkpoint_num_to_keep: int | None = None,
        checkpoint_score_attribute: str | None = None,
        checkpoint_score_order: str = "max",
        max_failures: int = 0,
        horovod_timeout_s: int = HOROVOD_TIMEOUT_S,
        horovod_nics: list[str] | None = None,
        horovod_env: dict[str, str] | None = None,
        runtime_env: dict | None = None,
        trainer_api: str = TrainerApi.AUTO.value,
        forward_aws_credentials: bool = False,
        aws_credentials_ttl_seconds: int = 12 * 3600,
        check_cluster_resources: bool = True,
        materialize_datasets: bool = True,
        horovod_timeline: bool = False,
        mlflow_tracking_uri: str | None = None,
        mlflow_conn_id: str | None = None,
        mlflow_experiment_name: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.train_fn = train_fn
        self.train_loop_config = train_loop_config
        self.datasets = datasets
        self.num_workers = num_workers
        self.elastic_resize_monitor_interval_s = elastic_resize_monitor_interval_s
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
        self.mlflow_tracking_uri = mlflow_tracking_uri
        self.mlflow_conn_id = mlflow_conn_id
        self.mlflow_experiment_name = mlflow_experiment_name
        # The "MLflow run" link reads it; the try number is one of the run's tags.
        self.mlflow_run_url: str | None = None
        self._try_number: int | None = None

    def train_call(self) -> tuple[Any, Any] | None:
        """The arguments every worker calls ``train_fn`` with (``@task.horovod``); None: Ray Train's
        ``train_fn(config)`` with ``train_loop_config``."""
        return None

    def execute(self, context: Context) -> Any:
        self._try_number = getattr(context["ti"], "try_number", None)
        return super().execute(context)

    def mlflow_target(self) -> tuple[str | None, dict[str, str]]:
        """(tracking URI, credentials): ``mlflow_tracking_uri`` as given, or the MLflow connection's."""
        from airflow_provider_horovod.checks import check_mlflow, mlflow_connection

        check_mlflow(self.mlflow_tracking_uri, self.mlflow_conn_id)
        if not self.mlflow_conn_id:
            return self.mlflow_tracking_uri, {}
        from airflow.sdk import BaseHook

        return mlflow_connection(self.mlflow_conn_id, BaseHook.get_connection(self.mlflow_conn_id))

    def plan(self, task_run: TaskRun, policy: WaitPolicy) -> JobPlan:
        from airflow_provider_horovod.plan import training_plan

        tracking_uri, tracking_auth = self.mlflow_target()
        return training_plan(
            task_run,
            train_fn=self.train_fn,
            train_call=self.train_call(),
            train_loop_config=self.train_loop_config,
            datasets=self.datasets,
            num_workers=self.num_workers,
            use_gpu=self.use_gpu,
            elastic_resize_monitor_interval_s=self.elastic_resize_monitor_interval_s,
            resources_per_worker=self.resources_per_worker,
            checkpoint_num_to_keep=self.checkpoint_num_to_keep,
            checkpoint_score_attribute=self.checkpoint_score_attribute,
            checkpoint_score_order=self.checkpoint_score_order,
            max_failures=self.max_failures,
            horovod_timeout_s=self.horovod_timeout_s,
            horovod_nics=self.horovod_nics,
            horovod_env=self.horovod_env,
            runtime_env=self.runtime_env,
            trainer_api=self.trainer_api,
            forward_aws_credentials=self.forward_aws_credentials,
            aws_conn_id=self.aws_conn_id,
            aws_credentials_ttl_seconds=self.aws_credentials_ttl_seconds,
            check_cluster_resources=self.check_cluster_resources,
            materialize_datasets=self.materialize_datasets,
            horovod_timeline=self.horovod_timeline,
            storage_path=self.storage_path,
            pending_timeout_s=policy.pending_timeout_s,
            ray_conn_id=self.ray_conn_id,
            retry_on_user_error=self.retry_on_user_error,
            job_tags=self.job_tags,
            prices=self.prices,
            mlflow_tracking_uri=tracking_uri,
            mlflow_experiment_name=self.mlflow_experiment_name,
            mlflow_auth=tracking_auth,
            try_number=self._try_number,
        )

    def task_result(self, context: Context, result: dict[str, Any]) -> dict[str, Any]:
        from airflow_provider_horovod.cost import summary
        from airflow_provider_horovod.jobs.finish import push_result

        self.log.info("Checkpoint: %s  metrics: %s", result["checkpoint_uri"], result["metrics"])
        self.mlflow_run_url = (result.get("mlflow") or {}).get("run_url")
        if self.mlflow_run_url:
            self.log.info("MLflow run: %s", self.mlflow_run_url)
        if result.get("cost"):
            self.log.info("%s", summary(result["cost"]))
        return push_result(context, result)

    def lineage(self, result: dict[str, Any] | None) -> Any:
        from airflow_provider_horovod.lineage import training_lineage

        call = self.train_call()
        config = self.train_loop_config
        if call is not None:  # @task.horovod: train(lr=0.1) or train({"lr": 0.1})
            args, kwargs = call
            config = kwargs or (args[0] if len(args or []) == 1 and isinstance(args[0], dict) else None)
        return training_lineage(
            datasets_param=self.datasets,
            inlets=self.inlets,
            outlets=self.outlets,
            num_workers=self.num_workers,
            trainer_api=self.trainer_api,
            train_fn=self.train_fn,
            train_loop_config=config,
            submission_id=self.submission_id,
            result=result,
        )
