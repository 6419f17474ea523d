"""Smoke runs: a whole DAG run checked end to end in CI, quickly, on a cluster without GPUs.

The switch is Airflow's ``[horovod] smoke_run`` option (``AIRFLOW__HOROVOD__SMOKE_RUN=True``), which a
task's own ``smoke_run`` overrides; ``enabled`` is the one place it is decided. Under it a job keeps
everything that can break (its code, imports, templates, storage, credentials, evaluation) and loses
what only costs time:

- a training runs on CPU workers, as many as the cluster has CPUs (at most ``SMOKE_MAX_WORKERS``), one CPU
  each, reads the first ``smoke_rows`` rows of each Ray dataset, and stops on every rank right after the
  first ``ray.train.report`` that carries a checkpoint (``runtime.smoke``): the job succeeds, its
  checkpoint is verified and its XCom has the shape of a full run's, with ``smoke_run: true``;
- a ``@task.ray`` job runs as it is, on CPU when it asked for GPUs;
- every job has ``AHP_SMOKE_RUN=1`` in its environment, so the user's code can shrink itself further.

The functions here are pure: ``as_smoke`` marks a plan, ``fit_to_cluster`` scales it to the cluster's
resources once they are read (before submission) and says what it changed, for the task log;
``for_cluster`` completes every plan, a smoke run's or not, with what the connection and the cluster say.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

from airflow_provider_horovod import checks
from airflow_provider_horovod.contract import CONFIG_SECTION, SMOKE_ROWS, SMOKE_RUN_ENV
from airflow_provider_horovod.documents import TrainingSpec
from airflow_provider_horovod.plan import JobPlan

# Enough ranks to run Horovod's collectives between processes; more only cost start-up time.
SMOKE_MAX_WORKERS = 2
SMOKE_WORKER_RESOURCES = {"CPU": 1.0}


def enabled(smoke_run: Any) -> bool:
    """Whether a task runs as a smoke run: its ``smoke_run`` when given, else ``[horovod] smoke_run``."""
    if smoke_run is not None:
        return checks.check_bool("smoke_run", smoke_run)
    from airflow.configuration import conf

    return conf.getboolean(CONFIG_SECTION, "smoke_run", fallback=False)


def rows(smoke_rows: Any) -> int:
    """Rows a smoke run reads of each dataset: the task's ``smoke_rows``, else ``[horovod] smoke_rows``."""
    if smoke_rows is None:
        from airflow.configuration import conf

        smoke_rows = conf.getint(CONFIG_SECTION, "smoke_rows", fallback=SMOKE_ROWS)
    return checks.check_positive("smoke_rows", smoke_rows, integer=True)


def as_smoke(plan: JobPlan, smoke_rows: int = SMOKE_ROWS) -> JobPlan:
    """The plan as a smoke run: its spec marked (a training's datasets cut to ``smoke_rows`` and read
    before the workers start: with every CPU given to a worker, streaming reads would wait for ever),
    ``AHP_SMOKE_RUN=1`` in its environment."""
    changes: dict[str, Any] = {"smoke_run": True}
    if isinstance(plan.spec, TrainingSpec):
        changes.update(smoke_rows=smoke_rows, materialize_datasets=True)
    return dataclasses.replace(
        plan, spec=dataclasses.replace(plan.spec, **changes), env_vars={**plan.env_vars, SMOKE_RUN_ENV: "1"}
    )


def fit_to_cluster(plan: JobPlan, cluster: dict[str, float]) -> tuple[JobPlan, str]:
    """A smoke run's plan scaled to ``cluster`` (its total resources), and the task log's line saying how."""
    cpus = float(cluster.get("CPU", 0.0))
    if isinstance(plan.spec, TrainingSpec):
        return _fit_training(plan, plan.spec, cpus, cluster)
    return _fit_task(plan, cpus, cluster)


def _fit_training(plan: JobPlan, spec: TrainingSpec, cpus: float, cluster: dict[str, float]) -> tuple[JobPlan, str]:
    workers = max(1, min(spec.max_workers, SMOKE_MAX_WORKERS, math.floor(cpus)))
    smoke = dataclasses.replace(
        spec, num_workers=workers, use_gpu=False, resources_per_worker=dict(SMOKE_WORKER_RESOURCES)
    )
    fitted = dataclasses.replace(
        plan, spec=smoke, resources=smoke.total_resources(), worker_resources=smoke.worker_resources()
    )
    asked = f"{spec.num_workers} {'GPU' if spec.use_gpu else 'CPU'} worker(s) of {_text(spec.worker_resources())}"
    said = (
        f"Smoke run: {asked} -> {workers} CPU worker(s) of {_text(smoke.worker_resources())} (the cluster has "
        f"{_text(cluster)}); the first {spec.smoke_rows} rows of each dataset; stopping on every rank after the "
        f"first ray.train.report with a checkpoint. {SMOKE_RUN_ENV}=1 is set on every rank."
    )
    return fitted, said


def _fit_task(plan: JobPlan, cpus: float, cluster: dict[str, float]) -> tuple[JobPlan, str]:
    asked = dict(plan.driver_resources)
    driver = dict(asked, num_gpus=None)
    if driver.get("num_cpus") and cpus > 0:
        driver["num_cpus"] = min(float(driver["num_cpus"]), cpus)
    if driver.get("resources"):
        driver["resources"] = {k: v for k, v in driver["resources"].items() if k != "GPU"} or None
    held = {"CPU": float(driver.get("num_cpus") or 0)}
    fitted = dataclasses.replace(
        plan,
        driver_resources=driver,
        resources={k: v for k, v in driver.items() if v},
        worker_resources={k: v for k, v in held.items() if v},
    )
    shown = {k: v for k, v in asked.items() if v}
    now = {k: v for k, v in driver.items() if v}
    change = f"{_text(shown)} -> {_text(now)}" if shown != now else f"as asked ({_text(now)})"
    said = f"Smoke run: the function runs {change} (the cluster has {_text(cluster)}); {SMOKE_RUN_ENV}=1 is set."
    return fitted, said


def _text(resources: dict[str, Any]) -> str:
    return json.dumps(
        {k: v for k, v in resources.items() if not k.startswith(("object_store", "memory"))}, sort_keys=True
    )


def for_cluster(
    plan: JobPlan, *, prices: Mapping[str, Any] | None, cluster: Mapping[str, float] | None
) -> tuple[JobPlan, list[str]]:
    """The plan completed with what the connection and the cluster say: the connection's ``prices`` for a
    task that gives none, and a smoke run scaled to ``cluster`` (its total resources; None: not asked).
    Also the lines that say what changed, for the task log."""
    said = []
    if plan.prices is None and prices:
        plan = dataclasses.replace(plan, prices=dict(prices))
    if plan.spec.smoke_run and cluster is not None:
        plan, line = fit_to_cluster(plan, dict(cluster))
        said.append(line)
    return plan, said
