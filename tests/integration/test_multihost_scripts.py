"""A Horovod script run unchanged across hosts (``train_script``): the ranks, sizes, local and cross ranks
it sees are those ``horovodrun`` gives it on the same placement, and every rank's lines reach the task log as
horovodrun shows them. The hosts are network namespaces (``harness/hosts.py``, Debian's /etc/hosts), a Ray
node of 2 CPUs on each, S3 on moto (``harness/ray_hosts.py``); the operator runs in this process, as
Airflow's worker would.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path

import pytest

from harness import hosts as testhosts
from harness.tasks import FakeTI

pytestmark = pytest.mark.integration

CONN_ID = "ray_multihost_scripts"
BUCKET = "multihost-scripts"
SCRIPTS = Path(__file__).resolve().parents[1] / "dags" / "scripts"
SCRIPT = "placement.py"
SLOTS = 2  # ranks per host: a Ray node's 2 CPUs, one a worker
# A rank's line, marked with its rank as horovodrun marks it (and the operator, with Ray Train's world rank).
PLACEMENT = re.compile(r"\[(\d+)\]<stdout>:PLACEMENT (\{.*\})")
WORLD = re.compile(r"\[(\d+)\]<stdout>:WORLD (\[\{.*\}\])")


@pytest.fixture(scope="module")
def cluster():
    testhosts.skip_unless_available()
    if not os.path.exists(testhosts.cluster_python()):
        pytest.skip(f"no cluster environment at {testhosts.cluster_python()}")
    from harness.ray_hosts import RayHosts

    # eth0 on both: horovodrun needs an interface of one name on every host (test_multihost.py has the
    # operator's own case of names that differ).
    hosts = testhosts.Hosts(2, ifaces=("eth0", "eth0"), etc_hosts=testhosts.DEBIAN)
    with RayHosts(hosts, bucket=BUCKET, conn_id=CONN_ID, num_cpus=SLOTS) as running:
        yield running


def placements(output: str) -> dict[int, dict]:
    """Each rank's own PLACEMENT line, by the rank its line is marked with (one that comes twice must agree)."""
    found: dict[int, dict] = {}
    for mark, body in PLACEMENT.findall(output):
        assert found.setdefault(int(mark), json.loads(body)) == json.loads(body), (mark, output[-4000:])
    return found


def world(output: str) -> dict[int, dict]:
    """Every rank's placement as rank 0 gathered them through Horovod (its WORLD line), by rank."""
    lines = set(WORLD.findall(output))
    assert [mark for mark, _ in lines] == ["0"], output[-4000:]  # one line, from Ray Train's rank 0 too
    return {rank["rank"]: rank for rank in json.loads(lines.pop()[1])}


def as_horovodrun_places(found: dict[int, dict], host_names: list[str]) -> tuple[dict, set]:
    """Checks the ranks of the hosts, with 2 slots each, against what horovodrun assigns; returns each rank's
    (size, local_rank, local_size, cross_rank, cross_size, allreduce sum), and the hosts' sets of ranks."""
    size = SLOTS * len(host_names)
    assert sorted(found) == list(range(size)), found
    for rank in found.values():
        assert (rank["size"], rank["local_size"], rank["cross_size"]) == (size, SLOTS, len(host_names)), found
        assert rank["sum"] == size * (size + 1) / 2, found  # each rank gave rank + 1
    by_host: dict[str, list[dict]] = {}
    for rank in found.values():
        by_host.setdefault(rank["host"], []).append(rank)
    assert sorted(by_host) == sorted(host_names), found
    for ranks in by_host.values():
        ranks.sort(key=lambda r: r["rank"])
        assert [r["local_rank"] for r in ranks] == list(range(SLOTS)), found
        assert len({r["cross_rank"] for r in ranks}) == 1, found  # a host's cross rank, on all its ranks
        # horovodrun numbers the ranks host by host, in local-rank order within one.
        assert all(r["rank"] == r["cross_rank"] * SLOTS + r["local_rank"] for r in ranks), found
    assert sorted(ranks[0]["cross_rank"] for ranks in by_host.values()) == list(range(len(host_names))), found
    table = {
        rank: tuple(r[k] for k in ("size", "local_rank", "local_size", "cross_rank", "cross_size", "sum"))
        for rank, r in found.items()
    }
    return table, {frozenset(r["rank"] for r in ranks) for ranks in by_host.values()}


@pytest.fixture(scope="module")
def horovodrun_output(cluster) -> str:
    """The script's output under ``horovodrun -np 4 -H host1:2,host2:2`` on the hosts."""
    return cluster.horovodrun(SCRIPT, expect="PLACEMENT", cwd=str(SCRIPTS), slots=SLOTS)[0]


# Both trainer APIs: Ray's HorovodTrainer (legacy) once failed here at start across hosts only.
@pytest.fixture(scope="module", params=["v2", "legacy"])
def runs(cluster, horovodrun_output, request) -> dict[str, str]:
    """The script's output through the operator (its job's log: what the task log shows) with 4 workers of
    1 CPU, 2 on each host, and under horovodrun on the same hosts."""
    from airflow_provider_horovod.hooks.ray import RayHook
    from airflow_provider_horovod.operators.horovod import HorovodTrainOperator

    hosts = cluster.hosts
    result = HorovodTrainOperator(
        task_id="train",
        train_script=str(SCRIPTS / SCRIPT),
        num_workers=SLOTS * len(hosts.hosts),
        resources_per_worker={"CPU": 1},
        trainer_api=request.param,
        ray_conn_id=CONN_ID,
        deferrable=False,
        poll_interval_seconds=0.5,
        storage_path=f"s3://{BUCKET}/runs",
        # RAY_ADDRESS: Train V2's placement-group cleaner must find this cluster, not another on the machine.
        runtime_env={"env_vars": {"RAY_ADDRESS": hosts.gcs_address}},
    ).execute({"ti": FakeTI(f"placement-{uuid.uuid4().hex[:6]}")})
    assert result["world_size"] == SLOTS * len(hosts.hosts), result
    return {
        "operator": RayHook(ray_conn_id=CONN_ID).get_job_logs(result["submission_id"]),
        "horovodrun": horovodrun_output,
    }


def test_a_script_across_two_hosts_sees_the_ranks_horovodrun_gives_it(cluster, runs):
    """The script's ranks, sizes, local and cross ranks and host names are as horovodrun assigns them with
    ``-np 4 -H host1:2,host2:2``, and the same as in that very horovodrun run of the script on the same hosts.
    Which host is cross rank 0 is not compared: horovodrun takes the hosts in the order of -H, the operator
    in the order Ray Train gives its workers."""
    names = [h.name for h in cluster.hosts.hosts]
    assert as_horovodrun_places(world(runs["operator"]), names) == as_horovodrun_places(
        world(runs["horovodrun"]), names
    )


def test_every_ranks_lines_reach_the_task_log_marked_with_its_rank_as_under_horovodrun(runs):
    """horovodrun shows every rank's line, marked with its rank; so must the task log, though the 4 lines
    differ only in their numbers (which Ray's driver folds into one line of a worker, "[repeated 3x across
    cluster]", unless told otherwise)."""
    assert placements(runs["horovodrun"]) == world(runs["horovodrun"])  # the reference shows them all
    shown, gathered = placements(runs["operator"]), world(runs["operator"])
    assert sorted(shown) == sorted(gathered), f"no line of ranks {sorted(set(gathered) - set(shown))} in the task log"
    assert shown == gathered
