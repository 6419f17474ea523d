"""How RayHook's requests travel: the HTTP clients (httpx for the sync calls, aiohttp for the
async twins), their TLS, timeouts and keep-alive, and what is retried, how often and how long."""

from __future__ import annotations

import asyncio
import importlib
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from airflow_provider_horovod.hooks.ray_connection import RayEndpoint

T = TypeVar("T")

# Tries of a request whose connection fails, with doubling waits from BACKOFF_S: about 15 s in all,
# enough to ride out a dashboard restart, bounded so a dead cluster fails the task clearly.
RETRIES = 6
BACKOFF_S = 0.5
TIMEOUT_S = (5.0, 30.0)  # connect, read
# Longer than any poll interval, so a waiting task reuses its connection (httpx's default is 5 s,
# aiohttp's 15 s); shorter than the dashboard's own idle limit (aiohttp's server, 75 s).
KEEPALIVE_S = 60.0
UPLOAD_TIMEOUT_S = (5.0, 300.0)
# 429: the State API refuses requests beyond about 100 at once.
RETRY_STATUSES = frozenset({429, 502, 503, 504})
# Connections to one dashboard from one event loop (a triggerer's), below the State API's limit.
SHARED_CONNECTIONS = 32


class Transient(Exception):
    """A request that may succeed if tried again: no connection, a timeout, a 429/502/503/504."""


def retry_args(tried: int = 0) -> dict[str, Any]:
    """The one place that decides what is retried, how often and how long (sync and async alike).
    ``tried``: tries made already, before tenacity took over."""
    import tenacity

    return {
        "stop": tenacity.stop_after_attempt(RETRIES - tried),
        "wait": tenacity.wait_exponential(multiplier=BACKOFF_S * 2**tried, max=8),
        "retry": tenacity.retry_if_exception_type(Transient),
        "reraise": True,
    }


def send(once: Callable[[], T]) -> T:
    """``once()`` until it does not raise ``Transient``, RETRIES tries at most (then it raises)."""
    import tenacity

    return tenacity.Retrying(**retry_args())(once)


async def a_send(once: Callable[[], Awaitable[T]]) -> T:
    """``send`` for a coroutine. The first try goes without tenacity: setting it up costs about a
    fifth of a request's CPU, which a thousand waiting tasks add up to."""
    import tenacity

    try:
        return await once()
    except Transient:
        await asyncio.sleep(BACKOFF_S)
    return await tenacity.AsyncRetrying(**retry_args(tried=1))(once)


def tls_verify(verify: bool | str):
    """The connection's ``verify`` for a client: True, False, or a context trusting a CA bundle file
    or a folder of CA files (as requests took either)."""
    import os
    import ssl

    if not isinstance(verify, str):
        return verify
    if os.path.isdir(verify):
        return ssl.create_default_context(capath=verify)
    return ssl.create_default_context(cafile=verify)


def tls_for(endpoint: RayEndpoint):
    # No TLS over http: loading the CA bundle for every client stalls a triggerer's loop when many
    # triggers start at once.
    return tls_verify(endpoint.verify) if endpoint.url.startswith("https://") else False


def client_args(endpoint: RayEndpoint) -> dict[str, Any]:
    """What the sync ``httpx.Client`` is made with; ``async_session`` makes the async one alike."""
    import httpx

    return {
        "base_url": endpoint.url,
        "headers": dict(endpoint.headers),
        "verify": tls_for(endpoint),
        "timeout": httpx.Timeout(TIMEOUT_S[1], connect=TIMEOUT_S[0]),
        "limits": httpx.Limits(max_connections=4, max_keepalive_connections=2, keepalive_expiry=KEEPALIVE_S),
    }


async def import_aiohttp() -> None:
    """Import aiohttp in a thread: its first import is slow enough to hold the event loop (a
    triggerer's, its other triggers waiting) if made in it. Imported already, a thread hop."""
    await asyncio.to_thread(importlib.import_module, "aiohttp")


