"""What the job steps need of a Ray cluster: ``RayHook`` provides it over HTTP, the unit tests' fake
in memory. The steps take it as an argument, so nothing reaches into an operator to swap it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class Endpoint(Protocol):
    @property
    def url(self) -> str: ...

    @property
    def embedded(self) -> bool:
        """The provider's own local cluster, on the worker's machine."""
        ...

    @property
    def shared_storage(self) -> bool:
        """Local paths are on a filesystem the Ray nodes and the Airflow workers share."""
        ...

    @property
    def prices(self) -> Mapping[str, Any] | None:
        """The connection's prices of CPU- and GPU-hours, for tasks that give none."""
        ...


class RayJobsApi(Protocol):
    """The Ray Jobs API calls the provider makes: sync ones to submit, async ones to wait."""

    @property
    def endpoint(self) -> Endpoint: ...

    def get_job_url(self, submission_id: str) -> str: ...

    def get_job_info(self, submission_id: str) -> dict | None: ...

    def get_cluster_resources(self) -> dict[str, float]: ...

    def ray_version(self) -> str | None:
        """The cluster's Ray version (its dashboard's), read once."""
        ...

    def submit_job(
        self,
        *,
        entrypoint: str,
        submission_id: str,
        runtime_env: Mapping | None = None,
        metadata: Mapping[str, str] | None = None,
        entrypoint_num_cpus: float | None = None,
        entrypoint_num_gpus: float | None = None,
        entrypoint_memory: int | None = None,
        entrypoint_resources: Mapping[str, float] | None = None,
    ) -> str: ...

    def stop_job(self, submission_id: str) -> bool: ...

    async def a_get_job_info(self, submission_id: str, fresh_within_s: float | None = None) -> dict | None:
        """``fresh_within_s``: the info may come from a list, read for many waiting jobs at once, at
        most that old."""
        ...

    async def a_get_job_logs(self, submission_id: str) -> str: ...

    async def a_get_log_tail(self, node_id: str, submission_id: str, lines: int) -> str | None: ...

    async def a_stop_job(self, submission_id: str) -> bool: ...

    async def a_get_cluster_resources(self) -> dict[str, float]: ...

    async def aclose(self) -> None: ...
