"""What `make chaos` does and when, drawn from one seed: the workload (which DAG runs are asked for, at
which second) and the fault schedule (which fault, at which second, for how long). Pure functions of
the seed and the length of the run: the same seed gives the same schedule, so a run that found a
defect can be run again as it was.

What a fault hits is decided when it fires, among what is running then (``Fault.pick`` chooses among
those candidates, in a stable order), since what runs at a given second depends on the machine's
speed. The schedule itself does not.
"""

from __future__ import annotations

import dataclasses
import random
from datetime import date, timedelta

# Each kind of fault, and what it does (chaos/faults.py does it).
KILL_WORKER = "kill_worker"  # SIGKILL one Ray Train worker process of a running training
LOSE_HOST = "lose_host"  # SIGKILL every process of host 2 at once; its Ray node back after a while
KILL_TASK_PROCESS = "kill_task_process"  # SIGKILL the Airflow task process of a running training
TRIGGERER_SIGTERM = "triggerer_sigterm"  # the triggerer stopped as a deployment restarts it, started again
TRIGGERER_SIGKILL = "triggerer_sigkill"  # the triggerer killed outright, started again
RESTART_SCHEDULER = "restart_scheduler"  # SIGTERM (then SIGKILL) the scheduler, started again
RESTART_RAY_HEAD = "restart_ray_head"  # every process of the head's host killed, a new head started
S3_OUTAGE = "s3_outage"  # S3 refuses connections for a while
MARK_FAILED = "mark_failed"  # a running training marked failed through Airflow's REST API
FAULT_KINDS = (
    KILL_WORKER,
    LOSE_HOST,
    KILL_TASK_PROCESS,
    TRIGGERER_SIGTERM,
    TRIGGERER_SIGKILL,
    RESTART_SCHEDULER,
    RESTART_RAY_HEAD,
    S3_OUTAGE,
    MARK_FAILED,
)
# The spread deployment's own (its parts are on hosts of their own, with links between them).
PARTITION = "partition"  # one link of LINKS dropped both ways for a while
LOSSY_LINK = "lossy_link"  # a host drops a share (``amount``) of its packets, both ways, for a while
POSTGRES_RESTART = "postgres_restart"  # PostgreSQL stopped (immediate), down for a while, started again
BROKER_RESTART = "broker_restart"  # Redis, the Celery broker, stopped, down for a while, started again
STORAGE_REFUSAL = "storage_refusal"  # S3 answers every write 503 SlowDown for a while
SLOW_LINK = "slow_link"  # every exchange with PostgreSQL or S3 delayed (``amount`` seconds) for a while
SPREAD_FAULT_KINDS = (
    *FAULT_KINDS,
    PARTITION,
    LOSSY_LINK,
    POSTGRES_RESTART,
    BROKER_RESTART,
    STORAGE_REFUSAL,
    SLOW_LINK,
)
# How long a fault lasts, drawn between these (seconds): host 2 away, S3 down, the head down, ...
DURATIONS_S = {
    LOSE_HOST: (20.0, 60.0),
    S3_OUTAGE: (5.0, 30.0),
    RESTART_RAY_HEAD: (1.0, 10.0),
    PARTITION: (5.0, 60.0),
    LOSSY_LINK: (20.0, 60.0),
    POSTGRES_RESTART: (10.0, 30.0),
    BROKER_RESTART: (5.0, 20.0),
    STORAGE_REFUSAL: (10.0, 40.0),
    SLOW_LINK: (20.0, 60.0),
}
# The share of packets a lossy link drops, drawn between these.
LOSS_SHARE = (0.05, 0.3)
# The delay a slow link adds to each exchange (seconds), drawn between these; and the links it slows
# (user-space proxies in the root namespace: this kernel has no netem).
DELAY_S = (0.05, 0.5)
SLOW_LINKS = ("postgres", "storage")
AMOUNTS = {LOSSY_LINK: LOSS_SHARE, SLOW_LINK: DELAY_S}
# The links a partition cuts, one picked by the fault's fraction (the spread deployment names the hosts).
LINKS = ("worker-ray_head", "triggerer-ray_head", "ray_host-ray_host", "worker-postgres")
# The deployments: Airflow's components on one host (LocalExecutor), or spread over hosts (CeleryExecutor).
DEPLOYMENTS = {"single": FAULT_KINDS, "spread": SPREAD_FAULT_KINDS}
# How far apart each deployment's DAG runs are asked for (the workload's gaps times this): the spread one
# runs twice the processes on the same 2 cores, and at the single one's pace its runs passed their
# dagrun_timeout waiting for pool slots (bench/results.md, the first spread soak).
PACE = {"single": 1.0, "spread": 2.0}

