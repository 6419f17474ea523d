"""Storage seen from the Airflow side: read the result record, check that a checkpoint exists.

Local paths, ``file://`` and ``s3://`` URIs. S3 goes through the Amazon provider's ``S3Hook``
(the ``[amazon]`` extra), so ``aws_conn_id`` means what it means for every AWS operator (keys,
role_arn and assume-role, profiles, web identity, ``endpoint_url`` in the extras or
``service_config``, region); None uses the worker's own AWS environment. Credentials are never logged.

Every S3 request is bounded in time (connect and read timeouts, a few retries), and an S3 endpoint
that does not answer, a missing bucket or refused credentials raise :class:`StorageUnavailableError`
naming the URI, the endpoint, where the credentials came from and what to do.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any
from urllib.parse import urlparse

from airflow_provider_horovod.atomic_files import write_atomically
from airflow_provider_horovod.exceptions import MissingExtraError, StorageUnavailableError

# botocore's defaults (60 s to connect, 60 s per read, 5 tries) would hold a task for minutes when
# the S3 endpoint is down or hangs; these fail within about a minute.
S3_CLIENT_CONFIG = {"connect_timeout": 10, "read_timeout": 30, "retries": {"max_attempts": 3, "mode": "standard"}}
# Checking the bucket before submitting is one small request: a short wait is enough.
S3_PROBE_CONFIG = {"connect_timeout": 5, "read_timeout": 10, "retries": {"max_attempts": 2, "mode": "standard"}}
# S3 refusing for a while (throttled, a server error of its own) or not answering (an outage, a network
# cut), not missing or forbidden: a record written once and read by later tasks waits that out, up to
# WAIT_OUT_REFUSAL_S, since the storage answered when the task started.
REFUSAL_CODES = frozenset({"SlowDown", "503", "500", "InternalError", "ServiceUnavailable", "RequestTimeout"})
WAIT_OUT_REFUSAL_S = 60.0


def split_uri(uri: str) -> tuple[str, str]:
    """``("s3", "bucket/key")`` or ``("", "/abs/local/path")``."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return "", os.path.abspath(parsed.path if parsed.scheme == "file" else uri)
    return parsed.scheme, f"{parsed.netloc}{parsed.path}".rstrip("/")


