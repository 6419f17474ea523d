"""The documents that cross the boundary between Airflow and the cluster (a job's spec, an attempt's
record, a task's result, a metric history): a valid one comes back the same through its JSON; text
that is cut short, garbled or of another shape is refused with ValueError naming the document (the
one error their readers handle), never taken and never another exception."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_horovod.documents import ResultRecord, TaskRecord, TaskSpec, TrainingSpec, training_result
from airflow_provider_horovod.runtime.history import sampled
from unit.properties.values import anything, json_values

names = st.text(min_size=1, max_size=12)
numbers = st.floats(allow_nan=False, allow_infinity=False)
common = {"submission_id": names, "storage_uri": names, "attempt": st.integers(1, 99)}
record_common = {**common, "run_uri": names, "timings": st.dictionaries(names, numbers, max_size=3)}
points = st.lists(
    st.fixed_dictionaries(
        {
            "report": st.integers(1, 10**6),
            "time": numbers,
            "metrics": st.dictionaries(names, numbers, max_size=3),
            "checkpoint": st.none() | names,
        }
    ),
    max_size=5,
)
DOCUMENTS = {
    TrainingSpec: st.builds(
        TrainingSpec,
        **common,
        num_workers=st.integers(1, 64) | st.lists(st.integers(1, 64), min_size=2, max_size=2),
        train_loop_config=st.dictionaries(names, json_values, max_size=3),
        horovod_env=st.dictionaries(names, names, max_size=2),
        mark_token=names,
    ),
    TaskSpec: st.builds(
        TaskSpec,
        **common,
        args=st.lists(json_values, max_size=3),
        kwargs=st.dictionaries(names, json_values, max_size=3),
    ),
    TaskRecord: st.builds(TaskRecord, **record_common, return_value=json_values),
    ResultRecord: st.builds(
        ResultRecord,
        **record_common,
        checkpoint_uri=st.none() | names,
        metrics=st.dictionaries(names, json_values, max_size=3),
        world_size=st.integers(0, 64),
        history=points,
    ),
}
KINDS = list(DOCUMENTS)


@pytest.mark.parametrize("kind", KINDS, ids=[k.__name__ for k in KINDS])
@given(data=st.data())
def test_a_valid_document_comes_back_the_same(kind, data):
    document = data.draw(DOCUMENTS[kind])
    assert kind.from_json(document.to_json()) == document


@pytest.mark.parametrize("kind", KINDS, ids=[k.__name__ for k in KINDS])
@given(data=st.data())
def test_a_document_cut_short_is_refused(kind, data):
    text = data.draw(DOCUMENTS[kind]).to_json()
    cut = text[: data.draw(st.integers(0, len(text) - 1))]
    with pytest.raises(ValueError):
        kind.from_json(cut)


@pytest.mark.parametrize("kind", KINDS, ids=[k.__name__ for k in KINDS])
@given(data=st.data())
def test_an_edited_document_is_refused_by_name_or_read_with_its_types(kind, data):
    fields = json.loads(data.draw(DOCUMENTS[kind]).to_json())
    if data.draw(st.booleans()):
        fields = data.draw(json_values)
    else:
        fields[data.draw(st.sampled_from(sorted(fields)))] = data.draw(anything)
    try:
        document = kind.from_json(json.dumps(fields, default=repr))
    except ValueError as err:
        assert kind.__name__ in str(err)
        return
    assert kind.from_json(document.to_json()) == document


@given(record=DOCUMENTS[ResultRecord], url=names)
def test_a_training_result_is_json_and_says_its_record(record, url):
    result = training_result(record, dashboard_url=url)
    assert json.loads(json.dumps(result)) == json.loads(json.dumps(dict(result)))
    assert (result["submission_id"], result["attempt"], result["checkpoint_uri"]) == (
        record.submission_id,
        record.attempt,
        record.checkpoint_uri,
    )


@given(history=points, limit=st.integers(2, 6))
def test_a_metric_history_is_sampled_to_its_bound_keeping_its_ends(history, limit):
    kept = sampled(history, limit)
    assert len(kept) == min(len(history), limit)
    assert kept[:1] == history[:1]
    assert kept[-1:] == history[-1:]
    assert all(point in history for point in kept)
