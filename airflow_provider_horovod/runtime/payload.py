"""The job's payload: a folder shipped as a Ray ``py_module`` holding the spec and pickled code.

Standard library only: the Airflow side writes it, the runtime reads it.
"""

from __future__ import annotations

import hashlib
import importlib
import os

from airflow_provider_horovod.spec import SPEC_FILE, TrainingSpec

PAYLOAD_PREFIX = "ahp_payload_"


def write_payload(spec: TrainingSpec, files: dict[str, bytes], parent_dir: str) -> tuple[str, str]:
    """Write the payload package under ``parent_dir``; return (module name, folder path).

    The name is a hash of the content, so Ray's package cache reuses an identical upload.
    """
    digest = hashlib.sha256(spec.to_json().encode())
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name])
    module = PAYLOAD_PREFIX + digest.hexdigest()[:16]
    folder = os.path.join(parent_dir, module)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "__init__.py"), "w", encoding="utf-8") as f:
        f.write('"""Payload of one airflow-provider-horovod training job."""\n')
    with open(os.path.join(folder, SPEC_FILE), "w", encoding="utf-8") as f:
        f.write(spec.to_json())
    for name, data in files.items():
        if os.path.basename(name) != name:
            raise ValueError(f"payload file name {name!r} must be a plain file name")
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    return module, folder


def payload_folder(module: str) -> str:
    return list(importlib.import_module(module).__path__)[0]


def read_payload(module: str) -> tuple[TrainingSpec, str]:
    folder = payload_folder(module)
    with open(os.path.join(folder, SPEC_FILE), encoding="utf-8") as f:
        return TrainingSpec.from_json(f.read()), folder
