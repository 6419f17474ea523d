"""Short-lived AWS session credentials for a job, when ``forward_aws_credentials`` is on.

Forwarding is opt-in. The credentials come from STS ``GetSessionToken``, asked through the Amazon
provider's hook for ``aws_conn_id`` (so its keys, role, profile or web identity apply), for the job
alone; the connection's long-lived keys never leave the Airflow worker. They travel in the job's
payload (a file shipped with the job), never in its ``runtime_env`` or metadata, which Ray shows to
every dashboard reader.
"""

from __future__ import annotations

from datetime import datetime

from airflow_provider_horovod.exceptions import HorovodProviderError, MissingExtraError


def _hook(aws_conn_id: str, client_type: str):
    try:
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
    except ImportError:
        raise MissingExtraError(
            "forward_aws_credentials needs the Amazon provider where Airflow runs: pip install "
            "'airflow-provider-horovod[amazon]'."
        ) from None
    return AwsBaseHook(aws_conn_id=aws_conn_id, client_type=client_type)


def session_credentials(aws_conn_id: str, ttl_s: int) -> dict:
    """Session credentials for one job, valid ``ttl_s`` seconds, and where S3 is (for the cluster)."""
    try:
        answer = _hook(aws_conn_id, "sts").get_conn().get_session_token(DurationSeconds=int(ttl_s))
    except MissingExtraError:
        raise
    except Exception as err:
        # The message names the call and the error code only: botocore messages can echo a key id.
        code = getattr(err, "response", {}).get("Error", {}).get("Code", type(err).__name__)
        raise HorovodProviderError(
            f"Could not get session credentials for the job from connection {aws_conn_id!r} (STS "
            f"GetSessionToken: {code}). Give the connection long-lived IAM user keys that may call "
            "sts:GetSessionToken, or set forward_aws_credentials=False and give the Ray cluster its own S3 "
            "access (instance role, IRSA, or AWS_* variables on the nodes)."
        ) from None
    creds = answer["Credentials"]
    s3 = _hook(aws_conn_id, "s3").conn_config
    expiration = creds["Expiration"]
    return {
        "aws_access_key_id": creds["AccessKeyId"],
        "aws_secret_access_key": creds["SecretAccessKey"],
        "aws_session_token": creds["SessionToken"],
        "expiration": expiration.isoformat() if isinstance(expiration, datetime) else str(expiration),
        "region_name": s3.region_name,
        "endpoint_url": s3.get_service_endpoint_url("s3"),
    }
