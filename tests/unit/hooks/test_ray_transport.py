"""The hook's transport: TLS settings, the retries of the async twins, and the aiohttp sessions
shared by the hooks of one event loop."""

from __future__ import annotations

import asyncio
import ssl

import pytest

from airflow_provider_horovod.hooks import ray_transport
from airflow_provider_horovod.hooks.ray_connection import RayEndpoint
from airflow_provider_horovod.hooks.ray_transport import (
    BATCH_FROM,
    RETRIES,
    JobBoard,
    SharedSessions,
    Transient,
    a_send,
    client_args,
    tls_for,
    tls_verify,
)


def endpoint(url: str = "http://ray-head:8265", *, verify=True, token: str = "tok-a") -> RayEndpoint:
    return RayEndpoint(conn_id="ray", headers={"Authorization": f"Bearer {token}"}, url=url, verify=verify)


# --- retries --------------------------------------------------------------------------------------


@pytest.fixture
def no_waits(monkeypatch):
    slept = []

    async def sleep(seconds):
        slept.append(seconds)

    monkeypatch.setattr(ray_transport.asyncio, "sleep", sleep)
    return slept


def test_a_first_try_that_works_is_the_only_one(no_waits):
    tries = []

    async def once():
        tries.append(1)
        return 200, "ok"

    assert asyncio.run(a_send(once)) == (200, "ok")
    assert len(tries) == 1
    assert no_waits == []


def test_failed_tries_are_retried_with_doubling_waits_up_to_retries(no_waits):
    tries = []

    async def once():
        tries.append(1)
        raise Transient(f"HTTP 503 ({len(tries)})")

    with pytest.raises(Transient, match=f"HTTP 503 \\({RETRIES}\\)"):
        asyncio.run(a_send(once))
    assert len(tries) == RETRIES
    # As the sync calls wait (tenacity alone): 0.5, 1, 2, 4, 8 s, about 15 s in all.
    assert no_waits == [min(ray_transport.BACKOFF_S * 2**i, 8) for i in range(RETRIES - 1)]


def test_a_try_that_works_after_failures_returns_its_answer(no_waits):
    answers = [Transient("HTTP 502"), Transient("HTTP 429"), (200, "ok")]

    async def once():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert asyncio.run(a_send(once)) == (200, "ok")
    assert answers == []


# --- sessions shared in one event loop ------------------------------------------------------------


def test_the_hooks_of_one_loop_share_a_session_closed_with_the_last():
    sessions = SharedSessions()

    async def two_hooks():
        loop = asyncio.get_running_loop()
        key_a, a = sessions.acquire(loop, endpoint())
        key_b, b = sessions.acquire(loop, endpoint())
        assert a is b
        assert key_a == key_b
        await sessions.release(key_a)
        assert not a.closed  # the other hook still uses it
        await sessions.release(key_b)
        assert a.closed
        _, c = sessions.acquire(loop, endpoint())  # a later hook gets a new one
        assert c is not a
        assert not c.closed
        await sessions.release(key_a)
        return a

    asyncio.run(two_hooks())


def test_other_dashboards_tokens_or_loops_get_their_own_session():
    sessions = SharedSessions()

    async def in_one_loop():
        loop = asyncio.get_running_loop()
        keys, made = zip(
            *(
                sessions.acquire(loop, e)
                for e in (
                    endpoint(),
                    endpoint("http://other-head:8265"),
                    endpoint(token="tok-b"),
                    endpoint("https://ray-head:8265", verify=False),
                )
            )
        )
        assert len({id(s) for s in made}) == 4
        for key in keys:
            await sessions.release(key)
        return made[0]

    first, second = asyncio.run(in_one_loop()), asyncio.run(in_one_loop())
    assert first is not second
    assert first.closed
    assert second.closed


# --- TLS ------------------------------------------------------------------------------------------


def test_a_plain_http_dashboard_loads_no_ca_bundle(tmp_path):
    ca = self_signed_ca(tmp_path)
    assert tls_for(endpoint("http://ray-head:8265")) is False
    assert client_args(endpoint("http://ray-head:8265"))["verify"] is False
    assert tls_for(endpoint("https://ray-head:8265")) is True
    assert isinstance(tls_for(endpoint("https://ray-head:8265", verify=ca)), ssl.SSLContext)


