"""Checkpoint uploads at S3's speed. Ray Train copies a checkpoint with ``pyarrow.fs.copy_files``, which
turns threads off when the target is an ``S3FileSystem``: one file after another, one stream each.
``route_uploads()`` routes Ray Train's one copy helper (both trainer APIs, called on
``ray.train.report``) through boto3's transfer manager for local-to-S3 copies: the files in parallel,
each in parallel parts. Downloads stay Ray's own: pyarrow reads with threads on, faster than boto3's
transfer manager (bench/results.md)."""

from __future__ import annotations

import concurrent.futures
import functools
import importlib
import os
import posixpath

# Parallel files, and parallel parts within a file (boto3's TransferConfig).
FILE_WORKERS = 8
PART_WORKERS = 8
PART_BYTES = 16 * 1024 * 1024

_ORIGINAL = "_ahp_original_copy"


def _s3_client():
    import boto3
    from botocore.config import Config

    # Credentials and endpoint from the environment (the cluster's own, or forwarded ones).
    return boto3.client(
        "s3",
        config=Config(
            max_pool_connections=FILE_WORKERS * PART_WORKERS, retries={"max_attempts": 5, "mode": "standard"}
        ),
    )


def _transfer_config():
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(
        multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES, max_concurrency=PART_WORKERS, use_threads=True
    )


def _is_s3(fs) -> bool:
    import pyarrow.fs

    return isinstance(fs, pyarrow.fs.S3FileSystem)


def _is_local(fs) -> bool:
    import pyarrow.fs

    return fs is None or isinstance(fs, pyarrow.fs.LocalFileSystem)


def upload(local_path: str, bucket: str, key: str) -> int:
    """Upload a file, or a folder's files under ``key/``; the number of files."""
    client, config = _s3_client(), _transfer_config()
    if os.path.isfile(local_path):
        client.upload_file(local_path, bucket, key, Config=config)
        return 1
    files = [os.path.join(root, name) for root, _, names in os.walk(local_path) for name in names]
    with concurrent.futures.ThreadPoolExecutor(FILE_WORKERS) as pool:
        list(
            pool.map(
                lambda f: client.upload_file(
                    f, bucket, posixpath.join(key, os.path.relpath(f, local_path).replace(os.sep, "/")), Config=config
                ),
                files,
            )
        )
    return len(files)


def copy_files(original, source, destination, source_filesystem=None, destination_filesystem=None, **kwargs):
    """Ray Train's copy helper, with local-to-S3 copies made by boto3's transfer manager. A checkpoint's copy
    is marked as under way until it is whole (``records.unfinished_marker``)."""
    import pyarrow.fs

    from airflow_provider_horovod.runtime.records import is_checkpoint_folder, unfinished_marker

    marker = unfinished_marker(destination) if is_checkpoint_folder(destination) else None
    target_fs = destination_filesystem or pyarrow.fs.LocalFileSystem()
    if marker:
        with target_fs.open_output_stream(marker):
            pass
    if _is_s3(destination_filesystem) and _is_local(source_filesystem):
        bucket, _, key = destination.partition("/")
        upload(source, bucket, key)
    else:
        original(
            source,
            destination,
            source_filesystem=source_filesystem,
            destination_filesystem=destination_filesystem,
            **kwargs,
        )
    if marker:
        target_fs.delete_file(marker)


def route_uploads() -> None:
    """Route Ray Train's checkpoint copies in this process through ``copy_files`` (once)."""
    from airflow_provider_horovod.runtime.ray_compat import COPY_HELPER, COPY_HELPER_MODULES

    for name in COPY_HELPER_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # a Ray without it (ray_compat's probe says so in the job's log)
            continue
        if hasattr(module, _ORIGINAL) or not hasattr(module, COPY_HELPER):
            continue
        original = getattr(module, COPY_HELPER)
        setattr(module, _ORIGINAL, original)
        setattr(module, COPY_HELPER, functools.partial(copy_files, original))
