"""A job's log, followed into the task log at a cost that follows what is new, not the log's length.

Ray's State API reads the last N lines of a node's log file by seeking from its end
(``/api/v0/logs/file?node_id=<driver node>&filename=job-driver-<id>.log&lines=N``) but takes no
offset; the Jobs API returns the whole log. So the cursor counts the lines streamed since the log's
start and keeps digests of the last ``TAIL_LINES`` of them, and each read asks for a window of the
log's end about as long as what came new last time plus those lines, and places it by finding them
in it (``place``). Where the window cannot tell (it is shorter than what is new, or the log repeats
itself), a twice longer one is asked for, up to the whole log, where the count alone places them.

The limit: the cursor's last lines are found where they last occur. When they recur later in the
log (a block longer than ``TAIL_LINES`` lines that repeats, or another run of the same line) and
more came between two reads than the window holds, the window is placed at the recurrence and the
lines between are lost from the task log (never from Ray's log). Otherwise no line is lost or shown
twice, across polls, re-attaches, retries and triggerer restarts.

The log is read at every poll, a quiet one too: a line after a quiet spell reaches the task log at
the next poll. Where one triggerer waits for many jobs, that is most of its work, their statuses
coming from one list (``hooks.ray_transport.JobBoard``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_horovod.contract import FAILURE_MARK, LOG_TAIL_LINES
from airflow_provider_horovod.exceptions import HorovodProviderError
from airflow_provider_horovod.failures import GLOO_REASON

if TYPE_CHECKING:
    from airflow_provider_horovod.jobs.api import RayJobsApi

# Digests of the cursor's last lines (8 hex digits each: a cursor stays small enough for XCom).
TAIL_LINES = 32
MIN_WINDOW = 2 * TAIL_LINES


def digest(line: str) -> str:
    return hashlib.blake2b(line.encode("utf-8", "replace"), digest_size=4).hexdigest()


@dataclasses.dataclass(frozen=True)
class LogCursor:
    """How many lines of a job's log are already in the task log, and digests of the last of them."""

    submission_id: str
    lines: int = 0
    tail: tuple[str, ...] = ()
    # When the job last showed progress (a new line; its start while running), epoch seconds.
    progress_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "submission_id": self.submission_id,
            "lines": self.lines,
            "tail": list(self.tail),
            "progress_at": self.progress_at,
        }

    @classmethod
    def from_dict(cls, data: Any, submission_id: str) -> LogCursor:
        """The saved cursor when it is one of this job's; else the start of the log."""
        if isinstance(data, dict) and data.get("submission_id") == submission_id:
            return cls(
                submission_id,
                int(data.get("lines") or 0),
                tuple(data.get("tail") or ()),
                float(data.get("progress_at") or 0.0),
            )
        return cls(submission_id)

    def furthest(self, other: LogCursor) -> LogCursor:
        return self if self.lines >= other.lines else other

    def advanced(self, lines: Sequence[str], now: float | None = None) -> LogCursor:
        """The cursor after ``lines`` more (seen at ``now``, when given: progress)."""
        if not lines:
            return self
        tail = (*self.tail, *(digest(line) for line in lines[-TAIL_LINES:]))[-TAIL_LINES:]
        return LogCursor(self.submission_id, self.lines + len(lines), tail, now or self.progress_at)


@dataclasses.dataclass(frozen=True)
class Window:
    """The end of a log as fetched: its last complete lines, and an unterminated last line."""

    lines: list[str]
    partial: str = ""
    whole: bool = False  # the window starts at the log's first line

    @classmethod
    def of(cls, text: str, asked: int) -> Window:
        """The window of ``text``, Ray's answer for the last ``asked`` lines."""
        lines = text.split("\n")
        partial = lines.pop()
        return cls(lines, partial, whole=len(lines) + (1 if partial else 0) < asked)


