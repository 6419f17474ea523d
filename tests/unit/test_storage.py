"""Storage seen from Airflow: local paths, and S3 through the Amazon provider against moto's
S3 server. Errors name the URI and what to do."""

import json
import os
import sys

import pytest

from airflow_provider_horovod.exceptions import InvalidParameterError, MissingExtraError
from airflow_provider_horovod.storage import (
    Storage,
    StorageUnavailableError,
    check_aws_conn_id,
    split_uri,
)

# --- URIs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "uri, parts",
    [
        ("s3://bucket/a/b/", ("s3", "bucket/a/b")),
        ("s3://bucket", ("s3", "bucket")),
        ("/abs/x", ("", "/abs/x")),
        ("file:///abs/x", ("", "/abs/x")),
        ("/abs/../abs/x/", ("", "/abs/x")),
    ],
)
def test_split_uri(uri, parts):
    assert split_uri(uri) == parts


# --- local paths ----------------------------------------------------------------------------------


def test_local_write_read_exists(tmp_path):
    storage, uri = Storage(), str(tmp_path / "a" / "b" / "record.json")
    assert storage.read_text(uri) is None
    assert storage.read_json(uri) is None
    assert not storage.exists(uri)
    storage.write_json(uri, {"x": 1, "when": object.__name__})
    assert storage.read_json(uri) == {"x": 1, "when": "object"}
    assert storage.exists(uri)
    assert storage.read_json("file://" + uri) == {"x": 1, "when": "object"}


def test_local_writes_are_atomic(tmp_path, monkeypatch):
    storage, uri = Storage(), str(tmp_path / "record.json")
    storage.write_json(uri, {"v": 1})
    real_replace = os.replace

    def crash(src, dst):
        raise OSError("crash before the rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        storage.write_json(uri, {"v": 2})
    monkeypatch.setattr(os, "replace", real_replace)
    assert storage.read_json(uri) == {"v": 1}  # the old content, whole
    storage.write_json(uri, {"v": 3})
    assert storage.read_json(uri) == {"v": 3}
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".tmp-")) == ["record.json"]


def test_local_folders(tmp_path):
    storage = Storage()
    folder = tmp_path / "checkpoint"
    assert not storage.folder_has_files(str(folder))
    folder.mkdir()
    assert not storage.folder_has_files(str(folder))
    (folder / "nested").mkdir()
    assert not storage.folder_has_files(str(folder))
    (folder / "nested" / "model.pt").write_bytes(b"w")
    assert storage.folder_has_files(str(folder))
    assert storage.folder_has_files(f"file://{folder}")
    assert storage.download_folder(str(folder), str(tmp_path / "unused")) == str(folder)
    assert storage.download_file(str(folder / "nested" / "model.pt"), "unused") == str(folder / "nested" / "model.pt")
    assert not (tmp_path / "unused").exists()
    storage.check_bucket(str(folder))  # local paths have no bucket


# --- S3 -------------------------------------------------------------------------------------------


def test_s3_write_read_exists(s3):
    bucket, storage = s3.bucket(), Storage()
    uri = f"s3://{bucket}/runs/attempt-1/result.json"
    assert storage.read_text(uri) is None
    assert not storage.exists(uri)
    storage.write_json(uri, {"checkpoint_uri": "s3://x"})
    assert storage.read_json(uri) == {"checkpoint_uri": "s3://x"}
    assert storage.exists(uri)
    body = s3.client().get_object(Bucket=bucket, Key="runs/attempt-1/result.json")["Body"].read()
    assert json.loads(body) == {"checkpoint_uri": "s3://x"}


def test_s3_folders_ignore_folder_markers(s3, tmp_path):
    bucket, storage, client = s3.bucket(), Storage(), s3.client()
    ckpt = f"s3://{bucket}/run/checkpoint_000001"
    assert not storage.folder_has_files(ckpt)
    client.put_object(Bucket=bucket, Key="run/checkpoint_000001/", Body=b"")  # a marker, as pyarrow writes it
    client.put_object(Bucket=bucket, Key="run/checkpoint_000001/sub/", Body=b"")
    client.put_object(Bucket=bucket, Key="run/checkpoint_0000010/model.pt", Body=b"other")  # a sibling prefix
    assert not storage.folder_has_files(ckpt)
    assert not storage.folder_has_files(ckpt + "/")
    client.put_object(Bucket=bucket, Key="run/checkpoint_000001/sub/model.pt", Body=b"weights")
    client.put_object(Bucket=bucket, Key="run/checkpoint_000001/meta.json", Body=b"{}")
    assert storage.folder_has_files(ckpt)

    dest = tmp_path / "download"
    assert storage.download_folder(ckpt, str(dest)) == str(dest)
    found = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert found == ["meta.json", "sub/model.pt"]
    assert (dest / "sub" / "model.pt").read_bytes() == b"weights"
    assert storage.download_file(ckpt + "/meta.json", str(tmp_path / "m" / "meta.json")) == str(
        tmp_path / "m" / "meta.json"
    )
    assert (tmp_path / "m" / "meta.json").read_bytes() == b"{}"


