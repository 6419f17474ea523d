"""The finish step for a job that failed: the exception class the failure decides (the runtime's verdict,
else Ray's job info), the message that ends with the log's last lines and what to do, and the failed
attempt's record completed with its final class."""

from __future__ import annotations

import json
import os

import pytest

from airflow_provider_horovod.contract import META_ATTEMPT, META_RESULT_URI, META_STORAGE_URI, result_uri
from airflow_provider_horovod.documents import ResultRecord
from airflow_provider_horovod.exceptions import CapacityError, ConfigurationError, InfrastructureError, UserCodeError
from airflow_provider_horovod.failures import Failure, FailureClass
from airflow_provider_horovod.jobs.events import JobEvent
from airflow_provider_horovod.jobs.finish import finish
from airflow_provider_horovod.storage import Storage
from unit.jobs.test_finish import SID, URL, Run


def failed_event(
    run, status="FAILED", *, error_type="JOB_ENTRYPOINT_COMMAND_ERROR", exit_code=1, tail=(), verdict=None
):
    metadata = {META_RESULT_URI: result_uri(run.storage_uri, 1), META_ATTEMPT: "1", META_STORAGE_URI: run.storage_uri}
    return JobEvent.from_info(
        SID,
        {
            "status": status,
            "error_type": error_type,
            "message": "driver exited 1 ",
            "driver_exit_code": exit_code,
            "metadata": metadata,
        },
        log_tail=list(tail),
        failure=verdict.to_dict() if verdict else None,
    )


USER_BUG = Failure(
    FailureClass.USER_CODE,
    "ZeroDivisionError: division by zero",
    rank=1,
    error_type="ZeroDivisionError",
    message="division by zero",
    traceback='Traceback (the function\'s own frames):\n  File "/dags/train.py", line 7, in train\n    return 1 / 0\n',
)


def test_a_users_error_ends_the_log_with_the_class_rank_exception_frames_and_what_to_do(tmp_path):
    run = Run(tmp_path)
    event = failed_event(run, tail=["Traceback ...", "ray.train.WorkerGroupError: ..."], verdict=USER_BUG)
    with pytest.raises(UserCodeError) as err:
        finish(event, dashboard_url=URL, storage=Storage(), try_number=1)
    message = str(err.value)
    assert message.startswith(f"Ray job {SID} ended FAILED (JOB_ENTRYPOINT_COMMAND_ERROR): driver exited 1\n")
    lines = message.splitlines()
    assert lines[1] == "user code, rank 1: ZeroDivisionError: division by zero"
    assert 'File "/dags/train.py", line 7, in train' in message
    assert "return 1 / 0" in message
    assert lines[-1].startswith("What to do: fix the function")
    assert "WorkerGroupError" not in message  # Ray's wrapping is the streamed log's, not the answer's
    assert (err.value.status, err.value.error_type) == ("FAILED", "JOB_ENTRYPOINT_COMMAND_ERROR")
    assert err.value.submission_id == SID
    assert err.value.failure["failure_class"] == "user_code"
    assert not os.path.exists(run.consumed)


@pytest.mark.parametrize(
    "status, exit_code, error_type, expected",
    [
        ("FAILED", -9, "JOB_ENTRYPOINT_COMMAND_ERROR", InfrastructureError),  # the driver killed (OOM)
        ("FAILED", 137, "JOB_ENTRYPOINT_COMMAND_ERROR", InfrastructureError),
        ("FAILED", None, "RUNTIME_ENV_SETUP_FAILURE", ConfigurationError),
        ("FAILED", None, "JOB_SUPERVISOR_ACTOR_DIED", InfrastructureError),
        ("STOPPED", None, None, InfrastructureError),
    ],
)
def test_without_the_runtimes_verdict_rays_job_info_decides_and_the_log_tail_comes_first(
    tmp_path, status, exit_code, error_type, expected
):
    run = Run(tmp_path)
    event = failed_event(run, status, error_type=error_type, exit_code=exit_code, tail=["Traceback:", "Killed"])
    with pytest.raises(expected) as err:
        finish(event, dashboard_url=URL, storage=Storage(), try_number=1)
    message = str(err.value)
    assert f"Ray job {SID} ended {status}" in message
    assert "Last lines of the job's log:\nTraceback:\nKilled\n" in message
    assert message.splitlines()[-1].startswith("What to do: ")
    assert not os.path.exists(run.consumed)


def test_the_failed_attempts_record_is_completed_with_the_final_class_and_the_logs_last_lines(tmp_path):
    run = Run(tmp_path)
    # What the runtime wrote (its history so far, its timings), before the Airflow side completes it.
    Storage().write_json(
        result_uri(run.storage_uri, 1),
        {
            "submission_id": SID,
            "attempt": 1,
            "storage_uri": run.storage_uri,
            "run_uri": run.run_uri,
            "history": [{"report": 1, "metrics": {"loss": 1.0}}],
            "timings": {"total_s": 4.0},
            "failure": USER_BUG.to_dict(),
        },
    )
    with pytest.raises(UserCodeError):
        finish(failed_event(run, tail=["a", "b"], verdict=USER_BUG), dashboard_url=URL, storage=Storage(), try_number=1)
    record = ResultRecord.from_json(open(result_uri(run.storage_uri, 1)).read())
    assert record.failure["failure_class"] == "user_code"
    assert record.failure["rank"] == 1
    assert record.log_tail == ["a", "b"]
    assert record.history[0]["metrics"] == {"loss": 1.0}

    # A killed driver wrote nothing: the Airflow side writes the post-mortem itself.
    other = Run(tmp_path / "other")
    with pytest.raises(InfrastructureError):
        finish(failed_event(other, exit_code=-9, tail=["Killed"]), dashboard_url=URL, storage=Storage(), try_number=1)
    written = json.loads(open(result_uri(other.storage_uri, 1)).read())
    assert written["failure"]["failure_class"] == "infrastructure"
    assert written["log_tail"] == ["Killed"]


def test_an_error_event_of_the_wait_keeps_its_class(tmp_path):
    event = JobEvent.error(SID, "Ray job x stayed PENDING for 700 s", failure_class=FailureClass.CAPACITY)
    with pytest.raises(CapacityError) as err:
        finish(event, dashboard_url=URL, storage=Storage(), try_number=1)
    assert err.value.status is None
    assert "capacity: Ray job x stayed PENDING for 700 s" in str(err.value)


class ComesBack(Storage):
    """Local storage that does not answer its first ``down`` reads, as S3 in an outage that passes."""

    def __init__(self, down: int):
        super().__init__()
        self.down = down

    def read_text(self, uri):
        from botocore.exceptions import EndpointConnectionError

        from airflow_provider_horovod.exceptions import StorageUnavailableError

        if self.down > 0:
            self.down -= 1
            raise StorageUnavailableError(f"the S3 endpoint does not answer: {uri}") from EndpointConnectionError(
                endpoint_url="http://s3.test"
            )
        return super().read_text(uri)


def test_a_failed_attempts_record_is_kept_through_a_storage_outage_that_passes(tmp_path):
    # The chaos run's S3 outage: the job failed on it, and the Airflow side met it too as it read the attempt.
    run = Run(tmp_path)
    storage = ComesBack(down=1)
    with pytest.raises(InfrastructureError):
        finish(failed_event(run, exit_code=-9, tail=["Killed"]), dashboard_url=URL, storage=storage, try_number=1)
    assert storage.down == 0  # the outage was met
    written = json.loads(open(result_uri(run.storage_uri, 1)).read())
    assert written["failure"]["failure_class"] == "infrastructure"
