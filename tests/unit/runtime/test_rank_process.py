"""The worker's side of a script's rank (``RankProcess``), with no cluster: the arguments as a shell gives
them, every line the rank printed handled before its end is reported however slow the handling, a rank's
output held open by what it left running, the worker below its rank, the outcome file."""

import json
import subprocess
import sys
import textwrap
import threading
import time

from airflow_provider_horovod.runtime import rank_process
from airflow_provider_horovod.runtime.rank_process import RankProcess, expand


def test_the_checkpoint_folder_is_expanded_in_the_arguments_as_a_shell_would():
    args = ["--checkpoint-dir", "$AHP_CHECKPOINT_DIR", "--out=${AHP_CHECKPOINT_DIR}/m.pt", "$HOME"]
    assert expand(args, "/tmp/c") == ["--checkpoint-dir", "/tmp/c", "--out=/tmp/c/m.pt", "$HOME"]


def test_the_ranks_end_does_not_wait_for_its_lines_handling_and_every_line_is_handled(
    folder, worker_keeps_its_niceness, monkeypatch
):
    """Rank 0's first metrics line logs to MLflow (its import, its client): on a loaded machine that took
    longer than the drain's bound, and the lines after it were lost from the run's history. The rank's end
    (a peer left in a collective looks for its note) does not wait for that handling; its report does."""
    monkeypatch.setattr(rank_process, "OUTPUT_DRAIN_S", 0.2)
    release, seen = threading.Event(), []

    def held(line):
        release.wait(60)
        seen.append(line)

    body = "for epoch in range(3):\n    print(f'METRICS epoch={epoch}')\n"
    (folder / "job" / "scripts" / "train.py").write_text(body)
    process = RankProcess({"path": "scripts/train.py"}, "/tmp/ckpt", 0, str(folder / "scratch"), held)
    process.start()
    assert process.wait() == 0
    assert seen == []  # its end known, its lines still in hand
    release.set()
    process.handled()
    assert seen == ["METRICS epoch=0", "METRICS epoch=1", "METRICS epoch=2"]


def test_output_held_open_by_what_the_script_left_running_is_left_once_no_line_comes(run_rank, monkeypatch):
    monkeypatch.setattr(rank_process, "OUTPUT_DRAIN_S", 1.0)
    body = """
        import subprocess, sys
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # inherits the rank's output
        print("done")
    """
    seen = []
    started = time.monotonic()
    assert run_rank(body, on_line=seen.append) == (0, {})
    assert seen == ["done"]
    assert time.monotonic() - started < 30  # not the 60 s of what it left running


def test_the_worker_steps_back_below_its_rank_once_the_rank_runs(folder):
    """The rank at the worker's niceness (0 for a script's ranks, as horovodrun's); each of the worker's
    threads, one started before the rank's included, at Ray's 15, as Ray's other processes."""
    (folder / "job" / "scripts" / "train.py").write_text("import os\nprint(os.getpriority(os.PRIO_PROCESS, 0))\n")
    worker = textwrap.dedent(f"""
        import os, sys, threading
        sys.path[:0] = {sys.path!r}
        os.chdir({str(folder / "job")!r})
        from airflow_provider_horovod.runtime.rank_process import RankProcess
        before = threading.Event()
        threading.Thread(target=before.wait, daemon=True).start()
        process = RankProcess({{"path": "scripts/train.py"}}, "/tmp/ckpt", 0, {str(folder / "scratch")!r}, None)
        process.start()
        process.wait()
        tasks = os.listdir("/proc/self/task")
        print("worker", sorted({{os.getpriority(os.PRIO_PROCESS, int(t)) for t in tasks}}), len(tasks) > 1)
    """)
    out = subprocess.run([sys.executable, "-c", worker], capture_output=True, text=True, timeout=120).stdout
    assert "[0]<stdout>:0\n" in out
    assert "worker [15] True\n" in out


def test_the_outcome_is_read_as_the_process_left_it(tmp_path):
    process = RankProcess({"module": "x"}, "/tmp/ckpt", 0, str(tmp_path), None)
    assert process.outcome() == {}
    (tmp_path / "outcome.json").write_text(json.dumps({"error": "E: x", "failure": None}))
    assert process.outcome() == {"error": "E: x", "failure": None}
