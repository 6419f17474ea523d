"""OpenLineage for the provider's operators (the ``[openlineage]`` extra): what a training or a Ray
task read and wrote, and a run facet of the provider's own. Imported only inside the operators'
``get_openlineage_facets_on_*`` methods, which only the OpenLineage provider's listener calls, and
by ``operators.base.with_parent_run`` once OpenLineage is installed and on: without the extra,
nothing of OpenLineage is imported.

Datasets follow OpenLineage's naming spec: ``s3://bucket/key`` is namespace ``s3://bucket``, name
``key``; a local path (or ``file://``) is namespace ``file``, name the absolute path."""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from attrs import define
from openlineage.client.event_v2 import Dataset
from openlineage.client.facet_v2 import RunFacet

from airflow_provider_horovod.contract import VERSION

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage

# The facet's key in a run's facets, and where its JSON schema lives (shipped beside the code).
FACET_KEY = "horovod"
SCHEMA_URL = (
    "https://github.com/airflow-provider-horovod/airflow-provider-horovod/blob/"
    f"v{VERSION}/docs/openlineage/HorovodRunFacet.json"
)
PRODUCER = f"airflow-provider-horovod/{VERSION}"
# Environment variables the job gets: the Airflow task's OpenLineage run, as "namespace/job/run id",
# the names dbt's and other OpenLineage integrations read.
PARENT_ID_ENV = "OPENLINEAGE_PARENT_ID"
ROOT_PARENT_ID_ENV = "OPENLINEAGE_ROOT_PARENT_ID"
# Buckets and containers: the namespace holds the bucket, the name the key (the naming spec).
BUCKET_SCHEMES = ("s3", "s3a", "gs", "gcs", "abfs", "abfss", "wasbs")


@define
class HorovodRunFacet(RunFacet):
    """One Ray job of an Airflow task run, as the provider ran it.

    :param jobKind: ``"train"`` (a Horovod training) or ``"task"`` (``@task.ray``).
    :param submissionId: the Ray job of the attempt that finished (or that ran, on failure).
    :param attempts: Ray jobs this task run took, the last one included.
    :param failedAttempts: the earlier ones, each with its failure class and summary.
    :param worldSize: Horovod ranks (trainings).
    :param trainer: ``"v2"`` (Ray Train V2, the provider's Horovod backend) or ``"legacy"``.
    :param trainFunction: the training function, as an import path or a qualified name.
    :param hyperparameters: ``train_loop_config``.
    :param metrics: the last metrics reported.
    :param cost: the run's cost figures, when the provider measured them.
    :param dashboardUrl: the job in the Ray dashboard.
    :param smokeRun: True for a smoke run (docs/ci.md): a quick check, its model not one to use.
    """

    jobKind: str
    submissionId: str | None = None
    attempts: int | None = None
    failedAttempts: list[dict[str, Any]] | None = None
    worldSize: int | None = None
    trainer: str | None = None
    trainFunction: str | None = None
    hyperparameters: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None
    cost: dict[str, Any] | None = None
    dashboardUrl: str | None = None
    smokeRun: bool | None = None

    @staticmethod
    def _get_schema() -> str:
        return SCHEMA_URL


def dataset(uri: Any) -> Dataset | None:
    """The OpenLineage dataset of a URI or absolute path; None for anything else (a function, a
    relative path, a URI without a path)."""
    if not isinstance(uri, str) or not uri.strip():
        return None
    parsed = urlparse(uri.strip())
    if parsed.scheme in ("", "file"):
        path = parsed.path if parsed.scheme else uri.strip()
        if not path.startswith("/"):
            return None
        return Dataset(namespace="file", name=posixpath.normpath(path))
    path = parsed.path.rstrip("/")
    if not parsed.netloc or len(parsed.scheme) < 2:  # "C:\..." parses as scheme "c"
        return None
    if parsed.scheme in BUCKET_SCHEMES:
        return Dataset(namespace=f"{parsed.scheme}://{parsed.netloc}", name=path.lstrip("/") or "/")
    return Dataset(namespace=f"{parsed.scheme}://{parsed.netloc}", name=path or "/")


