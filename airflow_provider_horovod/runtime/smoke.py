"""A smoke run on the cluster (``TrainingSpec.smoke_run``; the Airflow side's ``smoke`` module plans it):
the first rows of each dataset, and every rank stopped right after the first ``ray.train.report`` that
carries a checkpoint, so the training function returns and the run succeeds with that checkpoint."""

from __future__ import annotations

import functools
import importlib
import itertools
from typing import Any

from airflow_provider_horovod.exceptions import SmokeRunDone

_STOPPING = "_ahp_smoke_stopping"
_rounds = itertools.count()


def limited(datasets: dict, rows: int | None) -> dict:
    """The first ``rows`` rows of each Ray dataset."""
    if not rows:
        return datasets
    if datasets:
        print(f"Smoke run: reading the first {rows} rows of each dataset {sorted(datasets)}.", flush=True)
    return {name: dataset.limit(rows) for name, dataset in datasets.items()}


def stop_after_first_checkpoint() -> None:
    """Wrap Ray Train's report (each API's that imports) so that every rank stops after the first report
    that carries a checkpoint. Installed after ``storage.HISTORY.record``, so that report is recorded."""
    from airflow_provider_horovod.runtime.ray_compat import REPORT_METHODS

    for module_name, class_name, _ in REPORT_METHODS:
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError):
            continue
        if not getattr(cls.report, _STOPPING, False):
            cls.report = _stopping(cls.report)


def _stopping(report):
    @functools.wraps(report)
    def stopping(context, metrics, checkpoint=None, *args, **kwargs):
        result = report(context, metrics, checkpoint, *args, **kwargs)
        if any_rank(checkpoint is not None):
            import ray.train

            if ray.train.get_context().get_world_rank() == 0:
                print("Smoke run: a checkpoint was reported; every rank stops here.", flush=True)
            raise SmokeRunDone()
        return result

    setattr(stopping, _STOPPING, True)
    return stopping


def any_rank(mine: bool) -> bool:
    """Whether the ranks stop on this report, the same answer on every rank: any rank's report carried a
    checkpoint (one Horovod allreduce when Horovod runs: ranks often checkpoint on rank 0 only); without
    Horovod, rank 0's answer through Ray Train V2's own broadcast; else this rank's."""
    try:
        import horovod.torch as hvd
    except ImportError:
        hvd = None
    if hvd is not None and hvd.is_initialized():
        if hvd.size() == 1:
            return mine
        import torch

        total: Any = hvd.allreduce(
            torch.tensor([1.0 if mine else 0.0]), op=hvd.Sum, name=f"ahp_smoke_checkpoint_{next(_rounds)}"
        )
        return bool(total.item() > 0)
    try:
        from ray.train.collective import broadcast_from_rank_zero

        return bool(broadcast_from_rank_zero(mine))
    except Exception:  # Train V1, or a Ray without it: every rank that reports alike stops alike
        return mine
