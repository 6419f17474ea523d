"""The "Ray job" extra link: the task pushes the job's dashboard URL, the link reads it back."""

from types import SimpleNamespace

from airflow.sdk.bases.xcom import BaseXCom

from airflow_provider_horovod.documents import SubmittedJob
from airflow_provider_horovod.links.ray import RayJobLink
from airflow_provider_horovod.xcoms import push_job
from unit.fakes import FakeTI

URL = "http://ray-head:8265/#/jobs/ahp-d-t-0123456789-a1"


def test_the_link_reads_what_the_task_pushed(monkeypatch):
    ti = FakeTI()
    push_job(
        ti,
        SubmittedJob(
            submission_id="ahp-d-t-0123456789-a1",
            dashboard_url=URL,
            storage_uri="/s",
            attempt=1,
            kind="train",
            checkpoint_score_attribute=None,
            aws_conn_id=None,
        ),
    )
    link = RayJobLink()
    assert ti.xcoms[link.xcom_key] == URL
    assert link.name == "Ray job"

    asked = []
    ti_key = SimpleNamespace(dag_id="dag", task_id="train", run_id="r", map_index=-1, try_number=1)

    def get_value(*, ti_key, key):
        asked.append((ti_key, key))
        return ti.xcoms.get(key)

    monkeypatch.setattr(BaseXCom, "get_value", staticmethod(get_value))
    assert link.get_link(None, ti_key=ti_key) == URL
    assert asked == [(ti_key, link.xcom_key)]


def test_no_job_yet_no_link(monkeypatch):
    monkeypatch.setattr(BaseXCom, "get_value", staticmethod(lambda *, ti_key, key: None))
    assert RayJobLink().get_link(None, ti_key=SimpleNamespace()) == ""