def datasets(uris: list[Any]) -> list[Dataset]:
    """Datasets of the URIs that have one, each once, in order."""
    found: dict[tuple[str, str], Dataset] = {}
    for uri in uris:
        made = dataset(uri)
        if made is not None:
            found.setdefault((made.namespace, made.name), made)
    return list(found.values())


def asset_uris(assets: Any) -> list[str]:
    """The URIs of a task's ``inlets``/``outlets`` Assets that have a scheme (an Asset named only
    has its name as URI)."""
    return [uri for asset in assets or [] if "://" in (uri := str(getattr(asset, "uri", "") or ""))]


def function_name(function: Any) -> str | None:
    if isinstance(function, str):
        return function
    module, name = getattr(function, "__module__", None), getattr(function, "__qualname__", None)
    return f"{module}:{name}" if module and name else None


def training_lineage(
    *,
    datasets_param: Any,
    inlets: Any,
    outlets: Any,
    num_workers: Any,
    trainer_api: Any,
    train_fn: Any,
    train_loop_config: Any,
    submission_id: str | None,
    result: dict[str, Any] | None,
) -> OperatorLineage:
    """A training's lineage: every dataset URI (and the task's inlets) in, the task's outlets out, and
    the checkpoint once there is one. ``result``: the task's result (None: not finished)."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    uris = list(datasets_param.values()) if isinstance(datasets_param, dict) else []
    result = result or {}
    checkpoints = [result.get("checkpoint_uri"), result.get("best_checkpoint_uri")] if result else []
    config = train_loop_config if isinstance(train_loop_config, dict) else None
    facet = HorovodRunFacet(
        jobKind="train",
        submissionId=result.get("submission_id") or submission_id,
        attempts=result.get("attempt"),
        failedAttempts=result.get("attempts") if result else None,
        worldSize=result.get("world_size") or (num_workers if isinstance(num_workers, int) else None),
        trainer=result.get("trainer_api") or (trainer_api if isinstance(trainer_api, str) else None),
        trainFunction=function_name(train_fn),
        hyperparameters=config,
        metrics=result.get("metrics"),
        cost=result.get("cost"),
        dashboardUrl=result.get("dashboard_url"),
        smokeRun=result.get("smoke_run"),
        producer=PRODUCER,
    )
    return OperatorLineage(
        inputs=datasets([*uris, *asset_uris(inlets)]),
        outputs=datasets([*checkpoints, *asset_uris(outlets)]),
        run_facets={FACET_KEY: facet},
    )


def task_lineage(
    *, inlets: Any, outlets: Any, python_callable: Any, submission_id: str | None, result: dict[str, Any] | None
) -> OperatorLineage:
    """A ``@task.ray`` job's lineage: the task's inlets in, its outlets out (what the function
    reads and writes is its own: it can emit lineage of its own, under the parent run it is given)."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    result = result or {}
    facet = HorovodRunFacet(
        jobKind="task",
        submissionId=result.get("submission_id") or submission_id,
        attempts=result.get("attempt"),
        failedAttempts=result.get("attempts"),
        trainFunction=function_name(python_callable),
        cost=result.get("cost"),
        dashboardUrl=result.get("dashboard_url"),
        producer=PRODUCER,
    )
    return OperatorLineage(
        inputs=datasets(asset_uris(inlets)), outputs=datasets(asset_uris(outlets)), run_facets={FACET_KEY: facet}
    )


def parent_run_env(ti: Any) -> dict[str, str]:
    """The task's OpenLineage run as the job's environment variables, so lineage emitted inside the
    job links to it. Computed with the OpenLineage provider's own macros, the ids its listener gives
    the task's events."""
    from airflow.providers.openlineage.plugins.macros import lineage_parent_id, lineage_root_parent_id

    return {PARENT_ID_ENV: lineage_parent_id(ti), ROOT_PARENT_ID_ENV: lineage_root_parent_id(ti)}
