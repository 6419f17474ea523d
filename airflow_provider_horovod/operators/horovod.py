"""HorovodTrainOperator: Horovod training on a Ray cluster, from one Airflow task."""

from __future__ import annotations

import json
import logging
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, conf

from airflow_provider_horovod.exceptions import RayJobError, RayJobPendingTimeoutError
from airflow_provider_horovod.links.ray import RayJobLink, push_job_link
from airflow_provider_horovod.results import (
    XCOM_SUBMISSION_ID,
    collect_result,
    mark_consumed,
    push_result,
    raise_for_failure,
)
from airflow_provider_horovod.spec import TrainingSpec, consumed_uri
from airflow_provider_horovod.storage import Storage, normalize_storage_path
from airflow_provider_horovod.training import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    attempt_submission_id,
    build_entrypoint,
    build_job_metadata,
    build_runtime_env,
    check_choice,
    check_datasets,
    check_horovod_env,
    check_json,
    check_max_failures,
    check_nics,
    check_num_workers,
    check_positive,
    check_resources,
    check_runtime_env,
    check_storage_path,
    check_train_fn,
    check_trainer_api,
    default_storage_path,
    missing_resources,
    required_resources,
    resume_candidates,
    run_storage_uri,
    submission_base_id,
)
from airflow_provider_horovod.triggers.ray import LOG_TAIL_LINES, RayJobTrigger, pending_timeout_message

# The task_state_store key (it outlives a try, unlike XCom) that remembers how far the job's log was
# streamed into the task log, so the try that re-attaches repeats no line of the one before.
STATE_LOG_OFFSET = "ray_log_offset"

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_horovod.hooks.ray import RayHook

log = logging.getLogger(__name__)