def place(window: Window, cursor: LogCursor) -> list[str] | None:
    """The complete lines of ``window`` after the cursor's; None when the window cannot tell (it is
    shorter than what is new, or the cursor's last lines recur in it): ask for a longer one."""
    if window.whole:
        return window.lines[cursor.lines :]
    if len(cursor.tail) < TAIL_LINES:
        # The cursor is in the log's first lines (or has no digests): so few lines recur by chance
        # (a blank line, a banner) and would be found in the wrong place. Only the whole log places
        # it; that log is hardly longer than what is new.
        return None
    digests = [digest(line) for line in window.lines]
    k = len(cursor.tail)
    found = [p for p in range(len(digests) - k + 1) if tuple(digests[p : p + k]) == cursor.tail]
    if len(found) != 1:
        return None
    start = found[0]
    # Lines that repeat themselves with a shift (a run of identical lines: every shift) may be the
    # cursor's own only in part, its first ones before the window: then the window shows fewer of the
    # new lines than came. Only a shift longer than the lines the window shows before them rules it out.
    tail = cursor.tail
    if any(tail[shift:] == tail[: k - shift] for shift in range(start + 1, k)):
        return None
    return window.lines[start + k :]


def lines_after(text: str, count: int) -> list[str]:
    """The lines of a whole log after its first ``count`` (its unterminated last line included)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines[count:]


class LogReader:
    """The new lines of one job's log, read after read. It keeps in memory the window size and the
    log's last lines (a failure's message shows them); the cursor is what travels
    between tries. Its own notices (the log cannot be read) wait in ``notices`` for the task log."""

    def __init__(self, submission_id: str) -> None:
        self.submission_id = submission_id
        self.notices: list[tuple[int, str]] = []
        self.window = MIN_WINDOW
        self.last_lines: list[str] = []
        # Gloo's reason for a worker's abort, kept past the tail (a native stack dump follows it).
        self.network_line: str | None = None
        self.gap: str | None = None  # why the log could not be read, once told

    async def new_lines(self, hook: RayJobsApi, info: dict | None, cursor: LogCursor, *, ended: bool) -> list[str]:
        """The lines after the cursor (with the unterminated last one once the job has ended). When the
        log cannot be read (its node gone), one notice says so, and the rest is read from the whole
        log once the job has ended."""
        lines: list[str] = []
        if self.gap is None:
            try:
                lines = await self._window(hook, info, cursor, final=ended)
            except HorovodProviderError as err:
                self.gap = str(err)
                self.notices.append(
                    (
                        logging.WARNING,
                        f"The job's log cannot be read from line {cursor.lines + 1} on ({err}); "
                        "its rest is read once the job ends.",
                    )
                )
        if self.gap is not None and ended:
            lines = await self._whole(hook, cursor)
        self.network_line = next((line for line in reversed(lines) if GLOO_REASON.search(line)), self.network_line)
        return lines

    def take_notices(self) -> list[tuple[int, str]]:
        """The notices since the last call, for the task log."""
        taken, self.notices = self.notices, []
        return taken

    @property
    def tail(self) -> list[str]:
        """The log's last lines, after Gloo's reason where the job's log had one before them."""
        if self.network_line is None or self.network_line in self.last_lines:
            return self.last_lines
        return [self.network_line, *self.last_lines]

    async def read_last(self, hook: RayJobsApi, info: dict | None) -> None:
        """Only the log's last lines, for a failure's message (the log was not streamed)."""
        node = (info or {}).get("driver_node_id")
        try:
            text = await hook.a_get_log_tail(node, self.submission_id, LOG_TAIL_LINES) if node else None
        except HorovodProviderError:  # its node is gone: the whole log, from the head
            try:
                text = await hook.a_get_job_logs(self.submission_id)
            except HorovodProviderError:
                text = None
        if text:
            window = Window.of(text, LOG_TAIL_LINES)
            self.last_lines = (window.lines + ([window.partial] if window.partial else []))[-LOG_TAIL_LINES:]

    async def _whole(self, hook: RayJobsApi, cursor: LogCursor) -> list[str]:
        try:
            text = await hook.a_get_job_logs(self.submission_id)
        except HorovodProviderError as err:
            notice = f"The job's log from line {cursor.lines + 1} on cannot be read: {err}"
            self.notices.append((logging.WARNING, notice))
            return []
        self.last_lines = text.splitlines()[-LOG_TAIL_LINES:]
        return lines_after(text, cursor.lines)

    async def _window(self, hook: RayJobsApi, info: dict | None, cursor: LogCursor, *, final: bool) -> list[str]:
        """Raises ``HorovodProviderError`` when the log cannot be read."""
        node = (info or {}).get("driver_node_id")
        if not node:
            return []  # the driver has not started: no log yet
        asked = max(self.window, LOG_TAIL_LINES) if final else self.window
        while True:
            text = await hook.a_get_log_tail(node, self.submission_id, asked)
            if text is None:
                return []  # the driver has not written its log yet
            window = Window.of(text, asked)
            if final and window.partial:
                # The job has ended: its unterminated last line is complete, and is one of the lines
                # the cursor counts once streamed (a re-attach to the ended job finds it there).
                window = Window([*window.lines, window.partial], whole=window.whole)
            if window.whole and len(window.lines) < cursor.lines:
                raise HorovodProviderError(
                    f"the log is shorter ({len(window.lines)} lines) than what was already streamed ({cursor.lines} "
                    "lines): it was truncated or rotated"
                )
            new = place(window, cursor)
            if new is not None:
                break
            asked *= 2
        # Next time: room for as much as came new this time, and the cursor's own lines.
        self.window = max(MIN_WINDOW, 2 * (len(new) + TAIL_LINES))
        self.last_lines = (window.lines + ([window.partial] if window.partial else []))[-LOG_TAIL_LINES:]
        return new


