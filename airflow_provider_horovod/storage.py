"""Storage seen from the Airflow side: read the result record, check that a checkpoint exists.

Local paths, ``file://`` and ``s3://`` URIs. S3 is read with boto3 using the ``aws_conn_id``
connection when one is given, else the worker's own AWS environment (the usual variables,
including ``AWS_ENDPOINT_URL``). Credentials are never logged.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from functools import cached_property
from urllib.parse import urlparse

SUPPORTED_SCHEMES = ("", "file", "s3")


def split_uri(uri: str) -> tuple[str, str]:
    """``("s3", "bucket/key")`` or ``("", "/abs/local/path")``."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return "", os.path.abspath(parsed.path if parsed.scheme == "file" else uri)
    return parsed.scheme, f"{parsed.netloc}{parsed.path}".rstrip("/")


def join_uri(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])


def normalize_storage_path(storage_path: str) -> str:
    """Local paths become absolute (Ray Train needs that); ``file://x`` becomes ``x``."""
    scheme, path = split_uri(storage_path)
    return path if scheme == "" else f"{scheme}://{path}"


@dataclass
class Storage:
    """Reads and writes small files and checks folders under local paths or S3."""

    aws_conn_id: str | None = None

    @cached_property
    def _s3(self):
        import boto3

        kwargs: dict = {}
        if self.aws_conn_id:
            from airflow.sdk import BaseHook

            conn = BaseHook.get_connection(self.aws_conn_id)
            extra = conn.extra_dejson
            kwargs = {
                "aws_access_key_id": conn.login or None,
                "aws_secret_access_key": conn.password or None,
                "aws_session_token": extra.get("aws_session_token"),
                "region_name": extra.get("region_name"),
                "endpoint_url": extra.get("endpoint_url") or (extra.get("service_config", {})
                                                              .get("s3", {}).get("endpoint_url")),
            }
            kwargs = {k: v for k, v in kwargs.items() if v}
        return boto3.client("s3", **kwargs)

    def read_text(self, uri: str) -> str | None:
        """The file's text, or None when it does not exist."""
        scheme, path = split_uri(uri)
        if scheme == "":
            try:
                with open(path, encoding="utf-8") as f:
                    return f.read()
            except FileNotFoundError:
                return None
        bucket, _, key = path.partition("/")
        try:
            return self._s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode("utf-8")
        except self._s3.exceptions.NoSuchKey:
            return None

    def read_json(self, uri: str) -> dict | None:
        text = self.read_text(uri)
        return None if text is None else json.loads(text)

    def write_json(self, uri: str, data: dict) -> None:
        self.write_bytes(uri, json.dumps(data, sort_keys=True, default=str).encode("utf-8"))

    def write_bytes(self, uri: str, body: bytes) -> None:
        """Write atomically: a local temp file renamed into place, or a single S3 put."""
        scheme, path = split_uri(uri)
        if scheme == "":
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(body)
            os.replace(tmp, path)
            return
        bucket, _, key = path.partition("/")
        self._s3.put_object(Bucket=bucket, Key=key, Body=body)

    def exists(self, uri: str) -> bool:
        return self.read_text(uri) is not None

    def folder_has_files(self, uri: str) -> bool:
        """True when the folder (a checkpoint) exists and holds at least one file."""
        scheme, path = split_uri(uri)
        if scheme == "":
            return os.path.isdir(path) and any(files for _, _, files in os.walk(path))
        bucket, _, prefix = path.partition("/")
        listing = self._s3.list_objects_v2(Bucket=bucket, Prefix=prefix.rstrip("/") + "/", MaxKeys=1)
        return listing.get("KeyCount", 0) > 0

    def download_file(self, uri: str, dest: str) -> str:
        """A local file with the content of ``uri``: local paths as they are, S3 copied to ``dest``."""
        scheme, path = split_uri(uri)
        if scheme == "":
            return path
        bucket, _, key = path.partition("/")
        os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
        self._s3.download_file(bucket, key, dest)
        return dest

    def download_folder(self, uri: str, dest: str) -> str:
        """A local folder holding the files of ``uri``: local paths as they are, S3 copied to ``dest``.

        Evaluation tasks use it to load a checkpoint wherever it was written.
        """
        scheme, path = split_uri(uri)
        if scheme == "":
            return path
        bucket, _, prefix = path.partition("/")
        prefix = prefix.rstrip("/") + "/"
        paginator = self._s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                if obj["Key"].endswith("/"):
                    continue  # a folder marker, as pyarrow writes them
                target = os.path.join(dest, obj["Key"][len(prefix):])
                os.makedirs(os.path.dirname(target), exist_ok=True)
                self._s3.download_file(bucket, obj["Key"], target)
        return dest

    def check_bucket(self, uri: str) -> None:
        """Raise when the bucket of an S3 URI cannot be reached (local paths always pass)."""
        scheme, path = split_uri(uri)
        if scheme == "s3":
            self._s3.head_bucket(Bucket=path.partition("/")[0])