class HorovodTrainOperator(BaseOperator):
    """Train with Horovod on a Ray cluster (Ray Train), and push the verified checkpoint URI to XCom.

    One task run is one training job: its submission id comes from the dag id, task id, run id and
    map index, so a retry or a restarted worker re-attaches to a running job, reuses a succeeded one
    and, after a failed or stopped one, submits the next attempt, resuming from its last checkpoint.

    :param train_fn: the function every worker runs: a callable (shipped with cloudpickle; code in
        DAG files travels by value) or an import path ``"package.module:function"``. It takes no
        argument or one (``config``). Written for Ray's ``HorovodTrainer``, it runs unchanged.
    :param train_loop_config: dict passed to ``train_fn`` as ``config`` (templated).
    :param datasets: dict name -> URI of parquet/csv/json files (templated; read with Ray Data on
        the cluster) or a function run on the cluster returning a ``ray.data.Dataset``. ``"train"``
        is sharded across workers.
    :param num_workers: number of Horovod workers (ranks).
    :param use_gpu: one GPU per worker.
    :param resources_per_worker: Ray resources per worker, e.g. ``{"CPU": 2, "GPU": 1}``.
    :param storage_path: root for checkpoints and the result record (templated): an absolute local
        path, ``file://`` or ``s3://bucket/prefix``. Each task run writes under its own folder.
        Default: ``$AIRFLOW_HOME/horovod-storage``.
    :param checkpoint_num_to_keep: checkpoints kept per attempt (None: all).
    :param checkpoint_score_attribute: metric that ranks checkpoints (None: the latest is best).
    :param checkpoint_score_order: ``"max"`` or ``"min"``.
    :param max_failures: worker-failure retries inside one job (-1: without limit).
    :param horovod_timeout_s: Horovod rendezvous timeout.
    :param horovod_nics: network interfaces Horovod may use.
    :param horovod_env: ``HOROVOD_*`` tuning variables (fusion threshold, cycle time, autotune,
        timeline), set in every worker (templated).
    :param runtime_env: extra Ray runtime env (pip, working_dir, env_vars), merged over the
        connection's default (templated). No secrets: Ray shows it to every dashboard reader.
    :param trainer_api: ``"v2"`` (default): Ray Train V2's ``DataParallelTrainer`` with the
        provider's own Horovod backend; ``"legacy"``: Ray's own ``HorovodTrainer`` (Train V1, run
        with ``RAY_TRAIN_V2_ENABLED=0``; Ray plans to remove it). The same training function runs
        on both, with the same result.
    :param ray_conn_id: Ray connection; without a ``ray_default`` connection, an embedded local
        Ray cluster is started (templated).
    :param aws_conn_id: AWS connection the Airflow side uses to read S3 storage; None: the worker's
        own AWS environment (templated).
    :param forward_aws_credentials: give the job short-lived AWS session credentials (STS
        ``GetSessionToken`` with ``aws_conn_id``'s keys) for its S3 storage and datasets, for
        clusters without S3 access of their own. Off by default; the long-lived keys never leave
        Airflow, and the session credentials travel with the job's code, not in its ``runtime_env``.
    :param aws_credentials_ttl_seconds: how long forwarded credentials stay valid (900 to 129600);
        longer than the training may run.
    :param deferrable: wait in the triggerer, freeing the worker slot.
    :param wait_for_completion: False: submit, push the submission id and return (a
        ``RayJobSensor`` waits).
    :param poll_interval_seconds: seconds between status polls.
    :param pending_timeout_seconds: fail when the job or its workers wait longer than this for
        resources (e.g. GPUs no node has). None: wait without limit.
    :param check_cluster_resources: fail before submitting when the cluster has none of a resource
        the workers ask for. Turn off for autoscaling clusters that add such nodes on demand.
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
    operator_extra_links = (RayJobLink(),)
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
        storage_path: str | None = None,
        checkpoint_num_to_keep: int | None = None,
        checkpoint_score_attribute: str | None = None,
        checkpoint_score_order: str = "max",
        max_failures: int = 0,
        horovod_timeout_s: int = 30,
        horovod_nics: list[str] | None = None,
        horovod_env: dict[str, str] | None = None,
        runtime_env: dict | None = None,
        trainer_api: str = "v2",
        ray_conn_id: str = "ray_default",
        aws_conn_id: str | None = None,
        forward_aws_credentials: bool = False,
        aws_credentials_ttl_seconds: int = 12 * 3600,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        wait_for_completion: bool = True,
        poll_interval_seconds: float = 1.0,
        pending_timeout_seconds: float | None = 600.0,
        check_cluster_resources: bool = True,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.train_fn = train_fn
        self.train_loop_config = train_loop_config
        self.datasets = datasets
        self.num_workers = num_workers
        self.use_gpu = use_gpu
        self.resources_per_worker = resources_per_worker
        self.storage_path = storage_path
        self.checkpoint_num_to_keep = checkpoint_num_to_keep
        self.checkpoint_score_attribute = checkpoint_score_attribute
        self.checkpoint_score_order = checkpoint_score_order
        self.max_failures = max_failures
        self.horovod_timeout_s = horovod_timeout_s
        self.horovod_nics = horovod_nics
        self.horovod_env = horovod_env
        self.runtime_env = runtime_env
        self.trainer_api = trainer_api
        self.ray_conn_id = ray_conn_id
        self.aws_conn_id = aws_conn_id
        self.forward_aws_credentials = forward_aws_credentials
        self.aws_credentials_ttl_seconds = aws_credentials_ttl_seconds
        self.deferrable = deferrable
        self.wait_for_completion = wait_for_completion
        self.poll_interval_seconds = poll_interval_seconds
        self.pending_timeout_seconds = pending_timeout_seconds
        self.check_cluster_resources = check_cluster_resources
        # Kept on the instance in case the task gets killed.
        self.submission_id: str | None = None
        self._killed: threading.Event | None = None  # made in execute: operators get copied

    # --- building the job (pure, checked before anything is submitted) -------------------------

    def build_spec(self, context: Context, *, attempt: int = 1, resume: bool = False,
                   submission_id: str | None = None) -> tuple[TrainingSpec, dict[str, bytes], dict]:
        """The checked training spec, the files that travel with it, and the user's runtime_env."""
        ti = context["ti"]
        num_workers = check_num_workers(self.num_workers)
        use_gpu = bool(self.use_gpu)
        resources = check_resources(self.resources_per_worker, use_gpu)
        storage_path = normalize_storage_path(check_storage_path(self.storage_path or default_storage_path()))
        runtime_env = check_runtime_env(self.runtime_env)
        train_fn, fn_files = check_train_fn(self.train_fn, runtime_env)
        datasets, ds_files = check_datasets(self.datasets)
        storage_uri = run_storage_uri(storage_path, ti.dag_id, ti.task_id, ti.run_id, _map_index(ti))
        base_id = submission_base_id(ti.dag_id, ti.task_id, ti.run_id, _map_index(ti))
        spec = TrainingSpec(
            submission_id=submission_id or attempt_submission_id(base_id, attempt),
            train_fn=train_fn,
            storage_uri=storage_uri,
            attempt=attempt,
            train_loop_config=check_json("train_loop_config", self.train_loop_config),
            datasets=datasets,
            num_workers=num_workers,
            use_gpu=use_gpu,
            resources_per_worker=resources,
            trainer_api=check_trainer_api(self.trainer_api),
            checkpoint_num_to_keep=check_positive(
                "checkpoint_num_to_keep", self.checkpoint_num_to_keep, allow_none=True, integer=True),
            checkpoint_score_attribute=self.checkpoint_score_attribute,
            checkpoint_score_order=check_choice("checkpoint_score_order", self.checkpoint_score_order, ("max", "min")),
            max_failures=check_max_failures(self.max_failures),
            horovod_timeout_s=check_positive("horovod_timeout_s", self.horovod_timeout_s, integer=True),
            horovod_nics=check_nics(self.horovod_nics),
            horovod_env=check_horovod_env(self.horovod_env),
            resume_from=resume_candidates(storage_uri, attempt) if resume else [],
            pending_timeout_s=check_positive(
                "pending_timeout_seconds", self.pending_timeout_seconds, allow_none=True),
        )
        check_positive("poll_interval_seconds", self.poll_interval_seconds)
        check_forwarding(self.forward_aws_credentials, self.aws_conn_id, self.aws_credentials_ttl_seconds)
        return spec, {**fn_files, **ds_files}, runtime_env

    # --- execution ----------------------------------------------------------------------------

    def execute(self, context: Context) -> dict:
        ti = context["ti"]
        self._killed = threading.Event()
        # Everything the user gave is checked before the cluster is even asked.
        spec, _, _ = self.build_spec(context)
        check_aws_conn_id(self.aws_conn_id)
        hook = self._hook()
        storage = Storage(self.aws_conn_id)
        base_id = submission_base_id(ti.dag_id, ti.task_id, ti.run_id, _map_index(ti))

        attempt, info, resume = self._find_attempt(hook, storage, base_id, spec.storage_uri)
        if info is not None:
            sid = attempt_submission_id(base_id, attempt)
            self.log.info("Re-attaching to Ray job %s (%s) of this task run.", sid, info.get("status"))
        else:
            spec, files, runtime_env = self.build_spec(context, attempt=attempt, resume=resume)
            sid = self._submit(hook, context, spec, files, runtime_env)
        self.submission_id = sid
        dashboard_url = hook.get_job_url(sid)
        push_job_link(context, dashboard_url)
        ti.xcom_push(key=XCOM_SUBMISSION_ID, value=sid)
        self.log.info("Ray job %s: %s", sid, dashboard_url)

        if not self.wait_for_completion:
            return {"submission_id": sid, "dashboard_url": dashboard_url, "storage_uri": spec.storage_uri,
                    "attempt": attempt}
        offset = streamed_offset(context, sid)
        if offset:
            self.log.info("The job's log up to line %s is in the task log of an earlier try.", offset)
        if self.deferrable:
            self.defer(
                trigger=RayJobTrigger(
                    submission_id=sid,
                    ray_conn_id=self.ray_conn_id,
                    poll_interval_seconds=self.poll_interval_seconds,
                    pending_timeout_seconds=self.pending_timeout_seconds,
                    log_offset=offset,
                ),
                method_name="execute_complete",
                timeout=self.execution_timeout,
            )
        info = self._wait(hook, sid, context, offset)
        tail = [] if info["status"] == "SUCCEEDED" else hook.get_job_logs(sid).splitlines()[-LOG_TAIL_LINES:]
        return self._finish(context, hook, sid, info["status"], info.get("error_type"),
                            info.get("message") or "", info.get("metadata") or {}, tail)

    def execute_complete(self, context: Context, event: dict) -> dict:
        """Resume after the trigger's event (a new operator instance: everything comes from the event)."""
        sid = event["submission_id"]
        self.submission_id = sid
        save_streamed_offset(context, sid, event.get("log_offset") or 0)
        return self._finish(context, self._hook(), sid, event.get("job_status"), event.get("error_type"),
                            event.get("message") or "", event.get("metadata") or {}, event.get("log_tail") or [],
                            failed=event.get("status") != "success")

    def on_kill(self) -> None:
        # The signal handler must not raise: stop the job, and let the wait loop notice.
        if self._killed is not None:
            self._killed.set()
        if self.submission_id:
            self.log.info("Task killed: stopping Ray job %s", self.submission_id)
            try:
                self._hook().stop_job(self.submission_id)
            except Exception:
                self.log.exception("Could not stop Ray job %s", self.submission_id)

    # --- steps ------------------------------------------------------------------------------

    def _hook(self) -> RayHook:
        from airflow_provider_horovod.hooks.ray import RayHook

        return RayHook(ray_conn_id=self.ray_conn_id)

    def _find_attempt(self, hook: RayHook, storage: Storage, base_id: str,
                      storage_uri: str) -> tuple[int, dict | None, bool]:
        """(attempt, info of the job to re-attach to or None to submit it, resume from earlier attempts)."""
        latest, info = 0, None
        while (found := hook.get_job_info(attempt_submission_id(base_id, latest + 1))) is not None:
            latest, info = latest + 1, found
        if info is None:
            return 1, None, False
        state = info.get("status")
        if state in ACTIVE_STATES:
            return latest, info, False
        if state == "SUCCEEDED":
            if storage.exists(consumed_uri(storage_uri, latest)):
                # The task was cleared after it had succeeded: the user asks for a new training.
                self.log.info("Attempt %s already gave this task its result; training again as attempt %s.",
                              latest, latest + 1)
                return latest + 1, None, False
            return latest, info, False
        self.log.info("Attempt %s ended %s; submitting attempt %s, resuming from its last checkpoint.",
                      latest, state, latest + 1)
        return latest + 1, None, True

    def _submit(self, hook: RayHook, context: Context, spec: TrainingSpec, files: dict[str, bytes],
                runtime_env: dict) -> str:
        from airflow_provider_horovod.runtime.payload import write_payload

        ti = context["ti"]
        asked = required_resources(spec.num_workers, spec.use_gpu, spec.resources_per_worker)
        if self.check_cluster_resources:
            cluster = hook.get_cluster_resources()
            if missing := missing_resources(asked, cluster):
                raise RayJobPendingTimeoutError(
                    f"The workers ask for {json.dumps(asked, sort_keys=True)} but the cluster has none of "
                    f"{sorted(missing)} (it has {json.dumps(cluster, sort_keys=True)}). Use use_gpu=False "
                    "or a cluster with such nodes; for an autoscaling cluster set check_cluster_resources=False.",
                    status="NOT_SUBMITTED",
                )
        Storage(self.aws_conn_id).check_bucket(spec.storage_uri)
        self.log.info("Training spec (dry run of what is submitted):\n%s", spec.to_json())
        if self.forward_aws_credentials:
            from airflow_provider_horovod.credentials import SESSION_FILE, session_credentials

            session = session_credentials(self.aws_conn_id, self.aws_credentials_ttl_seconds)
            files = {**files, SESSION_FILE: json.dumps(session).encode()}
            self.log.info("Forwarding AWS session credentials of connection %r, valid until %s.",
                          self.aws_conn_id, session["expiration"])
        with tempfile.TemporaryDirectory(prefix="ahp-payload-") as parent:
            module, path = write_payload(spec, files, parent)
            sid = hook.submit_job(
                entrypoint=build_entrypoint(module),
                submission_id=spec.submission_id,
                runtime_env=build_runtime_env(runtime_env, path, spec.trainer_api, spec.horovod_env),
                metadata=build_job_metadata(spec, dag_id=ti.dag_id, task_id=ti.task_id, run_id=ti.run_id,
                                            map_index=_map_index(ti), asked=asked),
            )
        self.log.info("Submitted Ray job %s (attempt %s, %s workers).", sid, spec.attempt, spec.num_workers)
        return sid

    def _wait(self, hook: RayHook, sid: str, context: Context, offset: int = 0) -> dict:
        """Poll until the job ends, streaming its log (after line ``offset``) into the task log."""
        while True:
            info = hook.get_job_info(sid)
            if info is None:
                raise RayJobError(f"Ray job {sid} disappeared from the cluster while waiting.", submission_id=sid)
            state = info.get("status")
            terminal = state in TERMINAL_STATES
            lines, offset = hook.get_job_logs_since(sid, offset, final=terminal)
            if lines:
                # Saved before the lines are written: a crash in between may skip them, never repeat them.
                save_streamed_offset(context, sid, offset)
            for line in lines:
                self.log.info("[ray] %s", line)
            if terminal:
                return info
            if state == "PENDING" and self.pending_timeout_seconds:
                waited = time.time() - (info.get("start_time") or time.time() * 1000) / 1000
                if waited > self.pending_timeout_seconds:
                    hook.stop_job(sid)
                    asked = json.loads((info.get("metadata") or {}).get("ahp_resources", "{}"))
                    raise RayJobPendingTimeoutError(
                        pending_timeout_message(sid, waited, asked, hook.get_cluster_resources()),
                        submission_id=sid, status=state)
            if self._killed is not None and self._killed.wait(self.poll_interval_seconds):
                raise RayJobError(f"Task killed; Ray job {sid} was stopped.", submission_id=sid, status="STOPPED")

    def _finish(self, context: Context, hook: RayHook, sid: str, job_status: str | None, error_type: str | None,
                message: str, metadata: dict, log_tail: list[str], failed: bool | None = None) -> dict:
        if failed is None:
            failed = job_status != "SUCCEEDED"
        if failed:
            raise_for_failure(sid, job_status, error_type, message, log_tail)
        storage = Storage(self.aws_conn_id)
        result = collect_result(metadata, submission_id=sid, dashboard_url=hook.get_job_url(sid), storage=storage)
        mark_consumed(storage, result, try_number=getattr(context["ti"], "try_number", None))
        self.log.info("Checkpoint: %s  metrics: %s", result["checkpoint_uri"], result["metrics"])
        return push_result(context, result)


