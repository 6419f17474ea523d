"""Horovod scripts run unchanged (``train_script``), on the real cluster over Gloo: the example DAG with
templated arguments, a neighbour module, its checkpoint on S3 read by the evaluation downstream; a rank
that exits early while the other waits in a collective, a rank that raises, a script that leaves nothing, a
restart that resumes from the stored folder, a script that reports to Ray Train itself, and a smoke run stopped
after its first checkpoint."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from support.airflow_cli import TEST_DAGS, dag_test, xcom_values

from airflow_provider_horovod.exceptions import UserCodeError
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from harness.tasks import FakeTI, jobs_of

pytestmark = pytest.mark.integration

DAGS = Path(__file__).resolve().parents[2] / "dags"


def test_the_script_example_trains_from_its_templated_arguments_and_its_model_is_evaluated_from_s3(
    airflow_db, ray_cluster, ray_hook, moto_server, capfd
):
    bucket = moto_server.make_bucket(f"ahp-script-{uuid.uuid4().hex[:8]}")
    run = dag_test(
        "horovod_script",
        DAGS / "horovod_script.py",
        conf={"storage_path": f"s3://{bucket}/runs"},
        logical_date="2026-03-04",
    )
    captured = capfd.readouterr()
    output = captured.out + captured.err
    assert run.state == "success", output[-8000:]
    # Each rank's lines, marked as horovodrun marks them, with the ranks horovodrun would give on one host.
    assert "[0]<stdout>:rank 0 of 2 (local rank 0, cross rank 0)" in output
    assert "[1]<stdout>:rank 1 of 2 (local rank 1, cross rank 0)" in output
    (checkpoint,) = set(re.findall(r"checkpoint: (s3://\S+) \(epoch", output))
    assert checkpoint.startswith(f"s3://{bucket}/runs/")
    keys = [o["Key"] for o in moto_server.client().list_objects_v2(Bucket=bucket)["Contents"]]
    assert checkpoint.split(f"s3://{bucket}/", 1)[1] + "/model.pt" in keys
    # The evaluation loaded the last epoch's model, saved from the rendered {{ ds }}.
    assert "(epoch 2, data of '2026-03-04')" in output
    assert float(output.split("holdout accuracy: ", 1)[1].split()[0]) > 0.8
    # The METRICS lines of rank 0 are the run's metrics.
    metrics = re.findall(r"metrics: (\{[^}]*\})", output)
    assert metrics, output[-4000:]
    assert "'epoch': 2.0" in metrics[-1]


@pytest.mark.oldest_airflow
def test_the_taskflow_function_gets_its_context_and_its_command_line_sets_the_task(monkeypatch):
    """On every supported Airflow: the function is called as ``@task.bash`` calls its own (context values by
    name), and what it returns sets the script, its arguments and the launcher's flags before the job."""
    from airflow_provider_horovod.decorators.horovod import _HorovodScriptDecoratedOperator
    from airflow_provider_horovod.operators.base import BaseRayJobOperator

    seen = {}
    monkeypatch.setattr(
        BaseRayJobOperator,
        "execute",
        lambda op, context: seen.update(script=op.train_script, args=op.script_args, workers=op.num_workers),
    )

    def command(epochs, ds=None):
        return f"horovodrun -np 3 python train.py --epochs {epochs} --date {ds}"

    op = _HorovodScriptDecoratedOperator(task_id="t", python_callable=command, op_args=[7], op_kwargs={})
    op.execute({"ds": "2026-02-03", "ti": FakeTI("taskflow-call")})
    assert seen == {"script": "train.py", "args": ["--epochs", "7", "--date", "2026-02-03"], "workers": 3}


def write_script(folder: Path, body: str) -> str:
    """The script in a folder of its own: the folder travels with the job."""
    (folder / "scripts").mkdir()
    path = folder / "scripts" / "train.py"
    path.write_text(body)
    return str(path)


def script_operator(tmp_path, body: str, **kwargs):
    return HorovodTrainOperator(
        task_id="train",
        train_script=write_script(tmp_path, body),
        num_workers=2,
        storage_path=str(tmp_path / "storage"),
        deferrable=False,
        poll_interval_seconds=0.5,
        **kwargs,
    )


