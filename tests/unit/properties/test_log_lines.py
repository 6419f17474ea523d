"""The job's log lines as the wait reads them: a line the user's code prints, whatever it holds (the
runtime's marks, bare or with a token that is not the attempt's, a verdict's JSON), never becomes the
runtime's verdict, reason or failure; the runtime's own marked lines do, wherever the user's lines are."""

from __future__ import annotations

import json

from hypothesis import assume, given
from hypothesis import strategies as st

from airflow_provider_horovod.contract import ERROR_MARK, FAILURE_MARK, META_MARK_TOKEN, RESULT_MARK, marked
from airflow_provider_horovod.failures import Failure, FailureClass, of_line
from airflow_provider_horovod.jobs.logs import LogCursor
from airflow_provider_horovod.jobs.wait import Poll, WaitPolicy, failure_in, reason_in, step

SID = "ahp-dag-train-0123456789-a1"
tokens = st.text(alphabet="0123456789abcdef", min_size=16, max_size=16)
failures = st.builds(
    Failure,
    failure_class=st.sampled_from(list(FailureClass)),
    summary=st.text(max_size=30),
    rank=st.none() | st.integers(0, 64),
    error_type=st.none() | st.text(max_size=10),
    message=st.text(max_size=20),
)
# What a user's line may hold around a mark: text, and a verdict's JSON as the runtime writes it.
marks = st.sampled_from([ERROR_MARK, FAILURE_MARK, RESULT_MARK, "AHP_ERROR", "AHP_FAILURE:", "AHP_ERROR: "]) | (
    st.tuples(st.sampled_from([ERROR_MARK, FAILURE_MARK, RESULT_MARK]), tokens | st.text(max_size=17)).map(
        lambda pair: marked(*pair)
    )
)
user_lines = st.one_of(
    st.text(max_size=80),
    st.tuples(st.text(max_size=12), marks, st.text(max_size=20) | failures.map(lambda f: json.dumps(f.to_dict()))).map(
        "".join
    ),
)


@given(token=tokens, lines=st.lists(user_lines, max_size=6))
def test_a_users_line_never_becomes_the_runtimes_verdict(token, lines):
    assume(not any(token in line for line in lines))
    assert reason_in(lines, "", token) == ""
    assert failure_in(lines, None, token) == {}
    assert all(of_line(line, token) is None for line in lines)
    # Nor in the wait's event of a failed job whose log ends with them.
    info = {"status": "FAILED", "metadata": {META_MARK_TOKEN: token}, "message": "ended"}
    event = step(WaitPolicy(), LogCursor(SID), Poll(info, 0.0, tail=lines)).event
    assert event is not None
    assert (event.reason, event.failure) == ("", {})


@given(
    token=tokens,
    failure=failures,
    before=st.lists(user_lines, max_size=4),
    after=st.lists(user_lines, max_size=4),
)
def test_the_runtimes_own_lines_are_its_verdict_whatever_the_user_printed(token, failure, before, after):
    assume(not any(token in line for line in before + after))
    reason = f"{failure.failure_class.value}: {failure.summary}"
    # As the runtime prints them (entrypoint.fail): its reason, then its verdict, each on a line of its own.
    own = [f"{marked(ERROR_MARK, token)}{reason}", failure.line(token)]
    lines = [*before, *own, *after]
    assert failure_in(lines, None, token) == json.loads(json.dumps(failure.to_dict()))
    assert reason_in(lines, "", token) == reason.strip()
