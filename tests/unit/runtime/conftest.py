"""A script's rank started as its Ray worker starts it, with no cluster (test_script_rank.py,
test_rank_process.py): the job's folder with the script and a neighbour module, and one run of a script."""

import textwrap

import pytest

from airflow_provider_horovod.runtime import rank_process
from airflow_provider_horovod.runtime.rank_process import RankProcess


@pytest.fixture
def worker_keeps_its_niceness(monkeypatch):
    """The step back is for good: only in a worker process of its own (test_rank_process.py)."""
    monkeypatch.setattr(rank_process, "step_back_from_rank", lambda: None)


@pytest.fixture
def folder(tmp_path, monkeypatch):
    (tmp_path / "job" / "scripts").mkdir(parents=True)
    (tmp_path / "job" / "scripts" / "neighbour.py").write_text("VALUE = 'from the neighbour'\n")
    (tmp_path / "scratch").mkdir()
    monkeypatch.chdir(tmp_path / "job")  # the worker's start folder: the job's working_dir
    return tmp_path


@pytest.fixture
def run_rank(folder, worker_keeps_its_niceness):
    """Run ``body`` as scripts/train.py to its end: its exit code and outcome."""

    def run(body, args=(), rank=0, on_line=None):
        (folder / "job" / "scripts" / "train.py").write_text(textwrap.dedent(body))
        process = RankProcess(rank).start()
        try:
            process.run({"path": "scripts/train.py", "args": list(args)}, "/tmp/ckpt", str(folder / "scratch"), on_line)
            code = process.wait()
        finally:
            process.end()
        process.handled()
        return code, process.outcome()

    return run