# --- what of the job's log is the user's ---------------------------------------------------------------

# The "(RayTrainWorker pid=123, ip=10.0.0.2)" Ray puts before the lines of an actor or a task, and
# "(raylet)" before a node's own notices; in colour ("\x1b[36m(...)\x1b[0m"), which is matched without.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SOURCE = re.compile(r"^\((?:[\w.:-]+ pid=\d+|raylet)(?:, ip=[\d.:a-f]+)?\) ")
_GLOG = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+ ([DIWEF]) \d+ \d+\] ")
_RAY_PYTHON_LOG = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\t(DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+\.py:\d+ -- "
)
# Horovod's C++ log: "[2026-11-24 11:50:03.428569: E /path/operations.cc:697] ..."
_HOROVOD_LOG = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: ([TDIWEF]) /\S+:\d+\] ")
_GLOG_LEVELS = {
    "T": logging.DEBUG,
    "D": logging.DEBUG,
    "I": logging.INFO,
    "W": logging.WARNING,
    "E": logging.ERROR,
    "F": logging.CRITICAL,
}
# What Ray's own libraries (not the user's code) print: Ray Data's notices and warnings, a native
# stack dump after a crash (abseil's failure signal handler, glog's), Python's fatal error report.
_RAY_OWN = re.compile(
    "|".join(
        [
            r"/site-packages/ray/.*: \w*Warning: ",
            r"^\s+warnings\.warn\(",
            r"ExecutionOptions\.\w+ is deprecated",
            r"^\*\*\* (SIG\w+ received|Aborted at|Check failure)",
            r"^PC: @ ",
            r"^\s+@\s+0x[0-9a-f]+\s",
            r"^\s*/\S+\.so(\.\d+)*\([^)]*\) \[0x[0-9a-f]+\]",  # a native frame: lib.so(+0x..) [0x..] symbol
            r"^Fatal Python error: ",
            r"^Extension modules: ",
            r"^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\)",
            r'^\s+File ".*", line \d+ in \S+$',
            r"^terminate called after throwing an instance of '",
            r"^\s+what\(\):\s+\[",
        ]
    )
)
# A warning of Ray's code; Python prints the line of code that warned below it, indented.
_RAY_WARNING = re.compile(r"/site-packages/ray/.*: \w*Warning: ")
# Ray's " [repeated 2x across cluster]" after a line it deduplicated (the first time with a note).
_REPEATED = re.compile(r" \[repeated \d+x across cluster\]( \(Ray deduplicates logs [^)]*\))?$")
# Ray's own notices that ask nothing of the user, at whatever level Ray prints them: folded at INFO, so
# that a WARNING or an ERROR in the task log is one to act on (docs/reliability.md, "The job's log").
# Each as Ray 2.60 prints it in a training's log (tests/unit/jobs/test_logs_folding.py keeps the lines).
_NOISE = re.compile(
    "|".join(
        [
            # Ray's progress bars, off without tqdm (a WARNING of the driver's Ray Data).
            r"\btqdm is not installed\b",
            # Ray Train's own preemption watcher is a restartable actor with arguments in the object
            # store, which the core worker reports as an E line at every training's start.
            r"core_worker\.cc:\d+: Actor with class name: 'PreemptionWatcher' .*max_restarts > 0",
            # The raylet counting worker processes started at once: Ray Train's actors for the controller,
            # the workers and Ray Data's coordinators, on a node of few CPUs ("WARNING: 8 PYTHON ...").
            r"worker processes have been started on node: .* the maximum expected startup concurrency",
        ]
    )
)


