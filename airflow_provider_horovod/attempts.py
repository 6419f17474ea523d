"""What one attempt (one Ray job) left in its storage folder, read at once into a snapshot: its result
record as written, rank 0's notes of its worker groups, its live metrics history, and the checkpoint
folders that still hold files. The finish step and the Training view both work from such snapshots.

A file that cannot be read is said in the snapshot (``unread``), not raised: each reader decides what
a missing or unreadable file means to it (the finish step fails on its own record only).
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from airflow_provider_horovod.contract import HISTORY_FILE, attempt_uri, result_uri, worker_groups_uri

if TYPE_CHECKING:
    from airflow_provider_horovod.storage import Storage


@dataclasses.dataclass(frozen=True)
class AttemptFiles:
    """The files of attempt ``attempt`` of the task run stored at ``storage_uri``, as read.

    :param record: the result record as written (fields this provider does not know included); None
        while the job runs, or when it ended without one.
    :param worker_groups: rank 0's note of each start of the attempt's workers (``{"started_at",
        "world_size", "reason"}``); empty when not read or none.
    :param history: rank 0's reports, rewritten after each (None: none yet, or not read).
    :param checkpoints: names of the attempt's folders that hold files: the checkpoints Ray still
        keeps (None: not listed).
    :param unread: why a file could not be read, by the name of the field it would fill.
    """

    storage_uri: str
    attempt: int
    record: dict[str, Any] | None = None
    worker_groups: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    history: list[dict[str, Any]] | None = None
    checkpoints: frozenset[str] | None = None
    unread: dict[str, Exception] = dataclasses.field(default_factory=dict)

    @property
    def folder(self) -> str:
        return attempt_uri(self.storage_uri, self.attempt)

    @property
    def record_uri(self) -> str:
        return result_uri(self.storage_uri, self.attempt)

    def checkpoint_uri(self, name: str) -> str:
        return f"{self.folder}/{name}"

    def named_checkpoints(self) -> bool:
        """Whether a report of the history (the live one, else the record's) saved a named checkpoint."""
        points = self.history if self.history is not None else (self.record or {}).get("history") or []
        return any(isinstance(point.get("checkpoint"), str) for point in points)


def read_attempt(
    storage: Storage,
    storage_uri: str,
    attempt: int,
    *,
    record: bool = True,
    worker_groups: bool = False,
    history: bool = False,
    checkpoints: bool = False,
) -> AttemptFiles:
    """The files asked for of one attempt, each read once. ``checkpoints``: the folders that hold files,
    listed (one listing) only when the history names a checkpoint folder."""
    folder = attempt_uri(storage_uri, attempt)
    found: dict[str, Any] = {}
    unread: dict[str, Exception] = {}

    def read(field: str, uri: str) -> None:
        try:
            text = storage.read_text(uri)
            if text is not None:
                found[field] = of_shape(field, uri, json.loads(text))
        except Exception as err:  # storage down or refused, a file cut short or edited: the snapshot says so
            unread[field] = err

    if record:
        read("record", result_uri(storage_uri, attempt))
    if worker_groups:
        read("worker_groups", worker_groups_uri(folder))
    if history:
        read("history", f"{folder}/{HISTORY_FILE}")
    files = AttemptFiles(storage_uri, attempt, **found, unread=unread)
    if checkpoints and files.named_checkpoints():
        try:
            files = dataclasses.replace(files, checkpoints=frozenset(storage.folders_with_files(folder)))
        except Exception as err:
            files = dataclasses.replace(files, unread={**unread, "checkpoints": err})
    return files


def of_shape(field: str, uri: str, value: Any) -> Any:
    """The file's JSON, when it has the shape its readers take (the record an object, the worker groups and
    the history lists of objects); ValueError naming the file otherwise."""
    if field == "record":
        fits = isinstance(value, dict)
    else:
        fits = isinstance(value, list) and all(isinstance(item, dict) for item in value)
    if not fits:
        shape = "a JSON object" if field == "record" else "a JSON list of objects"
        raise ValueError(f"{uri} is not {shape} ({type(value).__name__}): it was cut short or edited by hand.")
    return value
