"""The results files' markdown: plain tables, and the measured blocks among people's prose. No side effect on
import, unlike ``bench.common``: ``make chaos`` and ``bench.setup_time`` write with these too."""

from __future__ import annotations


def plain_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


END = "<!-- /measured -->"


def begin(name: str) -> str:
    return f"<!-- measured: {name} (written from data; the text around it is people's) -->"


def measured(text: str, name: str) -> str | None:
    """What the block ``name`` of a results file holds, or None."""
    if begin(name) not in text:
        return None
    return text.split(begin(name), 1)[1].split(END, 1)[0].strip("\n")


def put_measured(text: str, name: str, body: str, heading: str) -> str:
    """``text`` with ``body`` in the block ``name``, the prose around it kept; a block not there yet is
    added at the end, under ``heading``."""
    if begin(name) not in text:
        return f"{text.rstrip()}\n\n{heading}\n\n{begin(name)}\n{body}\n{END}\n"
    head, rest = text.split(begin(name), 1)
    return f"{head}{begin(name)}\n{body}\n{END}{rest.split(END, 1)[1]}"
