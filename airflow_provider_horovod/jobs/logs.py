"""Following a job's log into the task log: how far it was streamed (the cursor), and which lines
of what was fetched are new. Pure; the hook fetches, the wait shells write the lines."""

from __future__ import annotations

import dataclasses
from typing import Any

# Where a task keeps its cursor: in its task_state_store (it outlives a try, so a retry that
# re-attaches repeats no line) and, while deferred, in an XCom the trigger reads after a triggerer
# restart (a restarted trigger gets its kwargs as they were at defer time). The operator pushes the
# XCom before deferring, so the trigger always finds one.
LOG_CURSOR_KEY = "ray_log_cursor"


@dataclasses.dataclass(frozen=True)
class LogCursor:
    """How many lines of a job's log are already in the task log."""

    submission_id: str
    lines: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any, submission_id: str) -> LogCursor:
        """The saved cursor when it is one of this job's; else the start of the log."""
        if isinstance(data, dict) and data.get("submission_id") == submission_id:
            return cls(submission_id, int(data.get("lines") or 0))
        return cls(submission_id)

    def furthest(self, other: LogCursor) -> LogCursor:
        return self if self.lines >= other.lines else other


def new_lines(text: str, cursor: LogCursor, *, final: bool = False) -> tuple[list[str], LogCursor]:
    """Complete lines of the whole log ``text`` after the cursor, and the advanced cursor.

    An unterminated last line is held back (it may still grow) unless the log is ``final``.
    """
    lines = text.split("\n")
    complete = lines[:-1]
    if final and lines[-1]:
        complete.append(lines[-1])
    fresh = complete[cursor.lines:]
    return fresh, dataclasses.replace(cursor, lines=max(cursor.lines, len(complete)))


def tail(text: str, n: int) -> list[str]:
    return text.splitlines()[-n:] if n else []
