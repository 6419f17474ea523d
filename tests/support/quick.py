"""The quick stand-in for training jobs (``support/ahp_quick_job``), swapped in for the operator's
request: the same submission id, payload and storage, a job that writes a real checkpoint and
result record in a second or two instead of training."""

from __future__ import annotations

import dataclasses
from pathlib import Path

QUICK_JOB = Path(__file__).resolve().parent / "ahp_quick_job"


def quick_request(real):
    """``JobPlan.request`` with the quick job as a training's entrypoint."""

    def quick(plan, *args, **kwargs):
        from airflow_provider_horovod.contract import JobKind

        made = real(plan, *args, **kwargs)
        if plan.kind is not JobKind.TRAIN:
            return made
        env = {**made.runtime_env, "py_modules": [*made.runtime_env["py_modules"], str(QUICK_JOB)]}
        return dataclasses.replace(made, entrypoint=f"python -m ahp_quick_job {made.payload_module}", runtime_env=env)

    return quick


def use_quick_jobs(setattr_=setattr) -> None:
    """Swap the quick job in (``setattr_``: pytest's monkeypatch.setattr, to undo it after a test)."""
    from airflow_provider_horovod.plan import JobPlan

    setattr_(JobPlan, "request", quick_request(JobPlan.request))
