"""HorovodTrainOperator: Horovod training on a Ray cluster, from one Airflow task."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from airflow_provider_horovod import checks
from airflow_provider_horovod.contract import (
    ELASTIC_RESIZE_MONITOR_INTERVAL_S,
    HOROVOD_TIMEOUT_S,
    NUM_WORKERS,
    TrainerApi,
)
from airflow_provider_horovod.links.mlflow import MlflowRunLink
from airflow_provider_horovod.operators.base import BaseRayJobOperator
from airflow_provider_horovod.parameters import Declaration, Param
from airflow_provider_horovod.script_checks import check_script_args

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
    It takes the shared parameters of ``BaseRayJobOperator`` too (``storage_path`` holds the
    checkpoints and the result record). ``@task.horovod`` takes the same parameters.
    """

    ui_color = "#e6f1f2"
    operator_extra_links: tuple[BaseOperatorLink, ...] = (*BaseRayJobOperator.operator_extra_links, MlflowRunLink())

    def __init__(
        self,
        *,
        train_fn: Annotated[
            Callable[..., Any] | str | None,
            Param(
                "The function every worker runs: a callable (shipped with cloudpickle; code in DAG files "
                'travels by value) or an import path `"package.module:function"`. It takes no argument or one '
                "(`config`). Written for Ray's `HorovodTrainer`, it runs unchanged. Give it or `train_script`."
            ),
        ] = None,
        train_script: Annotated[
            str | None,
            Param(
                "A Horovod script every worker runs unchanged as `__main__`, as `horovodrun` would: a `.py` file "
                "(relative to the DAG file's folder, which travels with the job) or `-m package.module` "
                '(docs/migrating.md, "From horovodrun").',
                templated=True,
            ),
        ] = None,
        script_args: Annotated[
            list[str] | None,
            Param(
                "The script's arguments (its `sys.argv[1:]`), strings; `$AHP_CHECKPOINT_DIR` names the folder "
                "whose files rank 0 leaves are the checkpoint.",
                templated=True,
                check=check_script_args,
            ),
        ] = None,
        train_loop_config: Annotated[
            dict[str, Any] | None,
            Param("Dict passed to `train_fn` as `config`.", templated=True, renderer="json", check=checks.check_json),
        ] = None,
        datasets: Annotated[
            dict[str, Any] | None,
            Param(
                "Dict name -> URI of parquet/csv/json files (read with Ray Data on the cluster), or a function "
                "returning a `ray.data.Dataset` (a callable, or an import path). `train` is sharded across the "
                "workers (docs/tasks.md).",
                templated=True,
            ),
        ] = None,
        num_workers: Annotated[
            int | Sequence[int] | str,
            Param(
                "Number of Horovod workers (ranks); or an elastic range `(min, max)` (Train V2 only): the run "
                "starts with `min`, grows toward `max` as room appears and shrinks when a node is lost "
                "(docs/multi-node.md, Elastic training).",
                templated=True,
            ),
        ] = NUM_WORKERS,
        elastic_resize_monitor_interval_s: Annotated[
            float,
            Param(
                "An elastic run looks for room to grow this often (Ray Train's "
                "`ScalingConfig(elastic_resize_monitor_interval_s)`); each resize restarts the workers.",
                check=checks.check_positive,
            ),
        ] = ELASTIC_RESIZE_MONITOR_INTERVAL_S,
        use_gpu: Annotated[bool, Param("One GPU per worker.", check=checks.check_bool)] = False,
        resources_per_worker: Annotated[
            dict[str, float] | None, Param('Ray resources per worker, e.g. `{"CPU": 2, "GPU": 1}`.')
        ] = None,
        checkpoint_num_to_keep: Annotated[
            int | None,
            Param(
                "Checkpoints kept per attempt (None: all).",
                check=functools.partial(checks.check_positive, allow_none=True, integer=True),
            ),
        ] = None,
        checkpoint_score_attribute: Annotated[
            str | None, Param("Metric that ranks checkpoints (None: the latest is best).", check=checks.check_name)
        ] = None,
        checkpoint_score_order: Annotated[
            str, Param("`max` or `min`.", check=functools.partial(checks.check_choice, choices=("max", "min")))
        ] = "max",
        max_failures: Annotated[
            int,
            Param("Worker-failure retries inside one job (-1: without limit).", check=checks.check_max_failures),
        ] = 0,
        horovod_timeout_s: Annotated[
            int,
            Param(
                "Horovod's Gloo rendezvous and collective timeout, in seconds (a lost node's ranks fail after it).",
                check=functools.partial(checks.check_positive, integer=True),
            ),
        ] = HOROVOD_TIMEOUT_S,
        horovod_nics: Annotated[
            list[str] | None,
            Param(
                "Candidate network interface names, in order of preference: each node uses the first it has "
                "for Gloo (all it has for NCCL). None: the interface of the address Ray uses for the node "
                "(docs/multi-node.md).",
                check=checks.check_nics,
            ),
        ] = None,
        horovod_env: Annotated[
            dict[str, str] | None,
            Param(
                "`HOROVOD_*` tuning variables (fusion threshold, cycle time, autotune), set in every worker.",
                templated=True,
                renderer="json",
                check=checks.check_horovod_env,
            ),
        ] = None,
        trainer_api: Annotated[
            str,
            Param(
                "`auto` (Train V2 where the cluster's Ray runs it, else Ray's own `HorovodTrainer`), `v2` "
                "(Ray Train V2 with the provider's Horovod backend) or `legacy` (Train V1); XCom's "
                "`trainer_api` says which ran (docs/tasks.md, Ray Train V2 or legacy).",
                check=functools.partial(checks.check_choice, choices=tuple(api.value for api in TrainerApi)),
            ),
        ] = TrainerApi.AUTO.value,
        forward_aws_credentials: Annotated[
            bool,
            Param(
                "Give the job short-lived AWS session credentials (STS through `aws_conn_id`) for S3, for "
                "clusters without S3 access of their own; the long-lived keys never leave Airflow "
                "(docs/storage.md)."
            ),
        ] = False,
        aws_credentials_ttl_seconds: Annotated[
            int,
            Param("How long forwarded credentials stay valid (900 to 129600); longer than the training may run."),
        ] = 12 * 3600,
        check_cluster_resources: Annotated[
            bool,
            Param(
                "Fail before submitting when the cluster has none of a resource the workers ask for. Turn off "
                "for autoscaling clusters that add such nodes on demand.",
                check=checks.check_bool,
            ),
        ] = True,
        materialize_datasets: Annotated[
            bool,
            Param(
                "Read the datasets into Ray's object store before the workers start, so queued trainings do "
                "not starve each other's reads. False: stream them while the workers train, for datasets "
                "bigger than the object store (docs/reliability.md).",
                check=checks.check_bool,
            ),
        ] = True,
        horovod_timeline: Annotated[
            bool,
            Param(
                "Record Horovod's timeline on rank 0 (Chrome-tracing JSON) next to the attempt's checkpoints; "
                "its URI is XCom's `timeline_uri`. It slows training.",
                check=checks.check_bool,
            ),
        ] = False,
        mlflow_tracking_uri: Annotated[
            str | None,
            Param(
                "Log the training from rank 0 to an MLflow tracking server the Ray cluster reaches "
                "(`http(s)://host:port` or `databricks`): parameters, every report's metrics, the checkpoint "
                "(docs/tracking.md). None: no tracking.",
                templated=True,
            ),
        ] = None,
        mlflow_conn_id: Annotated[
            str | None,
            Param(
                "Instead of `mlflow_tracking_uri`, a connection whose host is the tracking URI; its `login` "
                "and `password` (or a token as `password`) reach the job with its code, never in its "
                "`runtime_env`.",
                templated=True,
            ),
        ] = None,
        mlflow_experiment_name: Annotated[
            str | None,
            Param("The MLflow experiment (created when missing); None: the DAG's id.", templated=True),
        ] = None,
        smoke_rows: Annotated[
            int | None,
            Param(
                "Rows a smoke run reads of each dataset; None: `[horovod] smoke_rows` (default 64).",
                check=functools.partial(checks.check_positive, allow_none=True, integer=True),
            ),
        ] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.parameters.store(self, locals())
        # The "MLflow run" link reads it.
        self.mlflow_run_url: str | None = None

    parameters: ClassVar[Declaration] = Declaration.of(__init__, base=BaseRayJobOperator.parameters)
    template_fields: Sequence[str] = parameters.template_fields
    template_fields_renderers = parameters.template_fields_renderers
    __doc__ = parameters.docstring(__doc__)

    def train_call(self) -> tuple[Any, Any] | None:
        """The arguments every worker calls ``train_fn`` with (``@task.horovod``); None: Ray Train's
        ``train_fn(config)`` with ``train_loop_config``."""
        return None

    def dag_folder(self) -> str | None:
        """Where a relative ``train_script`` is found: the DAG file's folder."""
        import os

        fileloc = getattr(getattr(self, "dag", None), "fileloc", None) if self.has_dag() else None
        return os.path.dirname(os.path.abspath(fileloc)) if fileloc else None

    def mlflow_target(self) -> tuple[str | None, dict[str, str]]:
        """(tracking URI, credentials): ``mlflow_tracking_uri`` as given, or the MLflow connection's."""
        from airflow_provider_horovod.mlflow_checks import check_mlflow, mlflow_connection

        check_mlflow(self.mlflow_tracking_uri, self.mlflow_conn_id)
        if not self.mlflow_conn_id:
            return self.mlflow_tracking_uri, {}
        from airflow.sdk import BaseHook

        return mlflow_connection(self.mlflow_conn_id, BaseHook.get_connection(self.mlflow_conn_id))

    def plan(self, task_run: TaskRun, policy: WaitPolicy, given: dict[str, Any], *, try_number: int | None) -> JobPlan:
        from airflow_provider_horovod.plan import training_plan

        tracking_uri, tracking_auth = self.mlflow_target()
        return training_plan(
            task_run,
            given,
            train_call=self.train_call(),
            dag_folder=self.dag_folder(),
            pending_timeout_s=policy.pending_timeout_s,
            mlflow_tracking_uri=tracking_uri,
            mlflow_auth=tracking_auth,
            try_number=try_number,
        )

    def task_result(self, context: Context, result: dict[str, Any]) -> dict[str, Any]:
        from airflow_provider_horovod.cost import summary

        if result["checkpoint_uri"] is None:  # only a script may end so (jobs.finish.missing_checkpoint)
            self.log.info("The script left no checkpoint (XCom checkpoint_uri: None).  metrics: %s", result["metrics"])
        else:
            self.log.info("Checkpoint: %s  metrics: %s", result["checkpoint_uri"], result["metrics"])
        if result.get("smoke_run"):
            self.log.info("Smoke run: the checkpoint is real, the model is not one to promote (XCom smoke_run).")
        self.mlflow_run_url = (result.get("mlflow") or {}).get("run_url")
        if self.mlflow_run_url:
            self.log.info("MLflow run: %s", self.mlflow_run_url)
        if result.get("cost"):
            self.log.info("%s%s", summary(result["cost"]), " (smoke run)" if result.get("smoke_run") else "")
        return result

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
            train_fn=self.train_fn if self.train_fn is not None else self.train_script,
            train_loop_config=config,
            submission_id=self.submission_id,
            result=result,
        )
