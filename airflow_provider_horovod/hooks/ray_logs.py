"""Reading what is new in a job's log, at a cost that follows what is new, not the log's length.

Ray's State API reads the last N lines of a node's log file by seeking from its end
(``/api/v0/logs/file?node_id=<driver node>&filename=job-driver-<id>.log&lines=N``); the Jobs API
returns the whole log (``/api/jobs/<id>/logs``), and its websocket (``/logs/tail``) closes at once
with no data behind Ray 2.60's subprocess-proxied dashboard. So each poll asks for a window about as
long as what came new last time plus the cursor's last lines, places it (``jobs.logs.place``), and
asks for a longer one only when the window cannot tell. A log that has gone quiet is read less and
less often (every poll, then every 2, 4, ... polls, up to ``QUIET_READ_S`` or ``QUIET_READ_POLLS``
polls, whichever is longer), and at every poll again once a line arrives: the job's status is still
asked at each poll, and its log is read once more when it ends, so no line is lost, only shown later.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_horovod.exceptions import HorovodProviderError
from airflow_provider_horovod.jobs.logs import TAIL_LINES, LogCursor, Window, place
from airflow_provider_horovod.jobs.protocol import LOG_TAIL_LINES

if TYPE_CHECKING:
    from airflow_provider_horovod.hooks.ray import RayHook

MIN_WINDOW = 2 * TAIL_LINES
# The longest a quiet log goes unread: how late a line after a quiet spell may reach the task log,
# in seconds or polls, whichever is longer (a slower poll interval asks for less freshness). A log
# read costs about two status polls; quiet logs add at most 1/QUIET_READ_POLLS of that per poll (figure 4).
QUIET_READ_S = 30.0
QUIET_READ_POLLS = 6


class LogReader:
    """The new lines of one job's log, poll after poll. In memory: the window size, and the log's
    last lines (a failure's message shows them); the cursor is what travels between tries."""

    def __init__(self, submission_id: str) -> None:
        self.submission_id = submission_id
        self.window = MIN_WINDOW
        self.last_lines: list[str] = []
        self.partial = ""
        self.gap: str | None = None  # why the log could not be read, once told
        self.quiet_s = 0.0  # how long the log has been read without anything new: the next read's delay
        self.next_read_at = 0.0

    def due(self, now: float) -> bool:
        return now >= self.next_read_at

    def schedule(self, new_lines: int, now: float, poll_interval_s: float) -> None:
        """After a read at ``now`` that brought ``new_lines``: at the next poll if anything came,
        else twice as late as last time, up to the longest quiet delay (never sooner than the next poll)."""
        longest = max(QUIET_READ_S, QUIET_READ_POLLS * poll_interval_s)
        self.quiet_s = 0.0 if new_lines else min(max(2 * self.quiet_s, poll_interval_s), longest)
        self.next_read_at = now + self.quiet_s

    async def read(self, hook: RayHook, info: dict | None, cursor: LogCursor, *, final: bool = False) -> list[str]:
        """The complete lines after the cursor (with the unterminated last one when ``final``).

        Raises ``HorovodProviderError`` when the log cannot be read (its node is gone)."""
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
                    "lines): it was truncated or rotated")
            new = place(window, cursor)
            if new is not None:
                break
            asked *= 2
        # Next time: room for as much as came new this time, and the cursor's own lines.
        self.window = max(MIN_WINDOW, 2 * (len(new) + TAIL_LINES))
        self.last_lines = (window.lines + ([window.partial] if window.partial else []))[-LOG_TAIL_LINES:]
        self.partial = window.partial
        return new

    async def last(self, hook: RayHook, info: dict | None) -> list[str]:
        """The log's last lines (a failure's message shows them)."""
        node = (info or {}).get("driver_node_id")
        text = await hook.a_get_log_tail(node, self.submission_id, LOG_TAIL_LINES) if node else None
        if not text:
            return []
        window = Window.of(text, LOG_TAIL_LINES)
        return (window.lines + ([window.partial] if window.partial else []))[-LOG_TAIL_LINES:]
