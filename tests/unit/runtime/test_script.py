"""The parts of a script run that need no cluster: metrics lines, the scratch folders of ended workers. The
rank's own process: test_script_rank.py; its worker's side of it: test_rank_process.py."""

import os
import sys

import pytest

from airflow_provider_horovod.runtime.script import parse_metrics


def test_the_runner_ray_pickles_records_into_this_modules_history():
    """Ray ships the runner pickled: on the worker it must record the printed metrics in the module's
    ``HISTORY`` (what the Training view, MLflow and the result read), not in a copy pickled with it."""
    import cloudpickle

    from airflow_provider_horovod.documents import TrainingSpec
    from airflow_provider_horovod.runtime import script

    spec = TrainingSpec(submission_id="s", script={"path": "train.py"}, storage_uri="/x", python_version="3.11")
    shipped = cloudpickle.loads(cloudpickle.dumps(script.runner(spec)))
    assert shipped.func.__globals__["HISTORY"] is script.HISTORY


@pytest.mark.parametrize(
    ("line", "metrics"),
    [
        ("METRICS loss=0.25 epoch=3", {"loss": 0.25, "epoch": 3.0}),
        ('METRICS {"loss": 0.5}', {"loss": 0.5}),
        ("METRICS loss=nan-ish", None),
        ("METRICS", None),
        ("loss=0.25", None),
        ("Epoch 1 METRICS loss=1", None),
    ],
)
def test_metrics_lines(line, metrics):
    assert parse_metrics(line) == metrics


def test_the_scratch_folders_of_ended_workers_are_removed_and_no_other(tmp_path, monkeypatch):
    """A worker killed with its group (a restart after a failure) cannot remove its own: the next worker on
    the node does, and leaves a living worker's alone."""
    import subprocess
    import tempfile

    from airflow_provider_horovod.runtime import script

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f"{script.SCRATCH_PREFIX}{ended.stdout.strip()}-x1"
    alive = tmp_path / f"{script.SCRATCH_PREFIX}{os.getpid()}-x2"
    other = tmp_path / "ahp-something-else"
    for folder in (dead, alive, other):
        (folder / "checkpoint").mkdir(parents=True)
    script.remove_scratch_of_ended_workers()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, other.name])


def test_a_scripts_driver_connects_so_that_its_jobs_workers_start_at_niceness_0(monkeypatch):
    """Train's own actors too (the entrypoint connects so for a script on either trainer API): at Ray's 15 the
    synchronization actor's imports waited for the ranks and ran in their timed loop."""
    import ray

    from airflow_provider_horovod.runtime.script import connect_at_niceness_0

    calls = []
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    connect_at_niceness_0()
    assert calls == [{"runtime_env": {"env_vars": {"RAY_worker_niceness": "0"}}}]
