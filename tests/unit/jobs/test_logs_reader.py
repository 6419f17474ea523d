"""The ``LogReader`` against an in-memory log file that grows between polls and records every window
asked: each line written exactly once, the window as small as what is new, and what it does when
there is nothing to read or the log cannot be read."""

from __future__ import annotations

import asyncio
import json
import random
import re

import pytest

from airflow_provider_horovod.contract import LOG_TAIL_LINES
from airflow_provider_horovod.exceptions import HorovodProviderError
from airflow_provider_horovod.jobs.logs import MIN_WINDOW, TAIL_LINES, LogCursor, LogReader
from unit.fakes import NODE, log_tail
from unit.jobs.test_logs import SID, numbered

# --- the reader -------------------------------------------------------------------------------------

RUNNING = {"status": "RUNNING", "driver_node_id": NODE}


class LogFile:
    """The job's driver log on its node, behind ``hook.a_get_log_tail`` as Ray answers it: the last
    ``lines`` lines, an unterminated last line counting as one. Kept as lines, so that a read costs
    what it returns, as Ray's does (it seeks from the file's end), and a long log stays cheap here."""

    def __init__(self, text: str = "", *, exists: bool = True):
        self.complete: list[str] = []  # each with its "\n"
        self.partial = ""
        self.exists = exists
        self.asked: list[int] = []
        self.write(text)

    def write(self, text: str) -> None:
        pieces = (self.partial + text).split("\n")
        self.partial = pieces.pop()
        self.complete += [piece + "\n" for piece in pieces]

    @property
    def text(self) -> str:
        return "".join(self.complete) + self.partial

    async def a_get_job_logs(self, submission_id: str) -> str:
        return self.text

    async def a_get_log_tail(self, node_id: str, submission_id: str, lines: int) -> str | None:
        assert (node_id, submission_id) == (NODE, SID)
        self.asked.append(lines)
        if not self.exists:
            return None
        if self.partial:
            return ("".join(self.complete[-(lines - 1) :]) if lines > 1 else "") + self.partial
        return "".join(self.complete[-lines:])


def all_lines(text: str) -> list[str]:
    """Every line of an ended job's log, its unterminated last one included."""
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


class Follower:
    """The wait's use of a reader: read after the cursor, advance the cursor by what was read."""

    def __init__(self, log: LogFile, cursor: LogCursor | None = None):
        self.notices: list[str] = []
        self.log, self.reader = log, LogReader(SID)
        self.cursor = cursor or LogCursor(SID)
        self.streamed: list[str] = []
        self.asked_per_poll: list[list[int]] = []

    def poll(self, info: dict | None = RUNNING, *, final: bool = False) -> list[str]:
        before = len(self.log.asked)
        new = asyncio.run(self.reader.new_lines(self.log, info, self.cursor, ended=final))
        self.notices += [notice for _, notice in self.reader.take_notices()]
        self.asked_per_poll.append(self.log.asked[before:])
        self.streamed += new
        self.cursor = self.cursor.advanced(new)
        return new


def chunks(text: str, polls: int, seed: int) -> list[str]:
    cuts = [0, *sorted(random.Random(seed).sample(range(1, len(text)), polls)), len(text)]
    return [text[a:b] for a, b in zip(cuts, cuts[1:])]


READER_LOGS = {
    "distinct lines": numbered(800),
    "100 identical lines in a row": numbered(200) + "NCCL WARN retrying\n" * 100 + numbered(200, 200),
    "only identical lines": "epoch done\n" * 700,
    "blank lines and a last line never ended": "\n" * 40 + numbered(300) + "\n" * 70 + "Traceback: killed",
    "progress bars": "".join(f"{i}%|{'#' * (i // 10)}\r" for i in range(100)) + "\n" + numbered(200),
}


def test_the_fake_log_answers_as_ray():
    rng = random.Random(7)
    for _ in range(200):
        text = "".join(rng.choice(["a", "b", "\n", "\n\n", "xyz"]) for _ in range(rng.randint(0, 30)))
        log = LogFile(text)
        for lines in range(1, 12):
            assert asyncio.run(log.a_get_log_tail(NODE, SID, lines)) == log_tail(text, lines), (text, lines)


# --- exactly once ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(READER_LOGS))
@pytest.mark.parametrize("polls", [1, 9, 150])
def test_polls_of_a_growing_log_reproduce_it_exactly_once(name, polls):
    text = READER_LOGS[name]
    follower = Follower(LogFile())
    parts = chunks(text, polls, seed=polls)
    for i, part in enumerate(parts):
        follower.log.write(part)
        follower.poll(final=i == len(parts) - 1)
    assert follower.streamed == all_lines(text)
    assert follower.cursor.lines == len(all_lines(text))


def test_a_line_is_written_once_it_is_complete_and_the_last_one_when_the_job_ends():
    follower = Follower(LogFile("epoch 1\nepoch 2\nepo"))
    assert follower.poll() == ["epoch 1", "epoch 2"]
    assert follower.poll() == []
    follower.log.write("ch 3 done\nsaving checkp")
    assert follower.poll() == ["epoch 3 done"]
    follower.log.write("oint")
    assert follower.poll(final=True) == ["saving checkpoint"]
    assert follower.streamed == ["epoch 1", "epoch 2", "epoch 3 done", "saving checkpoint"]


