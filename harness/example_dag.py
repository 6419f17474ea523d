"""The example retraining DAG (``dags/horovod_retraining.py``) edited, alone in a folder of its own: as
production would configure it (``PRODUCTION``), or with a bug planted. Shared by the smoke-run test and
the smoke-run figure."""

from __future__ import annotations

import shutil
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "dags" / "horovod_retraining.py"
# 8 GPU workers of 8 CPUs, 1000 epochs.
PRODUCTION = {
    "        num_workers=2,\n": (
        '        num_workers=8,\n        use_gpu=True,\n        resources_per_worker={"CPU": 8, "GPU": 1},\n'
    ),
    '"num_epochs": 5': '"num_epochs": 1000',
}


def edited_copy(folder: Path, edits: dict[str, str]) -> Path:
    """``folder``, made anew, with the example DAG file in it, ``edits`` made (old text: new text); raises
    ValueError where the file no longer has a text to replace."""
    text = EXAMPLE.read_text()
    for old, new in edits.items():
        if old not in text:
            raise ValueError(f"the example DAG no longer has {old!r}: update the edits")
        text = text.replace(old, new)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / EXAMPLE.name).write_text(text)
    return folder