RANK_0_EXITS_EARLY = """
import sys
import horovod.torch as hvd
import torch
hvd.init()
if hvd.rank() == 0:
    sys.exit(0)  # a clean exit, but before the collective that rank 1 waits in
hvd.allreduce(torch.tensor([1.0]), name="never-joined")
"""


def test_a_rank_that_exits_early_fails_the_task_once_naming_it_and_its_exit_code(ray_hook, tmp_path):
    """Rank 0 exits with code 0 while rank 1 waits in an allreduce: no hang, one job, the user's error naming
    rank 0, although its own exit was clean."""
    ti = FakeTI(f"script-fail-{uuid.uuid4().hex[:6]}")
    with pytest.raises(UserCodeError) as err:
        script_operator(tmp_path, RANK_0_EXITS_EARLY, horovod_timeout_s=60).execute({"ti": ti})
    assert "rank 0 (exit code 0)" in str(err.value), str(err.value)
    (job,) = jobs_of(ray_hook, ti.run_id)
    assert job["status"] == "FAILED"


RANK_1_RAISES = """
import horovod.torch as hvd
import torch


def load_shard(rank):
    raise ValueError(f"shard {rank} is empty")


hvd.init()
if hvd.rank() == 1:
    load_shard(hvd.rank())
hvd.allreduce(torch.tensor([1.0]), name="after-loading")
"""


def test_an_exception_on_one_rank_fails_the_task_once_with_the_scripts_own_frames(ray_hook, tmp_path):
    """Rank 1 raises while rank 0 waits in an allreduce: one job, the user's error with the rank, the
    exception and the line of the script that raised it."""
    ti = FakeTI(f"script-raise-{uuid.uuid4().hex[:6]}")
    with pytest.raises(UserCodeError) as err:
        script_operator(tmp_path, RANK_1_RAISES, horovod_timeout_s=60).execute({"ti": ti})
    message = str(err.value)
    assert "rank 1: ValueError: shard 1 is empty" in message, message
    assert 'File "train.py", line 7, in load_shard' in message, message  # as `python train.py` names it
    assert 'raise ValueError(f"shard {rank} is empty")' in message, message
    (job,) = jobs_of(ray_hook, ti.run_id)
    assert job["status"] == "FAILED"


def test_a_taskflow_command_line_runs_its_script_which_leaves_no_checkpoint(airflow_db, ray_cluster, tmp_path, capfd):
    """``@task.horovod_script`` returning ``horovodrun -np 2 ... python scripts/report_world.py --date {ds}``."""
    run = dag_test(
        "ahp_script_command",
        TEST_DAGS / "script_dags.py",
        conf={"storage_path": str(tmp_path)},
        logical_date="2026-05-06",
    )
    captured = capfd.readouterr()
    output = captured.out + captured.err
    assert run.state == "success", output[-8000:]
    assert "[0]<stdout>:date 2026-05-06" in output
    # Ray starts its workers at niceness 15; horovodrun's ranks run at 0, and so do a script's.
    assert "[0]<stdout>:niceness 0" in output
    assert "[1]<stdout>:niceness 0" in output
    assert "[0]<stdout>:controller niceness [0]" in output  # the job's workers start at 0, Train's actors too
    assert "The script left no checkpoint (XCom checkpoint_uri: None)" in output
    result = xcom_values("ahp_script_command", "report_world", run.run_id)["return_value"]
    assert result["checkpoint_uri"] is None
    assert result["metrics"] == {"size": 2.0, "rank_sum": 1.0}
    assert result["world_size"] == 2


# A script that reports to Ray Train itself, from its own process: its calls are answered by its worker.
REPORTS_ITSELF = """
import os, tempfile
import horovod.torch as hvd
import ray.train
import torch

hvd.init()
assert ray.train.get_context().get_world_rank() == hvd.rank()
size = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, name="size").item()
with tempfile.TemporaryDirectory() as folder:
    if hvd.rank() == 0:
        with open(os.path.join(folder, "model.txt"), "w") as f:
            f.write("reported")
    checkpoint = ray.train.Checkpoint.from_directory(folder) if hvd.rank() == 0 else None
    ray.train.report({"size": size}, checkpoint=checkpoint)
"""


