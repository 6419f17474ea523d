"""The plan of a task run's job, built from the operator's parameters by checks that raise, before
anything is submitted: the spec of its first attempt, the files that travel with it, the user's
runtime_env and what it asks of the cluster. ``JobPlan.request`` makes the Ray request of any
attempt from it; the task log shows that request as its dry run. Pure: no cluster, no storage."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from airflow_provider_horovod import checks, mlflow_checks, runtime_env_checks
from airflow_provider_horovod.contract import (
    JOB_STOP_WAIT_ENV,
    JOB_STOP_WAIT_S,
    META_ATTEMPT,
    META_KIND,
    META_MARK_TOKEN,
    META_NUM_WORKERS,
    META_PRICES,
    META_RESOURCES,
    META_RESULT_URI,
    META_SMOKE_RUN,
    META_STORAGE_URI,
    META_TAGS,
    META_WORKER_RESOURCES,
    MLFLOW_AUTH_FILE,
    PAYLOAD_PREFIX,
    SCRIPT_LINE_MARKED,
    SPEC_FILE,
    JobKind,
    TaskRun,
    TrainerApi,
    attempt_uri,
    default_storage_path,
    python_minor,
)
from airflow_provider_horovod.documents import JobSpec, TaskSpec, TrainingSpec
from airflow_provider_horovod.exceptions import InvalidParameterError
from airflow_provider_horovod.functions import ship_function
from airflow_provider_horovod.script_checks import check_script

RUNTIME_ENTRYPOINT = "airflow_provider_horovod.runtime.entrypoint"
# runtime_env fields that bring code to the cluster: an import path is then not looked up here.
CODE_FIELDS = ("working_dir", "py_modules", "pip", "conda", "uv")
PARQUET_FOOTER_ACTORS_ENV = "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS"


@dataclasses.dataclass(frozen=True)
class JobRequest:
    """One Ray job submission. ``files`` travel as the payload package ``payload_module`` (a
    ``py_modules`` entry added when it is submitted); they may hold pickled code and forwarded
    credentials, so ``repr`` and the dry run leave their content out."""

    submission_id: str
    entrypoint: str
    runtime_env: dict[str, Any]
    metadata: dict[str, str]
    payload_module: str
    files: dict[str, bytes] = dataclasses.field(repr=False, default_factory=dict)
    # What the job's driver itself reserves (the Jobs API's entrypoint_num_cpus, _num_gpus, _memory,
    # _resources): a task job's function runs in its driver.
    driver_resources: dict[str, Any] = dataclasses.field(default_factory=dict)

    def dry_run(self) -> str:
        """The request as the task log shows it: file names and sizes, env var values hidden."""
        shown = {
            "submission_id": self.submission_id,
            "entrypoint": self.entrypoint,
            "runtime_env": runtime_env_checks.masked(self.runtime_env),
            "metadata": self.metadata,
            "driver_resources": self.driver_resources,
            "payload": {name: f"{len(data)} bytes" for name, data in sorted(self.files.items())},
        }
        return json.dumps(shown, indent=1, sort_keys=True)

    def write_payload(self, parent_dir: str) -> str:
        """Write the payload package under ``parent_dir``; its folder (a ``py_modules`` entry)."""
        folder = os.path.join(parent_dir, self.payload_module)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "__init__.py"), "w", encoding="utf-8") as f:
            f.write('"""Payload of one airflow-provider-horovod job."""\n')
        for name, data in self.files.items():
            if os.path.basename(name) != name:
                raise ValueError(f"payload file name {name!r} must be a plain file name")
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)
        return folder


@dataclasses.dataclass(frozen=True)
class JobPlan:
    """One task run's job, checked. ``spec`` is its first attempt's; ``resources`` what it asks of
    the cluster in all; ``driver_resources`` what its driver reserves; ``forward_aws`` (connection
    id, seconds) when it gets short-lived AWS credentials; ``storage_root`` the ``storage_path``."""

    task_run: TaskRun
    spec: TrainingSpec | TaskSpec
    files: dict[str, bytes] = dataclasses.field(repr=False)
    runtime_env: dict[str, Any]
    resources: dict[str, float]
    storage_root: str
    ray_conn_id: str
    env_vars: dict[str, str] = dataclasses.field(default_factory=dict)
    driver_resources: dict[str, Any] = dataclasses.field(default_factory=dict)
    check_cluster_resources: bool = False
    forward_aws: tuple[str, int] | None = None
    # What one worker holds (a task job: its driver), for the cost; the user's tags; the prices.
    worker_resources: dict[str, float] = dataclasses.field(default_factory=dict)
    job_tags: dict[str, str] = dataclasses.field(default_factory=dict)
    prices: dict[str, Any] | None = None

    @property
    def kind(self) -> JobKind:
        return JobKind.TRAIN if isinstance(self.spec, TrainingSpec) else JobKind.TASK

    @property
    def storage_uri(self) -> str:
        return self.spec.storage_uri

    def request(
        self,
        attempt: int,
        *,
        resume: bool = False,
        extra_files: dict[str, bytes] | None = None,
        mark_token: str = "",
    ) -> JobRequest:
        """The Ray request of one attempt; ``resume``: from the last checkpoint of those before it;
        ``mark_token``: the token of its runtime's marked lines (``contract.marked``)."""
        changes: dict[str, Any] = {
            "submission_id": self.task_run.submission_id(attempt),
            "attempt": attempt,
            "mark_token": mark_token,
        }
        if isinstance(self.spec, TrainingSpec):
            changes["resume_from"] = (
                [attempt_uri(self.storage_uri, n) for n in range(attempt - 1, 0, -1)] if resume else []
            )
        spec = dataclasses.replace(self.spec, **changes)
        files = {**self.files, **(extra_files or {}), SPEC_FILE: spec.to_json().encode()}
        module = payload_module(files)
        env = dict(self.runtime_env)
        env["py_modules"] = [provider_folder(), *(self.runtime_env.get("py_modules") or [])]
        env["env_vars"] = {
            JOB_STOP_WAIT_ENV: str(JOB_STOP_WAIT_S),
            **self.env_vars,
            **(self.runtime_env.get("env_vars") or {}),
        }
        # The user's tags first: checks.check_job_tags keeps them off the provider's keys.
        metadata = {
            **self.job_tags,
            **self.task_run.metadata(),
            META_KIND: self.kind.value,
            META_STORAGE_URI: spec.storage_uri,
            META_ATTEMPT: str(attempt),
            META_RESULT_URI: spec.result_uri,
            META_RESOURCES: json.dumps(self.resources, sort_keys=True),
            META_WORKER_RESOURCES: json.dumps(self.worker_resources, sort_keys=True),
        }
        if self.job_tags:
            metadata[META_TAGS] = json.dumps(sorted(self.job_tags))
        if self.prices:
            metadata[META_PRICES] = json.dumps(self.prices, sort_keys=True)
        if spec.smoke_run:
            metadata[META_SMOKE_RUN] = "true"
        if mark_token:
            metadata[META_MARK_TOKEN] = mark_token
        if isinstance(spec, TrainingSpec):
            # An elastic run as "min-max" (its resources above count min: what it needs to start).
            metadata[META_NUM_WORKERS] = (
                f"{spec.min_workers}-{spec.max_workers}" if spec.elastic else str(spec.num_workers)
            )
        return JobRequest(
            submission_id=spec.submission_id,
            entrypoint=f"python -m {RUNTIME_ENTRYPOINT} {self.kind.value} {module}",
            runtime_env=env,
            metadata=metadata,
            payload_module=module,
            files=files,
            driver_resources={k: v for k, v in self.driver_resources.items() if v is not None},
        )


