"""A training's datasets on the cluster: read with Ray Data from their URIs (forwarded credentials for
S3), or built by the user's function; a smoke run's first rows; read whole before the workers start."""

from __future__ import annotations

from airflow_provider_horovod.documents import TrainingSpec
from airflow_provider_horovod.runtime import smoke
from airflow_provider_horovod.runtime.payload import load_callable


def load_datasets(spec: TrainingSpec, folder: str, s3_fs=None) -> dict:
    """``s3_fs``: the filesystem of forwarded credentials, for datasets on S3 (Ray Data reads them in
    its own tasks, which do not see the driver's environment)."""
    import ray.data

    readers = {"parquet": ray.data.read_parquet, "csv": ray.data.read_csv, "json": ray.data.read_json}
    datasets = {}
    for name, ref in spec.datasets.items():
        if "uri" in ref:
            if s3_fs is not None and ref["uri"].startswith("s3://"):
                datasets[name] = readers[ref["format"]](ref["uri"][len("s3://") :], filesystem=s3_fs)
            else:
                datasets[name] = readers[ref["format"]](ref["uri"])
        else:
            datasets[name] = load_callable(ref, folder)()
    return smoke.limited(datasets, spec.smoke_rows) if spec.smoke_run else datasets


def materialized(datasets: dict) -> dict:
    """The datasets read before the workers start: a training waiting for its workers then holds
    none of the CPUs its reads need, so trainings queued on a busy cluster run one after another
    instead of starving each other's reads (Ray Data's read tasks need CPUs the workers hold)."""
    if datasets:
        print(f"Reading the datasets {sorted(datasets)} before the workers start.", flush=True)
    return {name: dataset.materialize() for name, dataset in datasets.items()}