# The DAGs of the workload (chaos/dags/chaos_dags.py).
RETRAINING = "chaos_retraining"  # daily retraining: data, train, evaluate (@task.ray), promote
SWEEP = "chaos_sweep"  # a mapped @task.horovod sweep, not deferred, then a @task.ray evaluation
ELASTIC = "chaos_elastic"  # an elastic training, num_workers=(2, 4), deferred
WORKLOAD_DAGS = (RETRAINING, SWEEP, ELASTIC)
# The first day of the retraining's daily runs; the backfill covers the days before it.
FIRST_DAY = date(2026, 11, 10)


@dataclasses.dataclass(frozen=True)
class Fault:
    at_s: float  # seconds after the workload started
    kind: str
    duration_s: float  # how long it lasts (0: a single blow)
    pick: float  # in [0, 1): which of the candidates running then it hits
    amount: float = 0.0  # a lossy link's share of packets dropped, a slow link's delay (0 for the other kinds)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Request:
    """A DAG run the workload asks for at ``at_s``: a run of ``dag_id`` on ``day`` (None: no logical
    date), or, with ``backfill_days``, a backfill of that many days ending the day before ``day``."""

    at_s: float
    dag_id: str
    day: str | None = None
    backfill_days: int = 0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def fault_schedule(
    seed: int,
    minutes: float,
    *,
    kinds: tuple[str, ...] = FAULT_KINDS,
    quiet_start_s: float = 90.0,
    quiet_end_s: float = 60.0,
    mean_gap_s: float = 70.0,
) -> list[Fault]:
    """The faults of a run of ``minutes``, in time order: every one of ``kinds`` at least once when the
    run is long enough (a shuffled bag of the kinds, drawn again when empty), one every ``mean_gap_s`` on
    average, at uniform times between the quiet start (the first trainings get going) and the quiet end.
    The default kinds draw exactly the schedule they drew before the spread deployment's were added."""
    rng = random.Random(f"faults-{seed}")
    span = minutes * 60.0 - quiet_start_s - quiet_end_s
    if span <= 0:
        return []
    count = max(1, round(span / mean_gap_s))
    times = sorted(quiet_start_s + rng.random() * span for _ in range(count))
    bag: list[str] = []
    faults = []
    for at_s in times:
        if not bag:
            bag = list(kinds)
            rng.shuffle(bag)
        kind = bag.pop()
        low, high = DURATIONS_S.get(kind, (0.0, 0.0))
        fault = Fault(round(at_s, 1), kind, round(rng.uniform(low, high), 1), round(rng.random(), 4))
        if kind in (LOSSY_LINK, SLOW_LINK):  # drawn only for these: the other kinds' draws stay as they were
            fault = dataclasses.replace(fault, amount=round(rng.uniform(*AMOUNTS[kind]), 3))
        faults.append(fault)
    return faults


def workload_schedule(
    seed: int, minutes: float, *, backfill_days: int = 3, quiet_end_s: float = 60.0, pace: float = 1.0
) -> list[Request]:
    """The DAG runs asked for: a daily retraining run every few minutes (one day after the other), a
    backfill of ``backfill_days`` days before the first day early on, a sweep and an elastic training
    now and then, ``pace`` times as far apart; times drawn from the seed, nothing asked in the last
    ``quiet_end_s``."""
    rng = random.Random(f"workload-{seed}")
    end_s = minutes * 60.0 - quiet_end_s
    requests = [Request(round(rng.uniform(0, 20), 1), RETRAINING, FIRST_DAY.isoformat())]
    requests.append(Request(round(rng.uniform(30, 120), 1), RETRAINING, FIRST_DAY.isoformat(), backfill_days))
    gaps = {RETRAINING: (150.0, 240.0), SWEEP: (200.0, 360.0), ELASTIC: (240.0, 420.0)}
    starts = {RETRAINING: requests[0].at_s, SWEEP: rng.uniform(10, 60), ELASTIC: rng.uniform(20, 90)}
    day = FIRST_DAY
    for dag_id, (low, high) in gaps.items():
        at_s = starts[dag_id] if dag_id != RETRAINING else starts[dag_id] + rng.uniform(low, high)
        while at_s < end_s:
            if dag_id == RETRAINING:
                day += timedelta(days=1)
                requests.append(Request(round(at_s, 1), dag_id, day.isoformat()))
            else:
                requests.append(Request(round(at_s, 1), dag_id))
            at_s += rng.uniform(low, high) * pace
    return sorted(requests, key=lambda r: (r.at_s, r.dag_id))


def draw_seed() -> int:
    """A fresh seed, for a run not given one (printed, so the run can be repeated)."""
    return random.SystemRandom().randrange(1, 2**31)


def pick(candidates: list, fraction: float):
    """The candidate ``fraction`` (in [0, 1)) points at, in the order given (callers sort it); None if none."""
    if not candidates:
        return None
    return candidates[min(int(fraction * len(candidates)), len(candidates) - 1)]