def streamed_offset(context: Context, submission_id: str) -> int:
    """How many lines of the job's log an earlier try of this task streamed (0: none, or no store)."""
    store = context.get("task_state_store")
    try:
        saved = store.get(STATE_LOG_OFFSET) if store is not None else None
    except Exception:  # the offset only spares repeated lines: never fail the task for it
        log.warning("Could not read the log offset of earlier tries; the job's log is streamed from its start.")
        return 0
    if isinstance(saved, dict) and saved.get("submission_id") == submission_id:
        return int(saved.get("offset") or 0)
    return 0


def save_streamed_offset(context: Context, submission_id: str, offset: int) -> None:
    store = context.get("task_state_store")
    if store is None:
        return
    try:
        store.set(STATE_LOG_OFFSET, {"submission_id": submission_id, "offset": int(offset)})
    except Exception:
        log.warning("Could not save the log offset; a retry may show the job's log again from its start.")


def check_aws_conn_id(aws_conn_id: str | None) -> None:
    """A named AWS connection must exist before a job runs whose result it will read."""
    if not aws_conn_id:
        return
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    from airflow_provider_horovod.exceptions import InvalidParameterError

    try:
        BaseHook.get_connection(aws_conn_id)
    except AirflowNotFoundException:
        raise InvalidParameterError(
            "aws_conn_id", aws_conn_id,
            "no such connection; create it (type aws), or leave aws_conn_id=None to use the worker's AWS environment.",
        ) from None


def check_forwarding(forward: bool, aws_conn_id: str | None, ttl_s) -> None:
    from airflow_provider_horovod.credentials import MAX_TTL_S, MIN_TTL_S
    from airflow_provider_horovod.exceptions import InvalidParameterError

    if not isinstance(forward, bool):
        raise InvalidParameterError("forward_aws_credentials", forward, "give True or False.")
    if not forward:
        return
    if not aws_conn_id:
        raise InvalidParameterError(
            "forward_aws_credentials", forward,
            "set aws_conn_id to the AWS connection whose keys get the session credentials, or leave it False.")
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int) or not MIN_TTL_S <= ttl_s <= MAX_TTL_S:
        raise InvalidParameterError("aws_credentials_ttl_seconds", ttl_s,
                                    f"give whole seconds from {MIN_TTL_S} to {MAX_TTL_S} (what STS accepts).")


def _map_index(ti) -> int:
    index = getattr(ti, "map_index", -1)
    return -1 if index is None else index