def async_session(endpoint: RayEndpoint):
    """An ``aiohttp.ClientSession`` with the sync client's headers, TLS, timeouts and keep-alive.
    aiohttp rather than httpx for the async twins: a request costs it a fraction of httpx's CPU, which
    many waiting tasks add up to (bench/results.md, the triggerer's figure)."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=SHARED_CONNECTIONS, keepalive_timeout=KEEPALIVE_S, ssl=tls_for(endpoint))
    return aiohttp.ClientSession(
        headers=dict(endpoint.headers),
        connector=connector,
        timeout=aiohttp.ClientTimeout(sock_connect=TIMEOUT_S[0], sock_read=TIMEOUT_S[1]),
    )


def fetch(client, method: str, path: str, **kwargs) -> tuple[int, str]:
    """One request of an ``httpx.Client``: its status and text; ``Transient`` when it may succeed if
    tried again."""
    import httpx

    try:
        response = client.request(method, path, **kwargs)
    except httpx.TransportError as err:
        raise Transient(f"{type(err).__name__}: {err}") from None
    if response.status_code in RETRY_STATUSES:
        raise Transient(f"HTTP {response.status_code}")
    return response.status_code, response.text


async def a_fetch(session, method: str, url: str, **kwargs) -> tuple[int, str]:
    """``fetch`` through an ``aiohttp.ClientSession``."""
    import aiohttp

    try:
        async with session.request(method, url, **kwargs) as response:
            status, body = response.status, await response.read()
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError) as err:
        raise Transient(f"{type(err).__name__}: {err}") from None
    if status in RETRY_STATUSES:
        raise Transient(f"HTTP {status}")
    return status, body.decode("utf-8", "replace")


# From this many jobs waited for in one event loop on one dashboard, their statuses come from one list
# request: fewer, one request each costs less than the list of every unended job on the cluster.
BATCH_FROM = 10


class JobBoard:
    """The infos of the jobs one event loop (a triggerer's) waits for on one dashboard, read for all
    of them at once: one State API list of the cluster's unended jobs stands for a status request per
    job and poll. Where few jobs are waited for, each asks for its own."""

    def __init__(self) -> None:
        self.waiting: dict[str, float] = {}  # submission id -> until when it counts as waited for
        self.infos: dict[str, dict] = {}  # the unended jobs of the last list, by submission id
        self.listed_at = float("-inf")  # when the last list was asked for (monotonic)
        self.pruned_at = float("-inf")
        self._listing: asyncio.Future | None = None

    async def info(
        self, submission_id: str, fresh_within_s: float, list_unended: Callable[[], Awaitable[list[dict]]]
    ) -> dict | None:
        """The job's info from a list at most ``fresh_within_s`` old (listing again when older);
        None when the job asks for its own: few jobs are waited for, the job is not in the list
        (it has ended), or the list failed."""
        now = time.monotonic()
        # Still waited for while it keeps asking at its pace (twice as fresh as its poll interval).
        self.waiting[submission_id] = now + 4 * fresh_within_s + 5.0
        if now - self.pruned_at > 1.0:
            self.waiting = {sid: until for sid, until in self.waiting.items() if until > now}
            self.pruned_at = now
        if len(self.waiting) < BATCH_FROM:
            return None
        if self._listing is not None or now - self.listed_at > fresh_within_s:
            try:
                await self._relist(list_unended)
            except Exception:  # the job's own request says what is wrong, if anything is
                return None
        return self.infos.get(submission_id)

    async def _relist(self, list_unended: Callable[[], Awaitable[list[dict]]]) -> None:
        """One list for every job that asks meanwhile; a cancelled asker does not cancel it."""
        if self._listing is None:
            self.listed_at = time.monotonic()
            self._listing = asyncio.ensure_future(list_unended())
            self._listing.add_done_callback(self._listed)
        await asyncio.shield(self._listing)

    def _listed(self, listing: asyncio.Future) -> None:
        self._listing = None
        if not listing.cancelled() and listing.exception() is None:
            self.infos = {job["submission_id"]: job for job in listing.result() if job.get("submission_id")}


class SharedSessions:
    """One aiohttp session per event loop and dashboard, shared by the hooks that speak to it (the
    triggers of one triggerer) and closed with the last of them: one pool of kept-alive connections
    rather than one per waiting task (less CPU for many waiting tasks: bench/results.md), and one
    ``JobBoard``."""

    def __init__(self) -> None:
        self._sessions: dict[tuple, list] = {}  # key -> [session, hooks using it, board]

    def acquire(self, loop: asyncio.AbstractEventLoop, endpoint: RayEndpoint) -> tuple[tuple, Any]:
        """The session for ``endpoint`` in ``loop``, and the key to release it with."""
        key = (loop, endpoint.url, tuple(sorted(endpoint.headers.items())), str(endpoint.verify))
        entry = self._sessions.get(key)
        if entry is None or entry[0].closed:
            entry = self._sessions[key] = [async_session(endpoint), 0, JobBoard()]
        entry[1] += 1
        return key, entry[0]

    def board(self, key: tuple) -> JobBoard:
        """The job board of the session acquired under ``key``."""
        return self._sessions[key][2]

    async def release(self, key: tuple) -> None:
        entry = self._sessions.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del self._sessions[key]
            await entry[0].close()


SESSIONS = SharedSessions()
