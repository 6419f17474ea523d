"""Local folders and files of a job's runtime_env (``working_dir``, ``py_modules``) as the packages
Ray's dashboard takes (``PUT /api/packages/gcs/<name>``), so the Airflow side needs no Ray install.

Ray names a package by a hash of its content (``gcs://_ray_pkg_<hash>.zip``) and reuses an upload it
already has; a ``py_modules`` folder keeps its own name as the top folder of the zip, a
``working_dir`` does not. Pure: building the zips, and the runtime_env that names them by URI.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import io
import os
import zipfile
from typing import Any

from airflow_provider_horovod.exceptions import InvalidParameterError
from airflow_provider_horovod.runtime_env_checks import is_uri

PACKAGE_PREFIX = "_ray_pkg_"
# Ray's own defaults for a working_dir, and what never belongs in a package.
DEFAULT_EXCLUDES = (".git", ".venv", "venv", "__pycache__", "*.pyc")
# The provider's own folder travels with every job; the Training view's web bundle is the api-server's.
PROVIDER_FOLDER = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROVIDER_EXCLUDES = ("plugins/www",)
# Ray's package store refuses packages over 512 MiB.
MAX_PACKAGE_BYTES = 512 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Package:
    uri: str
    data: bytes = dataclasses.field(repr=False)

    @property
    def name(self) -> str:
        return self.uri.split("://", 1)[1]


def _excluded(relative: str, patterns: tuple[str, ...]) -> bool:
    parts = relative.split("/")
    return any(fnmatch.fnmatch(relative, p) or any(fnmatch.fnmatch(part, p) for part in parts) for p in patterns)


def _files(folder: str, patterns: tuple[str, ...]) -> list[tuple[str, str]]:
    """(relative path, absolute path) of the files to pack, in a stable order."""
    found = []
    for root, dirs, files in os.walk(folder):
        rel_root = os.path.relpath(root, folder)
        rel_root = "" if rel_root == "." else rel_root.replace(os.sep, "/") + "/"
        dirs[:] = sorted(d for d in dirs if not _excluded(rel_root + d, patterns))
        found += [(rel_root + f, os.path.join(root, f)) for f in sorted(files) if not _excluded(rel_root + f, patterns)]
    return found


def package_folder(
    folder: str, *, keep_name: bool, excludes: tuple[str, ...] = (), field: str = "working_dir"
) -> Package:
    """A zip of ``folder``'s files; ``keep_name``: under a top folder of the folder's name (py_modules)."""
    folder = os.path.abspath(folder)
    patterns = DEFAULT_EXCLUDES + tuple(excludes)
    top = os.path.basename(folder.rstrip("/")) + "/" if keep_name else ""
    digest = hashlib.sha1(top.encode())
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for relative, path in _files(folder, patterns):
            with open(path, "rb") as f:
                data = f.read()
            digest.update(relative.encode() + b"\0" + hashlib.sha1(data).digest())
            archive.writestr(
                zipfile.ZipInfo(top + relative, date_time=(1980, 1, 1, 0, 0, 0)),
                data,
                compress_type=zipfile.ZIP_DEFLATED,
            )
    data = buffer.getvalue()
    if len(data) > MAX_PACKAGE_BYTES:
        raise InvalidParameterError(
            "runtime_env",
            {field: folder},
            f"the folder packs to {len(data) / 2**20:.0f} MiB, over Ray's limit of {MAX_PACKAGE_BYTES // 2**20} MiB; "
            "leave data and checkpoints out with runtime_env['excludes'], or read them from storage.",
        )
    return Package(f"gcs://{PACKAGE_PREFIX}{digest.hexdigest()}.zip", data)


def package_file(path: str) -> Package:
    """A wheel or a zip (a ``working_dir`` archive) goes as it is; a single ``.py`` module goes zipped."""
    with open(path, "rb") as f:
        data = f.read()
    digest = hashlib.sha1(os.path.basename(path).encode() + b"\0" + data).hexdigest()
    if path.endswith(".whl"):
        # pip installs a wheel by its file name (name, version, tags), which is also how Ray names it.
        return Package(f"gcs://{os.path.basename(path)}", data)
    if path.endswith(".zip"):
        # Ray unpacks a gcs:// zip as it is: wrapped in another zip, the working_dir would hold the archive.
        return Package(f"gcs://{PACKAGE_PREFIX}{hashlib.sha1(data).hexdigest()}.zip", data)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(zipfile.ZipInfo(os.path.basename(path), date_time=(1980, 1, 1, 0, 0, 0)), data)
    return Package(f"gcs://{PACKAGE_PREFIX}{digest}.zip", buffer.getvalue())


def with_uploaded_packages(runtime_env: dict[str, Any]) -> tuple[dict[str, Any], list[Package]]:
    """The runtime_env with its local ``working_dir`` and ``py_modules`` replaced by package URIs,
    and the packages to upload. A local pip requirements file becomes its list of requirements."""
    env = dict(runtime_env)
    excludes = tuple(env.get("excludes") or ())
    packages: list[Package] = []
    working_dir = env.get("working_dir")
    if isinstance(working_dir, str) and not is_uri(working_dir):
        if os.path.isdir(working_dir):
            packages.append(package_folder(working_dir, keep_name=False, excludes=excludes))
        else:
            packages.append(package_file(working_dir))
        env["working_dir"] = packages[-1].uri
    modules = []
    for module in env.get("py_modules") or []:
        if is_uri(module):
            modules.append(module)
            continue
        own = PROVIDER_EXCLUDES if os.path.abspath(module) == PROVIDER_FOLDER else ()
        package = (
            package_folder(module, keep_name=True, excludes=excludes + own, field="py_modules")
            if os.path.isdir(module)
            else package_file(module)
        )
        packages.append(package)
        modules.append(package.uri)
    if "py_modules" in env:
        env["py_modules"] = modules
    pip = env.get("pip")
    if isinstance(pip, str):
        with open(pip, encoding="utf-8") as f:
            env["pip"] = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
    # Ray would apply excludes when it packs; the packages are packed already.
    env.pop("excludes", None)
    return env, packages