def test_a_missing_bucket(s3):
    storage = Storage()
    with pytest.raises(StorageUnavailableError) as err:
        storage.check_bucket("s3://ahp-no-such-bucket/prefix")
    message = str(err.value)
    assert "the bucket 'ahp-no-such-bucket' does not exist at " + s3.endpoint_url in message
    assert "Create it, or fix storage_path" in message
    assert "aws_conn_id is None" in message
    with pytest.raises(StorageUnavailableError, match="'ahp-no-such-bucket' does not exist"):
        storage.read_text("s3://ahp-no-such-bucket/x.json")
    storage.check_bucket(f"s3://{s3.bucket()}/prefix")


def test_an_s3_endpoint_that_does_not_answer(s3, monkeypatch):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    with pytest.raises(StorageUnavailableError, match=f"the S3 endpoint http://127.0.0.1:{port} does not answer"):
        Storage().check_bucket("s3://bucket/prefix")


def test_without_the_amazon_provider_s3_needs_the_extra_and_local_paths_work(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "airflow.providers.amazon.aws.hooks.s3", None)
    storage = Storage()
    for call in (
        lambda: storage.read_text("s3://bucket/x.json"),
        lambda: storage.check_bucket("s3://bucket/x"),
        lambda: storage.write_json("s3://bucket/x.json", {}),
    ):
        with pytest.raises(MissingExtraError, match=r"airflow-provider-horovod\[amazon\]"):
            call()
    storage.write_json(str(tmp_path / "x.json"), {"ok": True})
    assert storage.read_json(str(tmp_path / "x.json")) == {"ok": True}


# --- aws_conn_id ----------------------------------------------------------------------------------


def test_check_aws_conn_id(monkeypatch):
    check_aws_conn_id(None)
    check_aws_conn_id("")
    monkeypatch.delenv("AIRFLOW_CONN_AWS_NOPE", raising=False)
    with pytest.raises(InvalidParameterError) as err:
        check_aws_conn_id("aws_nope")
    assert err.value.parameter == "aws_conn_id"
    assert "create it (type aws)" in str(err.value)
    monkeypatch.setenv("AIRFLOW_CONN_AWS_THERE", json.dumps({"conn_type": "aws"}))
    check_aws_conn_id("aws_there")


def test_the_connections_credentials_are_used(s3, monkeypatch):
    bucket = s3.bucket()
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.setenv(
        "AIRFLOW_CONN_AWS_S3",
        json.dumps(
            {
                "conn_type": "aws",
                "login": "testing",
                "password": "testing",
                "extra": {"endpoint_url": s3.endpoint_url, "region_name": "us-east-1"},
            }
        ),
    )
    storage = Storage("aws_s3")
    storage.write_json(f"s3://{bucket}/x.json", {"via": "connection"})
    assert storage.read_json(f"s3://{bucket}/x.json") == {"via": "connection"}
    with pytest.raises(StorageUnavailableError, match="come from the AWS connection 'aws_s3'"):
        storage.check_bucket("s3://ahp-no-such-bucket")


def test_a_record_is_kept_through_an_endpoint_that_does_not_answer_for_a_while(s3, monkeypatch):
    # The chaos run's S3 outage: connections refused for a while, then answered again.
    import boto3
    from botocore.config import Config

    from harness.ports import free_port

    bucket, storage = s3.bucket(), Storage()
    down = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{free_port()}",  # nothing listens there
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
        config=Config(connect_timeout=1, retries={"max_attempts": 1}),
    )
    tries = []

    def write_json(uri, data):  # the first try meets the outage, the next the endpoint back
        tries.append(uri)
        if len(tries) == 1:
            storage.__dict__["_s3"] = down
        else:
            storage.__dict__.pop("_s3", None)
        Storage.write_json(storage, uri, data)

    monkeypatch.setattr(storage, "write_json", write_json)
    storage.waiting(lambda: storage.write_json(f"s3://{bucket}/attempt-1/result.json", {"state": "failed"}))
    assert len(tries) == 2
    assert storage.read_json(f"s3://{bucket}/attempt-1/result.json") == {"state": "failed"}


def test_a_record_is_kept_through_a_refusal_that_passes_and_a_missing_bucket_is_not_waited_on(s3, monkeypatch):
    from chaos.spread import SlowDown

    bucket, storage = s3.bucket(), Storage()
    wsgi = s3.server._server._server
    refusal = wsgi.app = SlowDown(wsgi.app)
    tries = []

    def write_json(uri, data):  # the refusal outlasts botocore's own tries once, then passes
        tries.append(uri)
        refusal.refusing = len(tries) == 1
        Storage.write_json(storage, uri, data)

    monkeypatch.setattr(storage, "write_json", write_json)
    try:
        storage.waiting(lambda: storage.write_json(f"s3://{bucket}/attempt-2/result.json", {"state": "failed"}))
    finally:
        wsgi.app = refusal.app
    assert refusal.refused >= 1
    assert len(tries) == 2
    assert storage.read_json(f"s3://{bucket}/attempt-2/result.json") == {"state": "failed"}
    with pytest.raises(StorageUnavailableError, match="does not exist"):
        storage.waiting(lambda: storage.write_json("s3://ahp-no-such-bucket/result.json", {}))
    assert len(tries) == 3  # a missing bucket is no refusal that passes: one try
