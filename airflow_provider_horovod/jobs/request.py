"""What is submitted to Ray, built by pure functions from a checked spec: the entrypoint, the
runtime_env, the metadata and the payload files. The operator logs it as its dry run."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from typing import Any

from airflow_provider_horovod.checks import masked
from airflow_provider_horovod.ids import TaskRun
from airflow_provider_horovod.jobs.protocol import (
    META_ATTEMPT,
    META_KIND,
    META_NUM_WORKERS,
    META_RESOURCES,
    META_RESULT_URI,
    META_STORAGE_URI,
)
from airflow_provider_horovod.spec import SPEC_FILE, TaskSpec, TrainingSpec

RUNTIME_PACKAGE = "airflow_provider_horovod.runtime"
PAYLOAD_PREFIX = "ahp_payload_"


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
            "runtime_env": masked(self.runtime_env),
            "metadata": self.metadata,
            "driver_resources": self.driver_resources,
            "payload": {name: f"{len(data)} bytes" for name, data in sorted(self.files.items())},
        }
        return json.dumps(shown, indent=1, sort_keys=True)


def python_version() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


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


def build_request(*, submission_id: str, runtime_module: str, files: dict[str, bytes], runtime_env: dict,
                  metadata: dict[str, str], env_vars: dict[str, str] | None = None,
                  driver_resources: dict[str, Any] | None = None) -> JobRequest:
    """A job that runs ``python -m airflow_provider_horovod.runtime.<runtime_module> <payload>``."""
    module = payload_module(files)
    env = dict(runtime_env)
    env["py_modules"] = [provider_folder(), *(runtime_env.get("py_modules") or [])]
    env["env_vars"] = {**(env_vars or {}), **(runtime_env.get("env_vars") or {})}
    return JobRequest(submission_id=submission_id, entrypoint=f"python -m {RUNTIME_PACKAGE}.{runtime_module} {module}",
                      runtime_env=env, metadata=metadata, payload_module=module, files=files,
                      driver_resources={k: v for k, v in (driver_resources or {}).items() if v is not None})


def training_request(spec: TrainingSpec, files: dict[str, bytes], runtime_env: dict, task_run: TaskRun) -> JobRequest:
    """The Ray job of one training attempt."""
    # Train V2 routes a worker's print() to a logger and, as Ray's workers replace sys.stdout, to
    # stdout as well: every line would be in the job's log twice.
    env_vars = {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0", **spec.horovod_env}
    if spec.horovod_timeline:
        # Every rank reads it; rank 0 writes there, and the runtime stores it beside the checkpoints.
        env_vars["HOROVOD_TIMELINE"] = spec.timeline_local_path
    if spec.trainer_api == "legacy":
        # Ray 2.60 refuses HorovodTrainer under Train V2; the driver and the workers need the flag
        # before ray.train is imported.
        env_vars["RAY_TRAIN_V2_ENABLED"] = "0"
    metadata = {
        **task_run.metadata(),
        META_KIND: "train",
        META_STORAGE_URI: spec.storage_uri,
        META_ATTEMPT: str(spec.attempt),
        META_RESULT_URI: spec.result_uri,
        META_NUM_WORKERS: str(spec.num_workers),
        META_RESOURCES: json.dumps(spec.total_resources(), sort_keys=True),
    }
    return build_request(submission_id=spec.submission_id, runtime_module="job",
                         files={**files, SPEC_FILE: spec.to_json().encode()}, runtime_env=runtime_env,
                         metadata=metadata, env_vars=env_vars)


def task_request(spec: TaskSpec, files: dict[str, bytes], runtime_env: dict, task_run: TaskRun,
                 driver_resources: dict[str, Any]) -> JobRequest:
    """The Ray job of one task attempt: the function runs in the driver, with ``driver_resources``."""
    metadata = {**task_run.metadata(), META_KIND: "task", META_STORAGE_URI: spec.storage_uri,
                META_ATTEMPT: str(spec.attempt), META_RESULT_URI: spec.result_uri,
                META_RESOURCES: json.dumps({k: v for k, v in driver_resources.items() if v}, sort_keys=True)}
    return build_request(submission_id=spec.submission_id, runtime_module="task",
                         files={**files, SPEC_FILE: spec.to_json().encode()}, runtime_env=runtime_env,
                         metadata=metadata, driver_resources=driver_resources)


def write_payload(request: JobRequest, parent_dir: str) -> str:
    """Write the payload package under ``parent_dir``; return its folder (a ``py_modules`` entry)."""
    folder = os.path.join(parent_dir, request.payload_module)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "__init__.py"), "w", encoding="utf-8") as f:
        f.write('"""Payload of one airflow-provider-horovod job."""\n')
    for name, data in request.files.items():
        if os.path.basename(name) != name:
            raise ValueError(f"payload file name {name!r} must be a plain file name")
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    return folder
