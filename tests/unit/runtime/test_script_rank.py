"""A script's rank as a process of its own, with no cluster: the script as ``__main__`` with its argv and its
folder, its exit code, what it raised classed in its process, its calls of Ray Train sent to its worker, the
process ending with its worker, Ctrl-C. The worker's side of it (its lines, its niceness): test_rank_process.py."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from airflow_provider_horovod.runtime import rank_process, script
from airflow_provider_horovod.runtime.rank_process import RankProcess

pytestmark = pytest.mark.usefixtures("worker_keeps_its_niceness")


def test_the_script_runs_as_main_in_a_process_of_its_own_with_its_argv_and_neighbour(capfd, run_rank):
    seen = []
    body = """
        import os, sys, neighbour
        if __name__ == "__main__":
            print(sys.argv[1:], neighbour.VALUE, os.path.basename(os.getcwd()))
            print(os.getppid() == int(os.environ["AHP_SCRIPT_WORKER_PID"]), "ray" in sys.modules)
            print("METRICS loss=0.5")
            sys.stdout.write("no newline")
    """
    code, outcome = run_rank(body, ["--epochs", "3", "--out", "$AHP_CHECKPOINT_DIR"], rank=1, on_line=seen.append)
    out = capfd.readouterr().out
    assert (code, outcome) == (0, {})
    # The shell's expansion of the checkpoint folder; the job's folder as the start folder, as under horovodrun.
    assert "[1]<stdout>:['--epochs', '3', '--out', '/tmp/ckpt'] from the neighbour job\n" in out
    assert "[1]<stdout>:True False\n" in out  # a child of the worker, with nothing of Ray imported
    assert "[1]<stdout>:no newline\n" in out
    assert seen[-2:] == ["METRICS loss=0.5", "no newline"]


@pytest.mark.parametrize(
    ("ending", "code"), [("sys.exit(0)", 0), ("sys.exit()", 0), ("sys.exit(3)", 3), ("sys.exit('bad')", 1)]
)
def test_the_exit_code_is_the_scripts(run_rank, ending, code):
    assert run_rank(f"import sys\n{ending}\n") == (code, {})


def test_what_the_script_raised_is_classed_in_its_process_with_its_own_frames(run_rank, capfd):
    code, outcome = run_rank("def step():\n    return 1 / 0\n\nstep()\n", rank=1)
    assert code == 1
    assert outcome["error"] == "ZeroDivisionError: division by zero"
    failure = outcome["failure"]
    assert (failure["failure_class"], failure["rank"]) == ("user_code", 1)
    assert failure["summary"] == "ZeroDivisionError: division by zero"
    assert 'scripts/train.py", line 2, in step' in failure["traceback"]
    assert "[1]<stderr>:ZeroDivisionError: division by zero" in capfd.readouterr().err  # as Python prints it


def test_a_lost_peer_is_no_users_error(run_rank):
    body = "class GlooError(RuntimeError):\n    pass\n\nraise GlooError('Connection closed by peer')\n"
    code, outcome = run_rank(body)
    assert code == 1
    assert outcome == {"error": "GlooError: Connection closed by peer", "failure": None}
    raised = script.failed(None, 0, outcome)
    assert isinstance(raised, script.ScriptRankLostError)
    from airflow_provider_horovod import failures

    assert failures.of_error(raised, user_code=True).failure_class is failures.FailureClass.INFRASTRUCTURE


def test_the_scripts_calls_of_ray_train_are_answered_by_the_worker(folder, monkeypatch, tmp_path, run_rank):
    asked = []

    def answer(request):
        asked.append(request)
        if request["call"] == "context":
            return {"value": 1}
        if request["call"] == "get_checkpoint":
            return {"value": str(tmp_path)}
        return {}

    monkeypatch.setattr(rank_process, "answer", answer)
    body = """
        import os, tempfile
        import ray.train
        from ray.train import Checkpoint, report

        rank = ray.train.get_context().get_world_rank()
        start = ray.train.get_checkpoint()
        with tempfile.TemporaryDirectory() as d:
            report({"loss": 0.25, "rank": rank}, checkpoint=Checkpoint.from_directory(d))
            print(start.path)
    """
    code, outcome = run_rank(body)
    assert (code, outcome) == (0, {})
    assert [r["call"] for r in asked] == ["context", "get_checkpoint", "report"]
    assert asked[0]["name"] == "get_world_rank"
    assert asked[2]["metrics"] == {"loss": 0.25, "rank": 1}
    assert os.path.isabs(asked[2]["checkpoint"])  # the script's own folder, on this node


def test_a_report_that_ends_a_smoke_run_ends_the_script_as_it_ends_a_function(run_rank, monkeypatch):
    monkeypatch.setattr(rank_process, "answer", lambda request: {"smoke_run_done": True})
    body = """
        import ray.train
        try:
            ray.train.report({"step": 1})
        except Exception:
            print("a smoke run's stop is no Exception: the script's own handlers let it through")
        print("not reached")
    """
    assert run_rank(body) == (0, {"smoke_run_done": True})


def test_the_scripts_process_ends_with_its_worker(folder, tmp_path):
    """A worker killed (its node lost, its group replaced) takes its rank's process with it."""
    (folder / "job" / "scripts" / "train.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    worker = textwrap.dedent(f"""
        import os, sys, time
        sys.path[:0] = {sys.path!r}
        os.chdir({str(folder / "job")!r})
        from airflow_provider_horovod.runtime.rank_process import RankProcess
        process = RankProcess(0).start()
        process.run({{"path": "scripts/train.py"}}, "/tmp/ckpt", {str(folder / "scratch")!r}, None)
        print(process.process.pid, flush=True)
        process.wait()
    """)
    parent = subprocess.Popen([sys.executable, "-c", worker], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert "up" in parent.stdout.readline()
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and alive(child):
        time.sleep(0.1)
    assert not alive(child)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_ctrl_c_stops_the_script_even_where_the_worker_ignores_and_blocks_it(folder):
    """A Ray worker ignores SIGINT and its threads block it, and its children would inherit both: a smoke
    run's stop is Ctrl-C."""
    (folder / "job" / "scripts" / "train.py").write_text(
        "import time\ntry:\n    print('up', flush=True)\n    time.sleep(60)\nfinally:\n    print('cleaned up')\n"
    )
    seen = []
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        process = RankProcess(0).start()
        process.run({"path": "scripts/train.py"}, "/tmp/ckpt", str(folder / "scratch"), seen.append)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        signal.signal(signal.SIGINT, previous)
    deadline = time.monotonic() + 60
    while "up" not in seen and time.monotonic() < deadline:  # the script is in its sleep
        time.sleep(0.1)
    started = time.monotonic()
    process.interrupt()
    assert process.wait() == 1
    assert time.monotonic() - started < 20
    assert process.outcome()["error"].startswith("KeyboardInterrupt")
