"""An attempt's record as the finish step reads it back from storage: the record the job wrote is
taken; one cut short, edited by hand, or another attempt's is refused by name (TrainingResultError,
or UserCodeError for a record without a checkpoint), never taken and never another exception. The
earlier attempts' files, read for the cost and the attempts list, are read whatever they hold."""

from __future__ import annotations

import json
import pathlib
import tempfile

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from airflow_provider_horovod.contract import META_MARK_TOKEN, result_uri, worker_groups_uri
from airflow_provider_horovod.exceptions import JobFailure, TrainingResultError
from airflow_provider_horovod.jobs.events import JobEvent
from airflow_provider_horovod.jobs.finish import finish
from airflow_provider_horovod.storage import Storage
from unit.jobs.test_finish import SID, URL, Run
from unit.properties.values import anything, json_values

RECORD_FIELDS = sorted(json.loads(Run(pathlib.Path("/x")).record().to_json()))


def finished(run: Run, event: JobEvent | None = None):
    return finish(event or run.event(), dashboard_url=URL, storage=Storage(), try_number=1)


def sealing_job(run: Run, sid: str = SID) -> JobEvent:
    """The event of a job of this provider's version (its metadata carries a mark token): its runtime
    sealed its record."""
    metadata = {**run.event().metadata, META_MARK_TOKEN: "0123456789abcdef"}
    return JobEvent.from_info(sid, {"status": "SUCCEEDED", "metadata": metadata})


def write_text(uri: str, text: str) -> None:
    Storage().write_bytes(uri, text.encode())


def test_a_record_copied_from_another_attempt_is_refused_by_name(tmp_path):
    run, other = Run(tmp_path, attempt=1), Run(tmp_path, attempt=2)
    run.write()  # the checkpoints of attempt 1
    copied = other.record(submission_id=SID.replace("-a1", "-a2"))
    write_text(result_uri(run.storage_uri, 1), copied.to_json())
    with pytest.raises(TrainingResultError, match="is that of Ray job .*-a2', attempt 2"):
        finished(run)
    assert run.marker() is None


def test_a_record_of_another_task_run_is_refused_by_name(tmp_path):
    run = Run(tmp_path)
    run.write(run.record(submission_id="ahp-dag-other-9876543210-a1"))
    with pytest.raises(TrainingResultError, match="is that of Ray job 'ahp-dag-other-9876543210-a1'"):
        finished(run)


def test_a_record_that_is_not_an_object_is_refused_by_name(tmp_path):
    run = Run(tmp_path)
    run.write()
    write_text(result_uri(run.storage_uri, 1), "[1, 2]")
    with pytest.raises(TrainingResultError, match="is not a JSON object"):
        finished(run)


def test_a_record_edited_by_hand_is_refused_by_name(tmp_path):
    run = Run(tmp_path)
    run.write()
    uri = result_uri(run.storage_uri, 1)
    edited = json.loads(Storage().read_text(uri) or "")
    edited["metrics"]["loss"] = 0.01
    write_text(uri, json.dumps(edited))
    with pytest.raises(TrainingResultError, match="does not match its checksum"):
        finished(run)
    assert run.marker() is None


def test_a_sealing_jobs_record_without_its_checksum_is_refused_by_name(tmp_path):
    run = Run(tmp_path)
    run.write()
    uri = result_uri(run.storage_uri, 1)
    unsealed = json.loads(Storage().read_text(uri) or "")
    del unsealed["checksum"]
    write_text(uri, json.dumps(unsealed))
    with pytest.raises(TrainingResultError, match="does not match its checksum"):
        finished(run, sealing_job(run))


def test_the_record_kept_with_its_cost_is_taken_again(tmp_path):
    """The finish step rewrites the record with the cost, sealed: a try that reads it again takes it."""
    run = Run(tmp_path)
    run.write()
    first = finished(run, sealing_job(run))
    assert "cost" in json.loads(Storage().read_text(result_uri(run.storage_uri, 1)) or "")
    assert finished(run, sealing_job(run))["checkpoint_uri"] == first["checkpoint_uri"]


# How a record file is garbled: cut short (at a fraction of its length), a field edited or removed,
# or replaced by any JSON.
garbles = st.tuples(
    st.sampled_from(["cut", "edited", "removed", "json"]),
    st.floats(0, 1, exclude_max=True),
    st.sampled_from(RECORD_FIELDS),
    anything,
    json_values,
)


def garbled(text: str, garble) -> str:
    kind, at, field, value, other = garble
    if kind == "cut":
        return text[: int(at * len(text))]
    if kind == "json":
        return json.dumps(other)
    record = json.loads(text)
    if kind == "removed":
        record.pop(field)
    else:
        record[field] = value
    return json.dumps(record, default=repr)


@given(garble=garbles)
def test_a_garbled_record_is_never_taken(garble):
    with tempfile.TemporaryDirectory() as root:
        run = Run(pathlib.Path(root))
        text = run.write().to_json()
        changed = garbled(text, garble)
        assume(json.loads(changed) != json.loads(text) if garble[0] == "edited" else True)
        write_text(result_uri(run.storage_uri, 1), changed)
        try:
            result = finished(run, sealing_job(run))
        except JobFailure as err:  # TrainingResultError, UserCodeError: the record named
            assert result_uri(run.storage_uri, 1) in str(err), err
            assert run.marker() is None
            return
        raise AssertionError(f"taken: {result}")


@given(record=json_values, groups=json_values)
def test_an_earlier_attempts_files_whatever_they_hold_do_not_break_the_finish(record, groups):
    with tempfile.TemporaryDirectory() as root:
        earlier, run = Run(pathlib.Path(root), attempt=1), Run(pathlib.Path(root), attempt=2)
        write_text(result_uri(earlier.storage_uri, 1), json.dumps(record))
        write_text(worker_groups_uri(earlier.run_uri), json.dumps(groups))
        sid = SID.replace("-a1", "-a2")
        run.write(run.record(submission_id=sid))
        event = JobEvent.from_info(sid, {"status": "SUCCEEDED", "metadata": run.event().metadata})
        result = finished(run, event)
        assert [a["attempt"] for a in result["attempts"]] == [1]
