"""Apache Airflow provider: Horovod training on Ray clusters through Ray Train.

This module is imported on the Ray cluster too (the runtime ships inside this package), so it
must import nothing but the standard library.
"""

from __future__ import annotations

from airflow_provider_horovod.contract import SMOKE_ROWS, SYNC_WAIT_BEFORE_DEFER_S
from airflow_provider_horovod.contract import VERSION as __version__

_RAY_HOOK = "airflow_provider_horovod.hooks.ray.RayHook"


def get_provider_info() -> dict:
    """Describe the provider to Airflow (entry point ``apache_airflow_provider``)."""
    return {
        "package-name": "airflow-provider-horovod",
        "name": "Horovod on Ray",
        "description": "Launch multi-worker Horovod training on a Ray cluster through Ray Train.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "Ray",
                "external-doc-url": "https://docs.ray.io/en/latest/cluster/running-applications/job-submission/index.html",
                "tags": ["software"],
            },
            {
                "integration-name": "Horovod",
                "external-doc-url": "https://horovod.readthedocs.io/",
                "tags": ["software"],
            },
        ],
        "operators": [
            {
                "integration-name": "Horovod",
                "python-modules": ["airflow_provider_horovod.operators.horovod"],
            },
            {"integration-name": "Ray", "python-modules": ["airflow_provider_horovod.operators.ray"]},
        ],
        "sensors": [{"integration-name": "Ray", "python-modules": ["airflow_provider_horovod.sensors.ray"]}],
        "hooks": [{"integration-name": "Ray", "python-modules": ["airflow_provider_horovod.hooks.ray"]}],
        "triggers": [{"integration-name": "Ray", "python-modules": ["airflow_provider_horovod.triggers.ray"]}],
        "extra-links": [
            "airflow_provider_horovod.links.ray.RayJobLink",
            "airflow_provider_horovod.links.mlflow.MlflowRunLink",
        ],
        "task-decorators": [
            {"name": "horovod", "class-name": "airflow_provider_horovod.decorators.horovod.horovod_task"},
            {
                "name": "horovod_script",
                "class-name": "airflow_provider_horovod.decorators.horovod.horovod_script_task",
            },
            {"name": "ray", "class-name": "airflow_provider_horovod.decorators.ray.ray_task"},
        ],
        "config": {
            "horovod": {
                "description": "Settings of airflow-provider-horovod.",
                "options": {
                    "smoke_run": {
                        "description": "Run every Horovod training and Ray task as a smoke run, the quick "
                        "end-to-end check of a DAG in CI (docs/ci.md): CPU workers scaled to the cluster, the first "
                        "smoke_rows rows of each dataset, stopped after the first checkpoint, marked smoke_run in "
                        "XCom. A task's own smoke_run wins.",
                        "version_added": "0.2.0",
                        "type": "boolean",
                        "example": "True",
                        "default": "False",
                    },
                    "defer_after_seconds": {
                        "description": "How long a deferrable task follows its Ray job in the worker before it "
                        "defers to the triggerer. A job that ends within it finishes its task at once; one that ends "
                        "right after a deferral waits for the trigger's resume guard, up to 20 s "
                        "(docs/reliability.md). 0: defer at once.",
                        "version_added": "0.2.0",
                        "type": "float",
                        "example": "15",
                        "default": f"{SYNC_WAIT_BEFORE_DEFER_S:g}",
                    },
                    "smoke_rows": {
                        "description": "Rows a smoke run reads of each Ray dataset (a task's smoke_rows wins).",
                        "version_added": "0.2.0",
                        "type": "integer",
                        "example": "16",
                        "default": str(SMOKE_ROWS),
                    },
                },
            }
        },
        "connection-types": [
            {
                "connection-type": "ray",
                "hook-class-name": _RAY_HOOK,
                "hook-name": "Ray",
                "conn-fields": {
                    "verify": {
                        "label": "Verify TLS",
                        "description": "Check the dashboard's certificate (https). Default: on.",
                        "schema": {"type": ["boolean", "null"], "default": True},
                    },
                    "ca_bundle": {
                        "label": "CA bundle",
                        "description": "Path of a CA bundle file, or a folder of CA files, on the Airflow workers, "
                        "to verify the dashboard's certificate with.",
                        "schema": {"type": ["string", "null"]},
                    },
                    "shared_storage": {
                        "label": "Local storage is shared",
                        "description": "On when local storage paths are on a filesystem shared by every Ray node and "
                        "the Airflow workers (else use s3:// storage).",
                        "schema": {"type": ["boolean", "null"], "default": False},
                    },
                    "runtime_env": {
                        "label": "Default runtime_env",
                        "description": "JSON Ray runtime_env merged under each job's own.",
                        "schema": {"type": ["string", "null"]},
                    },
                    "headers": {
                        "label": "Extra HTTP headers",
                        "description": 'JSON object sent with every request, e.g. {"X-Team": "ml"}.',
                        "schema": {"type": ["string", "null"]},
                    },
                    "prices": {
                        "label": "Prices",
                        "description": "JSON prices of the cluster's resources, which turn a task's cost into an "
                        'amount (a task\'s own prices win), e.g. {"cpu_hour": 0.048, '
                        '"gpu_hour": 2.45, "currency": "USD"}.',
                        "schema": {"type": ["string", "null"]},
                    },
                },
                # The address in one field (scheme, host and port, as a URL is read), then the token:
                # Airflow's form orders its standard fields host, token, port, scheme.
                "ui-field-behaviour": {
                    "hidden-fields": ["login", "extra", "port", "schema"],
                    "relabeling": {
                        "host": "Ray dashboard address",
                        "password": "Ray auth token",
                    },
                    "placeholders": {
                        "host": "https://ray-head.example.com:8265, or 'local' for an embedded local cluster",
                        "password": "contents of ~/.ray/auth_token on the head node",
                    },
                },
            }
        ],
    }