@dataclass
class Storage:
    """Reads and writes small files and checks folders under local paths or S3."""

    aws_conn_id: str | None = None

    @cached_property
    def _s3(self):
        return self._client(S3_CLIENT_CONFIG)

    @cached_property
    def _s3_probe(self):
        return self._client(S3_PROBE_CONFIG)

    def _client(self, config: dict):
        try:
            from airflow.providers.amazon.aws.hooks.s3 import S3Hook
        except ImportError:
            raise MissingExtraError(
                "s3:// storage needs the Amazon provider where Airflow runs: pip install "
                "'airflow-provider-horovod[amazon]' (or give storage_path a local path shared with the cluster)."
            ) from None
        from botocore.config import Config

        return S3Hook(aws_conn_id=self.aws_conn_id, config=Config(**config)).get_conn()

    def _credentials_source(self) -> str:
        if self.aws_conn_id:
            return f"the AWS connection {self.aws_conn_id!r}"
        return "the worker's AWS environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...), as aws_conn_id is None"

    def unavailable(
        self, uri: str, err: Exception, client=None, *, bucket_request: bool = False
    ) -> StorageUnavailableError:
        """A clear error for a failed S3 request on ``uri``: what failed, where, and what to do."""
        from botocore.exceptions import ClientError, NoCredentialsError, PartialCredentialsError

        endpoint = (client or self._s3).meta.endpoint_url
        bucket = split_uri(uri)[1].partition("/")[0]
        source = self._credentials_source()
        code = ""
        if isinstance(err, ClientError):
            code = str(err.response.get("Error", {}).get("Code", ""))
        if code == "NoSuchBucket" or (code == "404" and bucket_request):
            why = (
                f"the bucket {bucket!r} does not exist at {endpoint}. Create it, or fix storage_path. "
                f"Endpoint and credentials come from {source}."
            )
        elif code in ("404", "NoSuchKey"):
            why = f"it does not exist at {endpoint}. Endpoint and credentials come from {source}."
        elif code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"):
            why = (
                f"{endpoint} refused access to the bucket {bucket!r} ({code}). Check the credentials of "
                f"{source} and their permissions on the bucket."
            )
        elif isinstance(err, (NoCredentialsError, PartialCredentialsError)):
            why = f"no AWS credentials were found in {source}. Give the connection keys, or set aws_conn_id."
        elif isinstance(err, ClientError):
            why = f"{endpoint} answered {code or 'an error'} ({err}). Check the storage and {source}."
        else:
            why = (
                f"the S3 endpoint {endpoint} does not answer ({type(err).__name__}: {err}). Check that "
                f"the S3 service is up and reachable from here, and the endpoint set in {source}."
            )
        return StorageUnavailableError(f"Storage {uri} cannot be used: {why}")

    @contextmanager
    def _request(self, uri: str, client=None, *, bucket_request: bool = False) -> Iterator[None]:
        """S3 client errors (endpoint down, bucket missing, access refused) as StorageUnavailableError."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except (BotoCoreError, ClientError) as err:
            raise self.unavailable(uri, err, client, bucket_request=bucket_request) from err

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
        with self._request(uri):
            try:
                return self._s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode("utf-8")
            except self._s3.exceptions.NoSuchKey:
                return None

    def read_json(self, uri: str) -> dict | None:
        text = self.read_text(uri)
        return None if text is None else json.loads(text)

    def write_json(self, uri: str, data: dict) -> None:
        self.write_bytes(uri, json.dumps(data, sort_keys=True, default=str).encode("utf-8"))

    def waiting(self, do: Callable[[], Any]) -> Any:
        """``do()``, tried again while S3 refuses (``REFUSAL_CODES``) or does not answer, for up to
        ``WAIT_OUT_REFUSAL_S``: for a record nothing else would write again."""
        import tenacity

        return tenacity.Retrying(
            stop=tenacity.stop_after_delay(WAIT_OUT_REFUSAL_S),
            wait=tenacity.wait_exponential(multiplier=1, max=10),
            retry=tenacity.retry_if_exception(refused_for_a_while),
            reraise=True,
        )(do)

    def write_bytes(self, uri: str, body: bytes) -> None:
        """Write atomically: a local temp file renamed into place, or a single S3 put."""
        scheme, path = split_uri(uri)
        if scheme == "":
            write_atomically(path, body)
            return
        bucket, _, key = path.partition("/")
        with self._request(uri):
            self._s3.put_object(Bucket=bucket, Key=key, Body=body)

    def swap_json(self, uri: str, update: Callable[[Any], Any], tries: int = 10) -> tuple[Any, Any]:
        """Replace a small JSON record by ``update(current)`` (None: leave it), atomically against
        other writers: a lock file beside a local record, a conditional PUT (If-Match / If-None-Match)
        for S3, tried again when another writer came first. Returns (before, written or None)."""
        scheme, path = split_uri(uri)
        if scheme == "":
            import fcntl

            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path + ".lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                before = self.read_json(uri)
                after = update(before)
                if after is not None:
                    self.write_json(uri, after)
                return before, after
        from botocore.exceptions import ClientError

        bucket, _, key = path.partition("/")
        for _ in range(tries):
            with self._request(uri):
                try:
                    answer = self._s3.get_object(Bucket=bucket, Key=key)
                    before, condition = json.loads(answer["Body"].read()), {"IfMatch": answer["ETag"]}
                except self._s3.exceptions.NoSuchKey:
                    before, condition = None, {"IfNoneMatch": "*"}
            after = update(before)
            if after is None:
                return before, None
            try:
                with self._request(uri):
                    self._s3.put_object(
                        Bucket=bucket, Key=key, Body=json.dumps(after, sort_keys=True).encode(), **condition
                    )
                return before, after
            except StorageUnavailableError as err:
                cause = err.__cause__
                if not (
                    isinstance(cause, ClientError)
                    and cause.response.get("Error", {}).get("Code")
                    in ("PreconditionFailed", "ConditionalRequestConflict", "412")
                ):
                    raise
        raise StorageUnavailableError(
            f"Storage {uri} cannot be updated: other writers kept changing it ({tries} tries)."
        )

    def exists(self, uri: str) -> bool:
        return self.read_text(uri) is not None

    def folder_has_files(self, uri: str) -> bool:
        """True when the folder (a checkpoint) exists and holds at least one file. Folder markers
        (S3 keys ending in "/", as pyarrow writes them) are not files: they can outlive the files."""
        scheme, path = split_uri(uri)
        if scheme == "":
            return os.path.isdir(path) and any(files for _, _, files in os.walk(path))
        bucket, _, prefix = path.partition("/")
        with self._request(uri):
            pages = self._s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix.rstrip("/") + "/")
            return any(not obj["Key"].endswith("/") for page in pages for obj in page.get("Contents", []))

    def folders_with_files(self, uri: str) -> set[str]:
        """Names of the folders directly in ``uri`` that hold at least one file (the checkpoints Ray
        has kept), in one listing however many there are."""
        scheme, path = split_uri(uri)
        if scheme == "":
            try:
                entries = list(os.scandir(path))
            except FileNotFoundError:
                return set()
            return {e.name for e in entries if e.is_dir() and any(files for _, _, files in os.walk(e.path))}
        bucket, _, prefix = path.partition("/")
        prefix = prefix.rstrip("/") + "/"
        names = set()
        with self._request(uri):
            for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                for obj in page.get("Contents", []):
                    rest = obj["Key"][len(prefix) :]
                    if "/" in rest and not rest.endswith("/"):
                        names.add(rest.split("/", 1)[0])
        return names

    def download_file(self, uri: str, dest: str) -> str:
        """A local file with the content of ``uri``: local paths as they are, S3 copied to ``dest``."""
        scheme, path = split_uri(uri)
        if scheme == "":
            return path
        bucket, _, key = path.partition("/")
        os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
        with self._request(uri):
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
        with self._request(uri):
            paginator = self._s3.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
                for obj in page.get("Contents", []):
                    if obj["Key"].endswith("/"):
                        continue  # a folder marker, as pyarrow writes them
                    target = os.path.join(dest, obj["Key"][len(prefix) :])
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    self._s3.download_file(bucket, obj["Key"], target)
        return dest

    def check_bucket(self, uri: str) -> None:
        """Raise :class:`StorageUnavailableError` when the bucket of an S3 URI cannot be used: the
        endpoint does not answer, the bucket does not exist or access is refused. Local paths pass
        (they are the cluster's, not necessarily this machine's)."""
        scheme, path = split_uri(uri)
        if scheme != "s3":
            return
        with self._request(uri, self._s3_probe, bucket_request=True):
            self._s3_probe.head_bucket(Bucket=path.partition("/")[0])


def refused_for_a_while(err: BaseException) -> bool:
    """Whether S3 answered a request with one of ``REFUSAL_CODES``, or did not answer it (connection refused,
    cut or timed out): what passes, unlike a missing bucket or refused credentials."""
    from botocore.exceptions import ClientError, ConnectionError, HTTPClientError

    cause = err.__cause__ if isinstance(err, StorageUnavailableError) else err
    if isinstance(cause, ConnectionError | HTTPClientError):
        return True
    return isinstance(cause, ClientError) and str(cause.response.get("Error", {}).get("Code", "")) in REFUSAL_CODES


def check_aws_conn_id(aws_conn_id: str | None) -> None:
    """A named AWS connection must exist before a job runs whose result it will read."""
    if not aws_conn_id:
        return
    from airflow.providers.common.compat.sdk import AirflowNotFoundException
    from airflow.sdk import BaseHook

    from airflow_provider_horovod.exceptions import InvalidParameterError

    try:
        BaseHook.get_connection(aws_conn_id)
    except AirflowNotFoundException:
        raise InvalidParameterError(
            "aws_conn_id",
            aws_conn_id,
            "no such connection; create it (type aws), or leave aws_conn_id=None to use the worker's AWS environment.",
        ) from None
