"""The worker's side of a script's rank (``RankProcess``), with no cluster: the arguments as a shell gives
them, every line the rank printed handled before its end is reported however slow the handling, a rank's
output held open by what it left running, the worker below its rank, the outcome file, a rank started early
(its imports done while it waits, then its script run in the worker's environment of that moment)."""

import json
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from airflow_provider_horovod.runtime import rank_process
from airflow_provider_horovod.runtime.rank_process import RankProcess, expand, imports_of


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
    process = RankProcess(0).start()
    process.run({"path": "scripts/train.py"}, "/tmp/ckpt", str(folder / "scratch"), held)
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
        process = RankProcess(0).start()
        process.run({{"path": "scripts/train.py"}}, "/tmp/ckpt", {str(folder / "scratch")!r}, None)
        process.wait()
        tasks = os.listdir("/proc/self/task")
        print("worker", sorted({{os.getpriority(os.PRIO_PROCESS, int(t)) for t in tasks}}), len(tasks) > 1)
    """)
    out = subprocess.run([sys.executable, "-c", worker], capture_output=True, text=True, timeout=120).stdout
    assert "[0]<stdout>:0\n" in out
    assert "worker [15] True\n" in out


def test_the_outcome_is_read_as_the_process_left_it(tmp_path):
    process = RankProcess(0)
    process.outcome_path = str(tmp_path / "outcome.json")
    assert process.outcome() == {}
    (tmp_path / "outcome.json").write_text(json.dumps({"error": "E: x", "failure": None}))
    assert process.outcome() == {"error": "E: x", "failure": None}


@pytest.mark.parametrize(
    ("source", "imports"),
    [
        ("import horovod.torch as hvd\nimport torch.nn as nn\n", ["torch", "horovod.torch"]),
        ("from horovod import torch as hvd\n", ["horovod.torch"]),
        ("def main():\n    import numpy as np\n", ["numpy"]),
        ("import argparse\nfrom . import local\nimport torchvision\n", []),
        ("this is not Python (\n", []),
    ],
)
def test_a_rank_started_early_imports_only_the_heavy_modules_its_script_imports(folder, source, imports):
    (folder / "job" / "scripts" / "train.py").write_text(source)
    assert imports_of({"path": "scripts/train.py"}) == imports
    assert imports_of({"path": "scripts/missing.py"}) == []


def test_a_module_scripts_imports_are_read_from_its_source(folder, monkeypatch):
    (folder / "job" / "scripts" / "__init__.py").write_text("")
    (folder / "job" / "scripts" / "train.py").write_text("import torch\n")
    monkeypatch.syspath_prepend(str(folder / "job"))
    assert imports_of({"module": "scripts.train"}) == ["torch"]


def test_a_rank_started_early_runs_its_script_with_the_workers_environment_and_folder_of_when_it_is_handed(
    folder, worker_keeps_its_niceness, monkeypatch
):
    """Started while Ray Train sets up the group (before the rank's Horovod variables are set), it imports what
    it was given, waits, and runs the script as a rank started at that moment would."""
    (folder / "job" / "scripts" / "train.py").write_text(
        "import os, sys\nprint(os.environ['AHP_TEST_WHEN'], 'decimal' in sys.modules, os.path.basename(os.getcwd()))\n"
    )
    monkeypatch.setenv("AHP_TEST_WHEN", "at its start")
    monkeypatch.chdir(folder)
    process = RankProcess(0, ["decimal"]).start()
    time.sleep(1.0)
    monkeypatch.setenv("AHP_TEST_WHEN", "when_handed")
    monkeypatch.chdir(folder / "job")
    seen: list[str] = []
    try:
        process.run({"path": "scripts/train.py"}, "/tmp/ckpt", str(folder / "scratch"), seen.append)
        assert process.wait() == 0
    finally:
        process.end()
    process.handled()
    assert seen == ["when_handed True job"]


def test_a_worker_takes_the_process_started_as_it_started_else_starts_one(folder, monkeypatch):
    """Started by Ray's setup hook before the worker knows its rank; marked with the rank once taken."""
    monkeypatch.setenv("AHP_SCRIPT_EARLY_IMPORTS", "decimal")
    rank_process.start_in_worker()
    early = rank_process._EARLY[0]
    assert (early.rank, early.imports) == (None, ["decimal"])
    assert rank_process.take(1) is early and early.rank == 1
    assert early.marked("stdout")() == "[1]<stdout>:"
    fresh = rank_process.take(1)
    assert fresh is not early and fresh.rank == 1  # taken once; none waits now
    for process in (early, fresh):
        process.end()


def test_a_jobs_own_setup_hook_is_kept_and_its_ranks_start_with_their_script(folder, monkeypatch):
    from ray._private import ray_constants
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    (folder / "job" / "scripts" / "train.py").write_text("import torch\n")
    hook = "airflow_provider_horovod.runtime.rank_process.start_in_worker"
    env = rank_process.early_start_env({"path": "scripts/train.py"})
    assert env == {ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR: hook, "AHP_SCRIPT_EARLY_IMPORTS": "torch"}
    job = {"runtime_env": {"worker_process_setup_hook": "team.setup"}}
    monkeypatch.setenv(RAY_JOB_CONFIG_JSON_ENV_VAR, json.dumps(job))
    assert rank_process.early_start_env({"path": "scripts/train.py"}) == {}
