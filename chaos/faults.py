"""The fault injector of `make chaos`: the schedule drawn from the seed (chaos/schedule.py), each
fault done at its second against what runs then. A fault that lasts (a host away, S3 down, the head
down) is mended in its own thread; the cluster's changes (a host, the head) wait for each other.

Every fault leaves an entry: when it was due and done, what it hit (or why it hit nothing: nothing of
its kind was running), and when it was mended.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

from chaos import network, schedule
from chaos.deployment import Deployment, task_process
from chaos.observe import Observer, ti_key


class Injector:
    def __init__(self, deployment: Deployment, observer: Observer, faults: list[schedule.Fault], say: Callable) -> None:
        self.deployment, self.observer, self.faults, self.say = deployment, observer, faults, say
        self.done: list[dict] = []
        self.marked_failed: set[str] = set()  # task instances the injector marked failed itself
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-injector", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """No more faults; waits for the lasting ones to be mended."""
        self._stop.set()
        self._thread.join()
        for thread in self._threads:
            thread.join()

    def _run(self) -> None:
        for fault in self.faults:
            if self._stop.wait(max(0.0, fault.at_s - self.observer.now())):
                return
            thread = threading.Thread(target=self._inject, args=(fault,), name=f"fault-{fault.kind}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _inject(self, fault: schedule.Fault) -> None:
        entry = {**fault.to_dict(), "started_s": self.observer.now()}
        self.done.append(entry)
        try:
            entry.update(getattr(self, fault.kind)(fault) or {})
        except Exception as err:  # noqa: BLE001 - a fault that could not be done is reported, the run goes on
            entry["error"] = f"{type(err).__name__}: {err}"
        entry["ended_s"] = self.observer.now()
        what = entry.get("target") or entry.get("skipped") or f"could not be done: {entry.get('error')}"
        self.say(f"fault {fault.kind} at {entry['started_s']:.0f} s: {what}")

    # --- the faults (one method per kind, named as the kind) ------------------------------------

    def kill_worker(self, fault: schedule.Fault) -> dict:
        target = schedule.pick(self.deployment.train_worker_pids(), fault.pick)
        if target is None:
            return {"skipped": "no training worker running"}
        host, pid = target
        os.kill(pid, signal.SIGKILL)
        return {"target": f"Ray Train worker pid {pid} on host {host + 1}"}

    def lose_host(self, fault: schedule.Fault) -> dict:
        with self.deployment.topology:
            self.deployment.lose_host()
            lost_at = self.observer.now()
            time.sleep(fault.duration_s)
            self.deployment.bring_back_host()
        return {"target": "host 2 (every process SIGKILLed)", "lost_s": lost_at, "back_s": self.observer.now()}

    def kill_task_process(self, fault: schedule.Fault) -> dict:
        running = [ti for ti in self.observer.running_trainings(("running",)) if task_process(ti["id"])]
        ti = schedule.pick(running, fault.pick)
        if ti is None:
            return {"skipped": "no training's task process running"}
        pid = task_process(ti["id"])
        if pid is None:
            return {"skipped": "the task process ended meanwhile"}
        os.kill(pid, signal.SIGKILL)
        return {"target": f"{key_of(ti)} (task process {pid})"}

    def triggerer_sigterm(self, fault: schedule.Fault) -> dict:
        self.deployment.restart("triggerer")
        return {"target": "triggerer (SIGTERM, started again)"}

    def triggerer_sigkill(self, fault: schedule.Fault) -> dict:
        self.deployment.kill_and_start("triggerer")
        return {"target": "triggerer (SIGKILL, started again)"}

    def restart_scheduler(self, fault: schedule.Fault) -> dict:
        self.deployment.restart("scheduler")
        return {"target": "scheduler (SIGTERM, started again)"}

    def restart_ray_head(self, fault: schedule.Fault) -> dict:
        with self.deployment.topology:
            self.deployment.stop_head()
            stopped_at = self.observer.now()
            time.sleep(fault.duration_s)
            self.deployment.start_head()
        return {"target": "Ray head (host 1 SIGKILLed, a new head)", "down_s": stopped_at, "up_s": self.observer.now()}

    def s3_outage(self, fault: schedule.Fault) -> dict:
        self.deployment.s3_down()
        down_at = self.observer.now()
        time.sleep(fault.duration_s)
        self.deployment.s3_up()
        return {"target": "S3 (refusing connections)", "down_s": down_at, "up_s": self.observer.now()}

    def mark_failed(self, fault: schedule.Fault) -> dict:
        ti = schedule.pick(self.observer.running_trainings(), fault.pick)
        if ti is None:
            return {"skipped": "no training running or deferred"}
        stack = self.deployment.stack
        assert stack is not None
        path = f"/dags/{ti['dag_id']}/dagRuns/{ti['dag_run_id']}/taskInstances/{ti['task_id']}"
        if ti.get("map_index") is not None and ti["map_index"] >= 0:
            path += f"/{ti['map_index']}"
        self.marked_failed.add(key_of(ti))
        stack.api("PATCH", path, json={"new_state": "failed"})
        return {"target": f"{key_of(ti)} ({ti['state']})"}

    # --- the spread deployment's faults ------------------------------------------------------------

    def spread(self):
        from chaos.spread import SpreadDeployment

        if not isinstance(self.deployment, SpreadDeployment):
            raise RuntimeError("a fault of the spread deployment (CHAOS_DEPLOYMENT=spread)")
        return self.deployment

    def partition(self, fault: schedule.Fault) -> dict:
        """One link cut both ways (its packets dropped, as a switch or a firewall loses them), then back."""
        spread = self.spread()
        link = schedule.pick(list(schedule.LINKS), fault.pick)
        # The worker of a worker's link: the fault's fraction again, within its link's share of [0, 1).
        side = (fault.pick * len(schedule.LINKS)) % 1.0
        netns, cut, rules = spread.link_rules(link, side)
        spread.add_rules(netns, rules)
        cut_at = self.observer.now()
        try:
            time.sleep(fault.duration_s)
        finally:
            spread.remove_rules(netns, rules)
        entry = {"target": f"{link}: {cut}", "link": link, "cut_s": cut_at, "healed_s": self.observer.now()}
        if link == "ray_host-ray_host" and spread.ray_node_back():
            entry["ray_node_restarted"] = True  # the head had declared it dead meanwhile
        return entry

    def lossy_link(self, fault: schedule.Fault) -> dict:
        spread = self.spread()
        host = spread.lossy_host(fault.pick)
        rules = network.drop_share(host.iface, fault.amount)
        spread.add_rules(host.netns, rules)
        since = self.observer.now()
        try:
            time.sleep(fault.duration_s)
        finally:
            spread.remove_rules(host.netns, rules)
        return {
            "target": f"{host.name} drops {fault.amount:.0%} of its packets",
            "lossy_s": since,
            "healed_s": self.observer.now(),
        }

    def slow_link(self, fault: schedule.Fault) -> dict:
        spread = self.spread()
        link = schedule.pick(list(schedule.SLOW_LINKS), fault.pick)
        what = spread.slow_link(link, fault.amount)
        since = self.observer.now()
        try:
            time.sleep(fault.duration_s)
        finally:
            spread.slow_link(link, 0.0)
        return {
            "target": f"{what} delayed {fault.amount:.2f} s",
            "link": link,
            "slow_s": since,
            "healed_s": self.observer.now(),
        }

    def postgres_restart(self, fault: schedule.Fault) -> dict:
        spread = self.spread()
        spread.postgres_down()
        down_at = self.observer.now()
        time.sleep(fault.duration_s)
        spread.postgres_up()
        return {"target": "PostgreSQL (stopped, started again)", "down_s": down_at, "healed_s": self.observer.now()}

    def broker_restart(self, fault: schedule.Fault) -> dict:
        spread = self.spread()
        spread.broker_down()
        down_at = self.observer.now()
        time.sleep(fault.duration_s)
        spread.broker_up()
        return {"target": "Redis (stopped, started again)", "down_s": down_at, "healed_s": self.observer.now()}

    def storage_refusal(self, fault: schedule.Fault) -> dict:
        spread = self.spread()
        spread.refuse_writes(True)
        since = self.observer.now()
        try:
            time.sleep(fault.duration_s)
        finally:
            spread.refuse_writes(False)
        return {"target": "S3 (writes answered 503 SlowDown)", "since_s": since, "healed_s": self.observer.now()}


def key_of(ti: dict) -> str:
    return ti_key(ti["dag_id"], ti["task_id"], ti["dag_run_id"], ti.get("map_index"))
