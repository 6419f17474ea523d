"""The parts of a script run that need no cluster: metrics lines, rank-marked output, the checkpoint
folder in the arguments, and a script run as ``__main__`` with its argv, its folder and its exit code."""

import io
import os
import sys
import traceback

import pytest

from airflow_provider_horovod.runtime.script import RankLines, expand, parse_metrics, run_as_main, state


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


def test_each_whole_line_is_marked_with_the_rank_and_shown_once():
    out, seen = io.StringIO(), []
    stream = RankLines(out, "[1]<stdout>:", seen.append)
    stream.write("epoch 1\nepo")
    stream.write("ch 2\n")
    stream.write("no newline")
    stream.close_line()
    assert out.getvalue() == "[1]<stdout>:epoch 1\n[1]<stdout>:epoch 2\n[1]<stdout>:no newline\n"
    assert seen == ["epoch 1", "epoch 2", "no newline"]


def test_the_checkpoint_folder_is_expanded_in_the_arguments_as_a_shell_would():
    args = ["--checkpoint-dir", "$AHP_CHECKPOINT_DIR", "--out=${AHP_CHECKPOINT_DIR}/m.pt", "$HOME"]
    assert expand(args, "/tmp/c") == ["--checkpoint-dir", "/tmp/c", "--out=/tmp/c/m.pt", "$HOME"]


def test_a_folder_changes_state_when_a_file_is_written(tmp_path):
    empty = state(str(tmp_path))
    (tmp_path / "model.pt").write_bytes(b"x")
    assert empty == ()
    assert state(str(tmp_path)) != empty


@pytest.fixture
def script_folder(tmp_path, monkeypatch):
    (tmp_path / "neighbour.py").write_text("VALUE = 'from the neighbour'\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(folder, body, args=()):
    (folder / "train.py").write_text(body)
    return run_as_main({"path": "train.py", "args": list(args)}, "/tmp/ckpt", 0, None)


def test_a_script_runs_as_main_with_its_argv_and_its_neighbour_module(script_folder, capsys):
    body = "import sys, neighbour\nif __name__ == '__main__':\n    print(sys.argv[1:], neighbour.VALUE)\n"
    assert run(script_folder, body, ["--epochs", "3"]) == 0
    assert capsys.readouterr().out == "[0]<stdout>:['--epochs', '3'] from the neighbour\n"
    assert "neighbour" in sys.modules  # imported from the script's folder, which left sys.path again
    assert str(script_folder) not in sys.path


@pytest.mark.parametrize(
    ("ending", "code"), [("sys.exit(0)", 0), ("sys.exit()", 0), ("sys.exit(3)", 3), ("sys.exit('bad')", 1)]
)
def test_the_exit_code_is_the_scripts(script_folder, ending, code):
    assert run(script_folder, f"import sys\n{ending}\n") == code


def test_an_exception_comes_out_with_the_scripts_frame(script_folder):
    with pytest.raises(ZeroDivisionError) as err:
        run(script_folder, "def step():\n    return 1 / 0\nstep()\n")
    frames = traceback.extract_tb(err.value.__traceback__)
    assert any(os.path.basename(f.filename) == "train.py" for f in frames)


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