def test_a_script_that_reports_to_ray_train_itself_is_recorded_as_a_function_is(ray_hook, tmp_path):
    result = script_operator(tmp_path, REPORTS_ITSELF).execute({"ti": FakeTI(f"script-report-{uuid.uuid4().hex[:6]}")})
    assert result["metrics"] == {"size": 2.0}
    assert (Path(result["checkpoint_uri"]) / "model.txt").read_text() == "reported"


# Rank 0 saves each epoch; its checkpoint folder is stored once it holds still for a couple of seconds.
# After epoch 1, rank 1's process dies as an OOM kill would, but only on the group's first start (nothing
# to resume from then); Ray Train starts a new group and the script finds epoch 1's files.
DIES_ONCE = """
import os, signal, sys, time
import horovod.torch as hvd
import torch

checkpoint_dir = sys.argv[sys.argv.index("--checkpoint-dir") + 1]
state_file = os.path.join(checkpoint_dir, "state.txt")
hvd.init()
print(f"scratch {os.path.dirname(checkpoint_dir)}")
first = 0
if os.path.exists(state_file):
    first = int(open(state_file).read()) + 1
    print(f"resuming at epoch {first}")
resumed = first > 0
first = int(hvd.broadcast(torch.tensor([first]), root_rank=0).item())
for epoch in range(first, 4):
    hvd.allreduce(torch.tensor([1.0]), name=f"epoch-{epoch}")
    if hvd.rank() == 0:
        with open(state_file, "w") as f:
            f.write(str(epoch))
        print(f"METRICS epoch={epoch}")
    if epoch == 1:
        time.sleep(8)  # the folder holds still: it is stored (within about 2 s) before the kill
        if hvd.rank() == 1 and not resumed:
            os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_worker_restarts_the_script_from_its_last_stored_checkpoint(ray_hook, tmp_path):
    ti = FakeTI(f"script-resume-{uuid.uuid4().hex[:6]}")
    op = script_operator(tmp_path, DIES_ONCE, max_failures=1, script_args=["--checkpoint-dir", "$AHP_CHECKPOINT_DIR"])
    result = op.execute({"ti": ti})
    log = ray_hook.get_job_logs(result["submission_id"])
    assert "[0]<stdout>:resuming at epoch 2" in log, log[-4000:]
    assert [s["reason"] for s in result["segments"]] == ["start", "failure"]
    assert result["metrics"] == {"epoch": 3.0}
    assert (Path(result["checkpoint_uri"]) / "state.txt").read_text() == "3"
    # Each worker's scratch folder is gone (this cluster's node is this machine): the killed group's once the
    # new one started, the last group's as its scripts ended.
    scratch = re.findall(r"<stdout>:scratch (\S+)", log)
    assert len(scratch) == 4, log[-4000:]
    assert [s for s in scratch if Path(s).exists()] == []


# 60 epochs of a second, a checkpoint each: a minute whole, stopped far sooner in a smoke run.
LONG_TRAINING = """
import os, time
import horovod.torch as hvd
import torch

hvd.init()
assert os.environ["AHP_SMOKE_RUN"] == "1"
for epoch in range(60):
    hvd.allreduce(torch.tensor([1.0]), name=f"epoch-{epoch}")
    if hvd.rank() == 0:
        with open(os.path.join(os.environ["AHP_CHECKPOINT_DIR"], "state.txt"), "w") as f:
            f.write(str(epoch))
    time.sleep(1)
"""


def test_a_smoke_run_stops_the_script_after_its_first_stored_checkpoint(ray_hook, tmp_path):
    ti = FakeTI(f"script-smoke-{uuid.uuid4().hex[:6]}")
    result = script_operator(tmp_path, LONG_TRAINING, smoke_run=True).execute({"ti": ti})
    assert result["smoke_run"] is True
    epoch = int((Path(result["checkpoint_uri"]) / "state.txt").read_text())
    assert epoch < 30, f"the smoke run trained to epoch {epoch}"
    log = ray_hook.get_job_logs(result["submission_id"])
    assert "[1] Smoke run: the script was stopped after its first stored checkpoint." in log, log[-4000:]
