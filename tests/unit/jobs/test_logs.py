"""The log cursor: how far a job's log is in the task log, and which lines are new."""

from airflow_provider_horovod.jobs.logs import LogCursor, new_lines, tail


def test_cursor_round_trip_and_other_jobs():
    cursor = LogCursor("sid", 5)
    assert LogCursor.from_dict(cursor.to_dict(), "sid") == cursor
    assert LogCursor.from_dict(cursor.to_dict(), "other") == LogCursor("other", 0)
    assert LogCursor.from_dict(None, "sid") == LogCursor("sid") == LogCursor.from_dict("junk", "sid")
    assert LogCursor.from_dict({"submission_id": "sid", "lines": None}, "sid").lines == 0


def test_furthest():
    a, b = LogCursor("s", 2), LogCursor("s", 9)
    assert a.furthest(b) is b and b.furthest(a) is b


def test_new_lines_across_polls():
    cursor = LogCursor("s")
    lines, cursor = new_lines("a\nb\npart", cursor)
    assert lines == ["a", "b"] and cursor.lines == 2
    lines, cursor = new_lines("a\nb\npartial line\nc\n", cursor)
    assert lines == ["partial line", "c"] and cursor.lines == 4
    lines, cursor = new_lines("a\nb\npartial line\nc\nlast", cursor, final=True)
    assert lines == ["last"] and cursor.lines == 5
    assert new_lines("", LogCursor("s"), final=True) == ([], LogCursor("s", 0))


def test_a_shorter_log_never_moves_the_cursor_back():
    lines, cursor = new_lines("a\n", LogCursor("s", 3))
    assert lines == [] and cursor.lines == 3


def test_identical_lines_are_neither_lost_nor_doubled():
    cursor = LogCursor("s")
    first, cursor = new_lines("x\nx\n", cursor)
    second, cursor = new_lines("x\nx\nx\nx\nx", cursor)
    third, cursor = new_lines("x\nx\nx\nx\nx\n", cursor, final=True)
    assert first + second + third == ["x"] * 5


def test_tail():
    assert tail("1\n2\n3\n", 2) == ["2", "3"]
    assert tail("1\n2", 0) == []
    assert tail("", 5) == []