# Parameters whose spec field is not their value: ``smoke.as_smoke`` sets those fields, from the task's
# value or Airflow's option (None: the option decides).
SET_BY_SMOKE = frozenset({"smoke_run", "smoke_rows"})


def same_named(spec_class: type[JobSpec], given: Mapping[str, Any]) -> dict[str, Any]:
    """The checked parameters the spec has a field of the same name for: a parameter declared on the
    operator reaches the job by its name, without a line of its own here."""
    return {
        f.name: given[f.name] for f in dataclasses.fields(spec_class) if f.name in given and f.name not in SET_BY_SMOKE
    }


def training_plan(
    task_run: TaskRun,
    given: Mapping[str, Any],
    *,
    train_call: tuple[Any, Any] | None,
    pending_timeout_s: float | None,
    dag_folder: str | None = None,
    mlflow_tracking_uri: str | None = None,
    mlflow_auth: dict[str, str] | None = None,
    try_number: int | None = None,
) -> JobPlan:
    """The plan of a training. ``given``: the operator's declared parameters, each checked on its own
    (``HorovodTrainOperator.parameters``); those that depend on others are checked here.
    ``train_call``: the arguments every worker calls ``train_fn`` with (``@task.horovod``); None: Ray
    Train's ``train_fn(config)``. ``mlflow_tracking_uri``: the tracking URI, the MLflow connection's
    when one is given (``mlflow_auth``, its credentials). ``dag_folder``: where a relative ``train_script`` is."""
    env = given["runtime_env"]
    code_ships = any(env.get(k) for k in CODE_FIELDS)
    script: dict[str, Any] | None = None
    fn: dict[str, str] = {}
    fn_files: dict[str, bytes] = {}
    if (given["train_fn"] is None) == (given.get("train_script") is None):
        raise InvalidParameterError(
            "train_fn", given["train_fn"], "give train_fn (a function) or train_script (a script): one of them."
        )
    if given.get("train_script") is not None:
        script, ship_folder = check_script(
            "train_script", given["train_script"], dag_folder=dag_folder, runtime_env=env, code_ships=code_ships
        )
        script["args"] = given.get("script_args") or []
        if ship_folder:  # the script's folder is the job's working_dir: its neighbour modules and files come along
            env = {**env, "working_dir": ship_folder}
    else:
        fn, fn_files = ship_function(
            "train_fn",
            given["train_fn"],
            "train_fn.pkl",
            code_ships=code_ships,
            max_args=None if train_call else 1,
            arity_fix="it must take no argument or one (`config`, from train_loop_config).",
        )
    dataset_refs, dataset_files = checks.check_datasets(given["datasets"], code_ships=code_ships)
    aws_conn_id, ttl_s = given["aws_conn_id"], given["aws_credentials_ttl_seconds"]
    forward = checks.check_forwarding(given["forward_aws_credentials"], aws_conn_id, ttl_s)
    root = checks.check_storage_path(given["storage_path"] or default_storage_path())
    tracking_uri = mlflow_checks.check_mlflow_tracking_uri(mlflow_tracking_uri)
    fields = {
        **same_named(TrainingSpec, given),
        "submission_id": task_run.submission_id(1),
        "storage_uri": task_run.storage_uri(root),
        "python_version": python_minor(),
        "train_fn": fn,
        "datasets": dataset_refs,
        "num_workers": checks.check_num_workers(given["num_workers"], trainer_api=given["trainer_api"]),
        "resources_per_worker": checks.check_resources(given["resources_per_worker"], given["use_gpu"]),
        "pending_timeout_s": pending_timeout_s,
        "train_args": checks.check_args("op_args", train_call[0]) if train_call else None,
        "train_kwargs": checks.check_json("op_kwargs", train_call[1]) if train_call else None,
        "tracking": tracking_settings(task_run, tracking_uri, given["mlflow_experiment_name"], try_number),
        "script": script,
    }
    spec = TrainingSpec(**fields)
    # Train V2 routes a worker's print() to a logger and, as Ray's workers replace sys.stdout, to
    # stdout as well: every line would be in the job's log twice.
    env_vars = {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0", **spec.horovod_env}
    if spec.script:
        # Ray's driver folds lines of different workers that differ only in their numbers into one ("[repeated
        # 3x across cluster]"): every rank's marked line but one would be lost, where horovodrun shows them all.
        env_vars["RAY_DEDUP_LOGS_ALLOW_REGEX"] = SCRIPT_LINE_MARKED
    if spec.horovod_timeline:
        # Every rank reads it; rank 0 writes there, and the runtime stores it beside the checkpoints.
        env_vars["HOROVOD_TIMELINE"] = spec.timeline_local_path
    # The Train version an explicit API needs, in the driver and the workers before ray.train is imported:
    # Ray refuses HorovodTrainer under Train V2 (its default from 2.51), and 2.50 runs Train V1 by default.
    # "auto" leaves Ray's default, which the runtime follows (runtime.ray_compat.choose_trainer).
    if spec.trainer_api != TrainerApi.AUTO.value:
        env_vars["RAY_TRAIN_V2_ENABLED"] = "1" if spec.trainer_api == TrainerApi.V2.value else "0"
    env_vars.update(parquet_footer_env(spec.datasets))
    # An MLflow connection's credentials travel with the job's code, never in its runtime_env.
    tracking_files = {MLFLOW_AUTH_FILE: json.dumps(mlflow_auth).encode()} if spec.tracking and mlflow_auth else {}
    files = {**fn_files, **dataset_files, **tracking_files}
    return JobPlan(
        task_run=task_run,
        spec=spec,
        files=files,
        runtime_env=env,
        resources=spec.total_resources(),
        storage_root=root,
        ray_conn_id=given["ray_conn_id"],
        env_vars=env_vars,
        check_cluster_resources=given["check_cluster_resources"],
        forward_aws=(str(aws_conn_id), int(ttl_s)) if forward else None,
        worker_resources=spec.worker_resources(),
        job_tags=given["job_tags"],
        prices=given["prices"],
    )


def parquet_footer_env(datasets: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """One parquet footer reader per read when the datasets are URIs and each parquet one names a file.
    Ray Data 2.60 reads footers on a pool of PARQUET_FOOTER_ACTORS_ENV actors (32 by default), each a
    process that imports Ray Data and pyarrow, however few the files: a training on one parquet file
    would pay for that pool on a small cluster. A dataset built by a function may read a
    folder: then Ray's default stays. The job's runtime_env may set another count (it wins); older Ray
    ignores the variable."""
    if any("uri" not in ref for ref in datasets.values()):
        return {}
    parquet = [ref["uri"] for ref in datasets.values() if ref["format"] == "parquet"]
    if parquet and all(not uri.endswith("/") and urlparse(uri).path.lower().endswith(".parquet") for uri in parquet):
        return {PARQUET_FOOTER_ACTORS_ENV: "1"}
    return {}


def task_plan(task_run: TaskRun, given: Mapping[str, Any]) -> JobPlan:
    """The plan of one function run as a Ray job. ``given``: the operator's declared parameters, each
    checked on its own (``RayTaskOperator.parameters``)."""
    env = given["runtime_env"]
    function, files = ship_function(
        "python_callable", given["python_callable"], "function.pkl", code_ships=any(env.get(k) for k in CODE_FIELDS)
    )
    num_cpus, num_gpus = given["num_cpus"], given["num_gpus"]
    driver = {
        # 0 or None: none asked for.
        "num_cpus": checks.check_positive("num_cpus", num_cpus, allow_none=True) if num_cpus else None,
        "num_gpus": checks.check_positive("num_gpus", num_gpus, allow_none=True) if num_gpus else None,
        "memory": given["memory"],
        "resources": checks.check_resources(given["resources"], use_gpu=True, parameter="resources"),
    }
    root = checks.check_storage_path(given["storage_path"] or default_storage_path())
    spec = TaskSpec(
        submission_id=task_run.submission_id(1),
        storage_uri=task_run.storage_uri(root),
        python_version=python_minor(),
        function=function,
        args=given["op_args"],
        kwargs=given["op_kwargs"],
    )
    asked = {k: v for k, v in driver.items() if v}
    # The driver holds what the job asked for (Ray's entrypoint_num_cpus); the function needs no more.
    held = {"CPU": float(driver["num_cpus"] or 0), "GPU": float(driver["num_gpus"] or 0)}
    return JobPlan(
        task_run=task_run,
        spec=spec,
        files=files,
        runtime_env=env,
        resources=asked,
        storage_root=root,
        ray_conn_id=given["ray_conn_id"],
        driver_resources=driver,
        worker_resources={k: v for k, v in held.items() if v},
        job_tags=given["job_tags"],
        prices=given["prices"],
    )


def tracking_settings(
    task_run: TaskRun, tracking_uri: str | None, experiment_name: Any, try_number: int | None
) -> dict[str, Any] | None:
    """``TrainingSpec.tracking``: where the training logs (the experiment defaults to the DAG's id), the
    run's name, the key a retry finds the run by, and the Airflow identifiers as tags; None: no tracking."""
    if tracking_uri is None:
        return None
    map_part = f"[{task_run.map_index}]" if task_run.map_index >= 0 else ""
    return {
        "tracking_uri": tracking_uri,
        "experiment_name": mlflow_checks.check_mlflow_experiment_name(experiment_name, task_run.dag_id),
        "run_name": f"{task_run.task_id}{map_part} {task_run.run_id}",
        "run_key": task_run.base_id,
        "tags": {
            "airflow.dag_id": task_run.dag_id,
            "airflow.task_id": task_run.task_id,
            "airflow.run_id": task_run.run_id,
            "airflow.map_index": str(task_run.map_index),
            **({"airflow.try_number": str(try_number)} if try_number is not None else {}),
        },
    }


def provider_folder() -> str:
    """The provider's own package folder: it travels with every job, so the cluster needs no install of it."""
    import airflow_provider_horovod

    return os.path.dirname(os.path.abspath(airflow_provider_horovod.__file__))


def payload_module(files: dict[str, bytes]) -> str:
    """Named by a hash of its content, so Ray's package cache reuses an identical upload."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name])
    return PAYLOAD_PREFIX + digest.hexdigest()[:16]
