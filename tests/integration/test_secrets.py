"""Secrets stay secret: a job submitted with a Ray token and AWS keys configured, and AWS session
credentials forwarded to it, leaves none of them in the task log, XCom, the rendered template
fields, the trigger's serialised kwargs, or the Ray job's info and log."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from airflow_provider_horovod import credentials
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from harness.tasks import FakeTI

pytestmark = pytest.mark.integration


def session_probe(config):
    """Reports which AWS credentials the workers see (the prefix of the key id only)."""
    import os
    import tempfile

    import horovod.torch as hvd
    import ray.train
    from ray.train import Checkpoint

    hvd.init()
    seen = {
        "key_prefix": os.environ.get("AWS_ACCESS_KEY_ID", "")[:4],
        "has_session_token": bool(os.environ.get("AWS_SESSION_TOKEN")),
    }
    if hvd.rank() == 0:
        with tempfile.TemporaryDirectory() as folder:
            open(os.path.join(folder, "model"), "w").close()
            ray.train.report(seen, checkpoint=Checkpoint.from_directory(folder))
    else:
        ray.train.report(seen)


@pytest.fixture
def connections(ray_cluster, moto_server, monkeypatch):
    """A Ray connection carrying the token, and an AWS connection with long-lived keys of its own."""
    secrets = {
        "ray_token": ray_cluster.token,
        "aws_key_id": f"AKIA{uuid.uuid4().hex[:16].upper()}",
        "aws_secret": f"long-lived-{uuid.uuid4().hex}",
    }
    port = int(ray_cluster.dashboard_url.rsplit(":", 1)[1])
    monkeypatch.setenv(
        "AIRFLOW_CONN_RAY_SECRET",
        json.dumps({"conn_type": "ray", "host": "127.0.0.1", "port": port, "password": secrets["ray_token"]}),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_AWS_SECRET",
        json.dumps(
            {
                "conn_type": "aws",
                "login": secrets["aws_key_id"],
                "password": secrets["aws_secret"],
                "extra": {"endpoint_url": moto_server.endpoint_url, "region_name": "us-east-1"},
            }
        ),
    )
    return secrets


def test_no_secret_reaches_logs_xcom_fields_trigger_or_the_ray_job(
    connections, moto_server, ray_hook, monkeypatch, capsys, caplog
):
    from airflow.providers.common.compat.sdk import TaskDeferred

    # Spy on the session credentials the job gets, so the search covers them too.
    sessions = []
    real = credentials.session_credentials
    monkeypatch.setattr(credentials, "session_credentials", lambda *args: sessions.append(real(*args)) or sessions[-1])

    bucket = moto_server.make_bucket(f"ahp-secret-{uuid.uuid4().hex[:8]}")
    op = HorovodTrainOperator(
        task_id="train",
        train_fn=session_probe,
        num_workers=2,
        deferrable=True,
        poll_interval_seconds=0.5,
        storage_path=f"s3://{bucket}/runs",
        ray_conn_id="ray_secret",
        aws_conn_id="aws_secret",
        forward_aws_credentials=True,
        aws_credentials_ttl_seconds=3600,
    )
    op.sync_wait_before_defer_s = 0  # defer at once: the trigger's path is what is searched
    ti = FakeTI(f"secret-{uuid.uuid4().hex[:6]}")
    context = {"ti": ti}
    op.render_template_fields(context)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    trigger = deferred.value.trigger
    event = asyncio.run(anext(trigger.run()))
    result = op.execute_complete(context, event.payload)

    # The forwarded session reached the workers (a session key, not the cluster's own keys).
    assert len(sessions) == 1
    assert sessions[0]["aws_session_token"]
    assert result["metrics"]["has_session_token"] is True
    assert result["metrics"]["key_prefix"] == sessions[0]["aws_access_key_id"][:4] != "test"

    sid = result["submission_id"]
    places = {
        "task log": capsys.readouterr().out + "\n".join(r.getMessage() for r in caplog.records),
        "xcom": json.dumps(ti.xcoms, default=str) + json.dumps(result, default=str),
        "rendered template fields": json.dumps({f: getattr(op, f) for f in op.template_fields}, default=str),
        "trigger kwargs": json.dumps(trigger.serialize(), default=str),
        "trigger event": json.dumps(event.payload, default=str),
        "ray job info": json.dumps(ray_hook.get_job_info(sid)),
        "ray job list": json.dumps(ray_hook.list_jobs()),
        "ray job log": ray_hook.get_job_logs(sid),
    }
    assert "Forwarding AWS session credentials" in places["task log"]  # the search looked at the real log
    assert "session credentials forwarded with the job" in places["ray job log"]
    secrets = {
        **connections,
        "session_key_id": sessions[0]["aws_access_key_id"],
        "session_secret": sessions[0]["aws_secret_access_key"],
        "session_token": sessions[0]["aws_session_token"],
    }
    leaks = [(name, where) for name, value in secrets.items() for where, text in places.items() if value in text]
    assert leaks == []
