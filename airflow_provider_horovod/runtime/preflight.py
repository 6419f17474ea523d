"""Checks a job makes before it does anything: is this cluster's Ray one the runtime supports, and
can the functions that travelled pickled load on this Python. Each returns what is wrong and the
fix, or None."""

from __future__ import annotations

import sys


def ray_mismatch() -> str | None:
    import ray

    from airflow_provider_horovod.spec import check_ray_version

    problem = check_ray_version(ray.__version__)
    return None if problem is None else f"This Ray cluster cannot run the job: {problem}"


def python_mismatch(airflow_python: str, pickled: dict[str, str]) -> str | None:
    """``pickled``: parameter -> payload file, for the functions that travelled pickled."""
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if not pickled or not airflow_python or airflow_python == here:
        return None
    names = " and ".join(pickled)
    return (f"{names} travelled pickled by cloudpickle from Airflow's Python {airflow_python}, and pickled code loads "
            f"only on the same Python minor version; this Ray cluster runs Python {here}. Give {names} as an import "
            'path "package.module:function" (the module installed on the cluster, or shipped with runtime_env '
            "py_modules/working_dir), or run Airflow and the Ray cluster on the same Python minor version.")


def problems(spec) -> str | None:
    return ray_mismatch() or python_mismatch(spec.python_version, spec.pickled_files())