def ray_level(line: str) -> int | None:
    """The level of a line Ray's own code printed (folded in the task log); None for the user's."""
    text = _REPEATED.sub("", _SOURCE.sub("", _ANSI.sub("", line)))
    if _NOISE.search(text):
        return logging.INFO
    if found := _GLOG.match(text) or _HOROVOD_LOG.match(text):
        return _GLOG_LEVELS[found[1]]
    if found := _RAY_PYTHON_LOG.match(text):
        return getattr(logging, found[1])
    if FAILURE_MARK.rstrip() in text:
        return logging.DEBUG  # the runtime's verdict, for the Airflow side: the task's error tells it
    return logging.INFO if _RAY_OWN.search(text) else None


# Tracebacks of Ray's own code that ask nothing of the user, in a successful run too: the line before
# each, and its last line (the exception). A frame of Ray's code must be in it.
_NOISE_TRACEBACKS = [
    # Python's report of a Ray Data thread that Ray interrupted (an iterator closed, a split finished).
    (re.compile(r"^Exception in thread \S+:$"), re.compile(r"^InterruptedError\b")),
    # Ray Train's autoscaling coordinator timing out on a busy node, which Ray itself calls safe to ignore.
    (
        re.compile(r"^Failed to send resource request for \S+\. .*safe to ignore"),
        re.compile(r"^ray\.exceptions\.GetTimeoutError\b"),
    ),
]
_RAY_FRAME = re.compile(r'^\s+File ".*/site-packages/ray/')


def _source_and_text(line: str) -> tuple[str, str]:
    plain = _ANSI.sub("", line)
    found = _SOURCE.match(plain)
    return (found[0], plain[found.end() :]) if found else ("", plain)


def ray_noise_tracebacks(lines: Sequence[str]) -> set[int]:
    """The positions of the lines of Ray's known noisy tracebacks (``_NOISE_TRACEBACKS``), the line
    before each included. A traceback split between two reads of the log, or interleaved with another
    process's lines, is left as it is."""
    found: set[int] = set()
    for start, line in enumerate(lines):
        source, text = _source_and_text(line)
        ends = [end for head, end in _NOISE_TRACEBACKS if head.match(text)]
        if not ends:
            continue
        block, in_ray = [start], False
        for position in range(start + 1, len(lines)):
            other, text = _source_and_text(lines[position])
            if other != source:
                break
            block.append(position)
            if position == start + 1:
                if text != "Traceback (most recent call last):":
                    break
                continue
            in_ray = in_ray or bool(_RAY_FRAME.match(text))
            if not text[:1].isspace():  # the exception's own line ends the traceback
                if in_ray and ends[0].match(text):
                    found.update(block)
                break
    return found


def task_log(lines: Sequence[str]) -> list[tuple[int, str]]:
    """The job's lines as the task log gets them: the user's at INFO; runs of Ray's own lines in a
    group that Airflow's log view folds (``::group::``), each at its own level."""
    out: list[tuple[int, str]] = []
    folded = warned = False
    noisy = ray_noise_tracebacks(lines)
    for position, line in enumerate(lines):
        level = logging.INFO if position in noisy else ray_level(line)
        text = _SOURCE.sub("", _ANSI.sub("", line))
        if level is None and folded and not text.strip():
            level = logging.INFO  # a blank line inside a native stack dump
        elif level is None and warned and text[:1].isspace():
            level = logging.INFO  # the line of Ray's code that warned
        warned = bool(_RAY_WARNING.search(text))
        if (level is not None) != folded:
            out.append((logging.INFO, "::group::Ray's own output" if not folded else "::endgroup::"))
            folded = not folded
        out.append((logging.INFO if level is None else level, f"[ray] {line}"))
    if folded:
        out.append((logging.INFO, "::endgroup::"))
    return out
