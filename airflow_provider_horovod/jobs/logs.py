"""Following a job's log into the task log: how far it was streamed (the cursor), and which lines of
a fetched window of the log's end are new. Pure; ``hooks.ray_logs`` fetches, the wait writes.

Ray reads the last N lines of a log cheaply (from the end of the file) but takes no offset. So the
cursor counts the lines streamed since the log's start and keeps digests of the last of them; a
window of the log's end is placed by finding those lines in it. Where the log repeats itself too
much to place them (runs of identical lines longer than the digests), or more is new than the
window holds, a longer window is asked for, up to the whole log, where the count alone places them:
nothing is lost or shown twice, across polls, re-attaches, retries and triggerer restarts.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import Any

# Digests of the cursor's last lines (8 hex digits each: a cursor stays small enough for XCom).
TAIL_LINES = 32

# Where a task keeps its cursor: in its task_state_store (it outlives a try, so a retry that
# re-attaches repeats no line) and, while deferred, in an XCom the trigger reads after a triggerer
# restart (a restarted trigger gets its kwargs as they were at defer time). The operator pushes the
# XCom before deferring, so the trigger always finds one.
LOG_CURSOR_KEY = "ray_log_cursor"


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
        return {"submission_id": self.submission_id, "lines": self.lines, "tail": list(self.tail),
                "progress_at": self.progress_at}

    @classmethod
    def from_dict(cls, data: Any, submission_id: str) -> LogCursor:
        """The saved cursor when it is one of this job's; else the start of the log."""
        if isinstance(data, dict) and data.get("submission_id") == submission_id:
            return cls(submission_id, int(data.get("lines") or 0), tuple(data.get("tail") or ()),
                       float(data.get("progress_at") or 0.0))
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
        return window.lines[cursor.lines:]
    if len(cursor.tail) < TAIL_LINES:
        # The cursor is in the log's first lines (or has no digests): so few lines recur by chance
        # (a blank line, a banner) and would be found in the wrong place. Only the whole log places
        # it; that log is hardly longer than what is new.
        return None
    digests = [digest(line) for line in window.lines]
    k = len(cursor.tail)
    found = [p for p in range(len(digests) - k + 1) if tuple(digests[p:p + k]) == cursor.tail]
    if len(found) != 1:
        return None
    start = found[0]
    # Lines that repeat themselves with a shift (a run of identical lines: every shift) may be the
    # cursor's own only in part, its first ones before the window: then the window shows fewer of the
    # new lines than came. Only a shift longer than the lines the window shows before them rules it out.
    tail = cursor.tail
    if any(tail[shift:] == tail[:k - shift] for shift in range(start + 1, k)):
        return None
    return window.lines[start + k:]


def lines_after(text: str, count: int) -> list[str]:
    """The lines of a whole log after its first ``count`` (its unterminated last line included)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines[count:]
