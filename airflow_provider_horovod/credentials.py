"""AWS credentials from an Airflow connection: boto3 client arguments, and the short-lived session
credentials a job gets when ``forward_aws_credentials`` is on.

Forwarding is opt-in. The session credentials come from STS ``GetSessionToken`` for the job alone;
the connection's long-lived keys never leave the Airflow worker. They travel in the job's payload
(a file shipped with the job), never in its ``runtime_env`` or metadata, which Ray shows to every
dashboard reader.
"""

from __future__ import annotations

from datetime import datetime

from airflow_provider_horovod.runtime.aws import SESSION_FILE  # noqa: F401 - where the operator writes it
MIN_TTL_S, MAX_TTL_S = 900, 129600  # what STS GetSessionToken accepts


def aws_client_kwargs(aws_conn_id: str, service: str) -> dict:
    """boto3 client arguments from an Airflow AWS connection (keys, session token, region, endpoint)."""
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(aws_conn_id)
    extra = conn.extra_dejson
    endpoint = (extra.get("service_config", {}).get(service, {}).get("endpoint_url")
                or extra.get("endpoint_url"))
    kwargs = {
        "aws_access_key_id": conn.login or None,
        "aws_secret_access_key": conn.password or None,
        "aws_session_token": extra.get("aws_session_token"),
        "region_name": extra.get("region_name"),
        "endpoint_url": endpoint,
    }
    return {k: v for k, v in kwargs.items() if v}


def session_credentials(aws_conn_id: str, ttl_s: int) -> dict:
    """Session credentials for one job, valid ``ttl_s`` seconds, and where S3 is (for the cluster)."""
    import boto3

    from airflow_provider_horovod.exceptions import HorovodProviderError

    try:
        answer = boto3.client("sts", **aws_client_kwargs(aws_conn_id, "sts")).get_session_token(
            DurationSeconds=int(ttl_s))
    except Exception as err:
        # The message names the call and the error code only: botocore messages can echo a key id.
        code = getattr(err, "response", {}).get("Error", {}).get("Code", type(err).__name__)
        raise HorovodProviderError(
            f"Could not get session credentials for the job from connection {aws_conn_id!r} (STS "
            f"GetSessionToken: {code}). Give the connection long-lived IAM user keys that may call "
            "sts:GetSessionToken, or set forward_aws_credentials=False and give the Ray cluster its "
            "own S3 access (instance role, IRSA, or AWS_* variables on the nodes)."
        ) from None
    creds = answer["Credentials"]
    s3 = aws_client_kwargs(aws_conn_id, "s3")
    expiration = creds["Expiration"]
    return {
        "aws_access_key_id": creds["AccessKeyId"],
        "aws_secret_access_key": creds["SecretAccessKey"],
        "aws_session_token": creds["SessionToken"],
        "expiration": expiration.isoformat() if isinstance(expiration, datetime) else str(expiration),
        "region_name": s3.get("region_name"),
        "endpoint_url": s3.get("endpoint_url"),
    }
