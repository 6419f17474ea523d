"""The checks of where the data is: storage paths (local or S3, normalised) and datasets (a URI
with its format, a function, an import path).

The helper ``fails`` is test_checks.py's."""

from __future__ import annotations

import pytest

from airflow_provider_horovod import checks
from unit.test_checks import fails


@pytest.mark.parametrize(
    "good, root",
    [
        ("/abs/dir", "/abs/dir"),
        ("file:///abs/dir", "/abs/dir"),
        ("file://localhost/abs", "/abs"),
        ("s3://bucket", "s3://bucket"),
        ("s3://b/p/", "s3://b/p"),
        ("/abs/./x/../dir/", "/abs/dir"),
    ],
)
def test_good_storage_paths_are_normalised(good, root):
    assert checks.check_storage_path(good) == root


@pytest.mark.parametrize(
    "bad, fix",
    [
        ("", "s3://bucket/prefix"),
        ("   ", "s3://bucket/prefix"),
        (None, "s3://bucket/prefix"),
        (5, "s3://bucket/prefix"),
        ("gs://bucket/x", "scheme 'gs' is not supported"),
        ("hdfs://nn/x", "scheme 'hdfs' is not supported"),
        ("s3:///nobucket", "name the bucket"),
        ("relative/dir", "absolute"),
        ("file://data/checkpoints", "file:///abs/path"),
        ("file://", "file:///abs/path"),
    ],
)
def test_bad_storage_paths(bad, fix):
    fails(checks.check_storage_path, bad, parameter="storage_path", fix=fix)


@pytest.mark.parametrize(
    "uri, fmt",
    [
        ("s3://b/train/", "parquet"),
        ("/data/v.csv", "csv"),
        ("s3://b/X.CSV", "csv"),
        ("file:///x.json", "json"),
        ("gs://b/x.jsonl", "json"),
        ("/data/part.parquet", "parquet"),
        ("s3://b/dir.csv/", "csv"),
    ],
)
def test_dataset_format(uri, fmt):
    assert checks.dataset_format(uri) == fmt


def make_rows():
    return None


def test_datasets_of_every_kind():
    specs, files = checks.check_datasets(
        {
            "train": "s3://b/train/",
            "val": "/data/v.csv",
            "test": "file:///t.json",
            "built": make_rows,
            "imported": "airflow_provider_horovod.examples.quickstart:make_dataset",
        }
    )
    assert specs == {
        "train": {"uri": "s3://b/train/", "format": "parquet"},
        "val": {"uri": "/data/v.csv", "format": "csv"},
        "test": {"uri": "file:///t.json", "format": "json"},
        "built": {"pickle": "dataset_built.pkl", "source": __file__},
        "imported": {"import": "airflow_provider_horovod.examples.quickstart:make_dataset"},
    }
    assert set(files) == {"dataset_built.pkl"}
    assert checks.check_datasets(None) == ({}, {})


class DatasetLike:
    def iter_batches(self):
        return iter(())


@pytest.mark.parametrize(
    "value, parameter, fix",
    [
        (["s3://b/x"], "datasets", "give a dict"),
        ({"bad name": "s3://b/x"}, "datasets", "simple name"),
        ({1: "s3://b/x"}, "datasets", "simple name"),
        ({"train": 5}, "datasets['train']", "URI of parquet"),
        ({"train": ""}, "datasets['train']", "s3://"),
        ({"train": "ftp://h/x.parquet"}, "datasets['train']", "gs://"),
        ({"train": DatasetLike()}, "datasets['train']", "wrap it in a function"),
        ({"train": "no_such_module_xyz:make"}, "datasets['train']", "not importable"),
    ],
)
def test_bad_datasets(value, parameter, fix):
    fails(checks.check_datasets, value, parameter=parameter, fix=fix)


def test_dataset_import_path_not_looked_up_when_code_ships():
    specs, _ = checks.check_datasets({"train": "no_such_module_xyz:make"}, code_ships=True)
    assert specs == {"train": {"import": "no_such_module_xyz:make"}}
