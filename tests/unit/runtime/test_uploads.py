"""Checkpoint uploads to S3 through boto3's transfer manager against a real S3-protocol server (moto's
server mode): in parallel parts, read back bit-identical, every other copy left to Ray's own."""

import hashlib
import os

import pytest

from airflow_provider_horovod.runtime import uploads


def make_big_checkpoint(folder):
    rng = __import__("random").Random(7)
    files = {
        "model.pt": rng.randbytes(40 * 1024 * 1024),
        "meta.json": b'{"epoch": 3}',
        "shards/part-0": rng.randbytes(3 * 1024 * 1024),
        "shards/part-1": b"",
    }
    for name, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(folder, name)), exist_ok=True)
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    return {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}


@pytest.fixture
def s3(monkeypatch):
    from harness.s3 import MotoServer

    with MotoServer() as server:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        server.make_bucket("ckpt")
        yield server.endpoint_url


def pyarrow_s3(endpoint):
    import pyarrow.fs

    return pyarrow.fs.S3FileSystem(
        access_key="testing", secret_key="testing", endpoint_override=endpoint, region="us-east-1", scheme="http"
    )


def digests(folder):
    return {
        os.path.relpath(os.path.join(root, f), folder): hashlib.sha256(
            open(os.path.join(root, f), "rb").read()
        ).hexdigest()
        for root, _, names in os.walk(folder)
        for f in names
    }


def test_a_checkpoint_goes_up_in_parts_and_reads_back_bit_identical(s3, tmp_path):
    import boto3

    made = make_big_checkpoint(tmp_path / "ckpt")
    fs = pyarrow_s3(s3)
    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)

    uploads.copy_files(
        refuse, str(tmp_path / "ckpt"), "ckpt/run/checkpoint_000001", source_filesystem=None, destination_filesystem=fs
    )
    uploaded = boto3.client("s3").head_object(Bucket="ckpt", Key="run/checkpoint_000001/model.pt")
    assert uploaded["ETag"].strip('"').endswith("-3")  # 40 MiB in 16 MiB parts: a multipart upload
    assert calls == []
    listed = boto3.client("s3").list_objects_v2(Bucket="ckpt", Prefix="run/")["Contents"]
    assert not [o["Key"] for o in listed if o["Key"].endswith(".unfinished")]  # the copy finished
    # Reads stay Ray's own copy (pyarrow, threads on): handed to the original helper.
    uploads.copy_files(refuse, "ckpt/run/checkpoint_000001", str(tmp_path / "back"), source_filesystem=fs)
    assert calls == [("ckpt/run/checkpoint_000001", str(tmp_path / "back"))]
    import pyarrow.fs

    pyarrow.fs.copy_files("ckpt/run/checkpoint_000001", str(tmp_path / "back"), source_filesystem=fs)
    assert digests(tmp_path / "back") == made


def test_ray_trains_copy_helper_is_routed_through_it_once_installed(s3, tmp_path):
    import pyarrow.fs
    from ray.train import Checkpoint
    from ray.train._internal import storage as ray_storage

    made = make_big_checkpoint(tmp_path / "ckpt")
    uploads.route_uploads()
    uploads.route_uploads()  # idempotent
    assert ray_storage._pyarrow_fs_copy_files.func is uploads.copy_files
    fs = pyarrow_s3(s3)
    ray_storage._pyarrow_fs_copy_files(str(tmp_path / "ckpt"), "ckpt/via-ray", destination_filesystem=fs)
    with Checkpoint(path="ckpt/via-ray", filesystem=fs).as_directory() as folder:
        assert digests(folder) == made
    # Local to local is still Ray's own copy.
    ray_storage._pyarrow_fs_copy_files(
        str(tmp_path / "ckpt"),
        str(tmp_path / "copy"),
        source_filesystem=pyarrow.fs.LocalFileSystem(),
        destination_filesystem=pyarrow.fs.LocalFileSystem(),
    )
    assert digests(tmp_path / "copy") == made


def test_a_checkpoint_copy_cut_short_leaves_its_marker_and_a_whole_one_none(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "model.pt").write_bytes(b"weights")
    marker = tmp_path / "storage" / ".checkpoint_000001.unfinished"
    (tmp_path / "storage").mkdir()

    def full(source, destination, **kwargs):
        assert marker.exists()  # marked before a byte is copied
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        uploads.copy_files(full, str(tmp_path / "ckpt"), str(tmp_path / "storage" / "checkpoint_000001"))
    assert marker.exists()

    def whole(source, destination, **kwargs):
        import shutil

        shutil.copytree(source, destination, dirs_exist_ok=True)

    uploads.copy_files(whole, str(tmp_path / "ckpt"), str(tmp_path / "storage" / "checkpoint_000001"))
    assert not marker.exists()
    assert (tmp_path / "storage" / "checkpoint_000001" / "model.pt").read_bytes() == b"weights"