def self_signed_ca(folder) -> str:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ahp test CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path = folder / "ca.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(path)


def test_tls_verification_settings(tmp_path):
    assert tls_verify(True) is True
    assert tls_verify(False) is False
    trusted = tls_verify(self_signed_ca(tmp_path))
    assert isinstance(trusted, ssl.SSLContext)
    assert trusted.verify_mode == ssl.CERT_REQUIRED
    assert [c["subject"] for c in trusted.get_ca_certs()] == [((("commonName", "ahp test CA"),),)]
    folder = tls_verify(str(tmp_path))  # a folder of CA files, as requests took it
    assert isinstance(folder, ssl.SSLContext)
    assert folder.verify_mode == ssl.CERT_REQUIRED


# --- the job board --------------------------------------------------------------------------------


class Lister:
    """The cluster's unended jobs, as the State API lists them; counts the lists."""

    def __init__(self, running: list[str], fail: bool = False):
        self.running, self.fail, self.calls = running, fail, 0

    async def __call__(self) -> list[dict]:
        self.calls += 1
        await asyncio.sleep(0.01)
        if self.fail:
            raise RuntimeError("HTTP 500")
        return [{"submission_id": sid, "status": "RUNNING"} for sid in self.running]


def board_answers(board: JobBoard, sids: list[str], lister: Lister, fresh_within_s: float = 5.0) -> list:
    async def ask_all():
        return await asyncio.gather(*(board.info(sid, fresh_within_s, lister) for sid in sids))

    return asyncio.run(ask_all())


def test_many_waiting_jobs_share_one_list_and_an_ended_job_asks_itself():
    sids = [f"job-{i}" for i in range(BATCH_FROM)]
    lister = Lister(running=sids[1:])
    board = JobBoard()
    # The first round counts the waiting jobs: the first of them ask for their own, the last lists.
    assert board_answers(board, sids, lister)[:-1] == [None] * (BATCH_FROM - 1)
    assert lister.calls == 1
    board.listed_at -= 10
    answers = board_answers(board, sids, lister)
    assert lister.calls == 2
    assert answers[0] is None  # not among the unended: it ended (or was deleted); its own request tells
    assert [a["submission_id"] for a in answers[1:]] == sids[1:]
    # Within fresh_within_s the list is reused; past it, listed again, once for all.
    board_answers(board, sids, lister)
    assert lister.calls == 2
    board.listed_at -= 10
    board_answers(board, sids, lister)
    assert lister.calls == 3


def test_few_waiting_jobs_each_ask_for_their_own():
    lister = Lister(running=["a", "b"])
    assert board_answers(JobBoard(), ["a", "b"], lister) == [None, None]
    assert lister.calls == 0


def test_a_job_no_longer_asking_stops_counting():
    board = JobBoard()
    sids = [f"job-{i}" for i in range(BATCH_FROM)]
    board_answers(board, sids, Lister(sids))
    board.waiting = {sid: until - 100 for sid, until in board.waiting.items()}  # they stopped asking long ago
    board.pruned_at -= 100
    lister = Lister(sids)
    assert board_answers(board, sids[:2], lister) == [None, None]
    assert lister.calls == 0


def test_a_failed_list_lets_each_job_ask_for_its_own():
    sids = [f"job-{i}" for i in range(BATCH_FROM)]
    lister = Lister(sids, fail=True)
    assert board_answers(JobBoard(), sids, lister) == [None] * BATCH_FROM
    assert lister.calls == 1


def test_an_asker_cancelled_during_the_list_does_not_cancel_it_for_the_others():
    sids = [f"job-{i}" for i in range(BATCH_FROM)]
    lister = Lister(sids)
    board = JobBoard()

    async def scenario():
        first = asyncio.ensure_future(board.info(sids[0], 5.0, lister))
        others = [asyncio.ensure_future(board.info(sid, 5.0, lister)) for sid in sids[1:]]
        await asyncio.sleep(0)
        first.cancel()
        return await asyncio.gather(*others)

    # The first nine ask before the board batches; make it batch from the start.
    board.waiting = {sid: float("inf") for sid in sids}
    answers = asyncio.run(scenario())
    assert lister.calls == 1
    assert [a["submission_id"] for a in answers] == sids[1:]