def test_a_restarted_reader_continues_from_the_saved_cursor():
    text = numbered(300) + "same\n" * 90 + numbered(300, 300)
    parts = chunks(text, 40, seed=5)
    first = Follower(LogFile())
    for part in parts[:20]:
        first.log.write(part)
        first.poll()
    saved = json.loads(json.dumps(first.cursor.to_dict()))  # the XCom a restarted trigger reads
    second = Follower(first.log, LogCursor.from_dict(saved, SID))
    assert second.reader.window == MIN_WINDOW
    for i, part in enumerate(parts[20:]):
        second.log.write(part)
        second.poll(final=i == len(parts) - 21)
    assert first.streamed + second.streamed == all_lines(text)


def test_reattaching_to_an_ended_job_whose_last_line_was_never_ended_repeats_nothing():
    for text in ("a\nb\nkilled", numbered(500) + "killed"):
        follower = Follower(LogFile(text))
        assert follower.poll(final=True)[-1] == "killed"
        again = Follower(follower.log, follower.cursor)  # a retry finds the ended job
        assert again.poll(final=True) == []
        assert again.reader.last_lines[-1] == "killed"


# --- the cost follows what is new -----------------------------------------------------------------


def test_the_window_stays_small_while_the_log_grows_to_100000_lines():
    rate = 50
    follower = Follower(LogFile())
    for poll in range(100_000 // rate):
        # distinct lines, and now and then a short run of identical ones
        follower.log.write(numbered(rate - 5, poll * rate) + "heartbeat\n" * 5)
        follower.poll()
    asked = [n for per_poll in follower.asked_per_poll for n in per_poll]
    assert len(follower.log.complete) == follower.cursor.lines == 100_000
    assert max(asked) <= 2 * (rate + TAIL_LINES) < 200
    assert len(asked) == len(follower.asked_per_poll)  # one window a poll: no longer one was needed
    assert follower.streamed == [line[:-1] for line in follower.log.complete]


def test_a_burst_widens_the_window_for_one_poll_and_it_narrows_again():
    rng = random.Random(11)
    rates = [rng.choice([0, 1, 3, 10, 40]) for _ in range(200)]
    rates[50], rates[120] = 5000, 700
    follower = Follower(LogFile())
    written, previous = 0, 0
    for rate in rates:
        follower.log.write(numbered(rate, written))
        written += rate
        follower.poll()
        # A window as long as what came new this poll or the last, with the cursor's lines: never more.
        bound = max(MIN_WINDOW, 2 * (max(rate, previous) + TAIL_LINES + 1))
        assert max(follower.asked_per_poll[-1]) <= bound, (rate, previous, follower.asked_per_poll[-1])
        previous = rate
    assert follower.streamed == all_lines(numbered(written))
    assert follower.reader.window == max(MIN_WINDOW, 2 * (rates[-1] + TAIL_LINES))


# --- when there is nothing to read, or it cannot be read -------------------------------------------


@pytest.mark.parametrize("info", [None, {"status": "PENDING"}, {"status": "RUNNING", "driver_node_id": None}])
def test_no_driver_node_no_lines_and_no_read(info):
    follower = Follower(LogFile(numbered(10)))
    assert follower.poll(info) == []
    assert follower.log.asked == []
    asyncio.run(follower.reader.read_last(follower.log, info))
    assert follower.reader.last_lines == []
    assert follower.log.asked == []


def test_a_log_not_written_yet_has_no_lines():
    follower = Follower(LogFile(exists=False))
    assert follower.poll() == []
    assert follower.poll(final=True) == []
    assert follower.cursor.lines == 0
    assert follower.reader.last_lines == []
    follower.log.exists = True
    follower.log.write("hello\n")
    assert follower.poll() == ["hello"]


@pytest.mark.parametrize("final", [False, True])
def test_a_log_shorter_than_what_was_streamed_is_said_once_and_repeats_nothing(final):
    follower = Follower(LogFile(numbered(100)))
    follower.poll()
    follower.log.complete = follower.log.complete[:10]  # truncated, or rotated
    assert follower.poll(final=final) == []
    assert follower.poll(final=True) == []
    assert len(follower.notices) == 1
    assert re.search(
        r"cannot be read from line 101 on \(the log is shorter \(10 lines\) than what was already streamed "
        r"\(100 lines\): it was truncated or rotated\)",
        follower.notices[0],
    )


def test_a_log_that_cannot_be_read_while_the_job_runs_is_read_whole_once_it_has_ended():
    class NodeGone(LogFile):
        async def a_get_log_tail(self, node_id, submission_id, lines):
            raise HorovodProviderError("node gone")

    follower = Follower(NodeGone(numbered(5)))
    assert follower.poll() == []
    assert "cannot be read from line 1 on (node gone)" in follower.notices[0]
    follower.log.write(numbered(3, 5))
    assert follower.poll(final=True) == all_lines(numbered(8))
    assert len(follower.notices) == 1


def test_the_last_lines_for_a_failure_include_the_unterminated_one():
    follower = Follower(LogFile(numbered(100) + "RuntimeError: CUDA out of mem"))
    follower.poll()
    expected = all_lines(follower.log.text)[-LOG_TAIL_LINES:]
    assert follower.reader.last_lines == expected
    assert expected[-1] == "RuntimeError: CUDA out of mem"

    def last(log):
        reader = LogReader(SID)
        asyncio.run(reader.read_last(log, RUNNING))
        return reader.last_lines

    assert last(follower.log) == expected
    assert follower.log.asked[-1] == LOG_TAIL_LINES
    assert last(LogFile(exists=False)) == []
    assert last(LogFile("only line\n")) == ["only line"]
