"""Why an attempt failed, decided in one place: the runtime's verdict on what it caught, and the class
of a job from Ray's job info when the runtime could say nothing. Job infos here are as Ray 2.60
answers them for such jobs; Ray's own exception types are classified in
``tests/unit/runtime/test_entrypoint.py``, where Ray is installed."""

import json

import pytest

from airflow_provider_horovod import exceptions, failures
from airflow_provider_horovod.contract import FAILURE_MARK
from airflow_provider_horovod.failures import Failure, FailureClass, of_error, of_job, of_line


def raise_in_user_code():
    def train(config):
        return config["lr"] / 0

    try:
        train({"lr": 0.1})
    except ZeroDivisionError as err:
        return err


@pytest.mark.parametrize("failure_class", list(FailureClass))
def test_each_class_has_its_own_error_type_under_one_base(failure_class):
    error = failure_class.error
    assert issubclass(error, exceptions.JobFailure)
    assert issubclass(error, exceptions.HorovodProviderError)
    assert failure_class.retryable is (failure_class not in (FailureClass.USER_CODE, FailureClass.CONFIGURATION))
    assert len({c.error for c in FailureClass}) == len(FailureClass)


def test_a_verdict_travels_as_one_line_and_comes_back_whole():
    verdict = Failure(
        FailureClass.USER_CODE,
        "ZeroDivisionError: division by zero",
        rank=1,
        error_type="ZeroDivisionError",
        message="division by zero",
        traceback="Traceback ...\n",
    )
    line = verdict.line()
    assert line.startswith(FAILURE_MARK)
    assert "\n" not in line
    assert of_line(f"(TrainController pid=4) {line}") == verdict
    # Another thread's output glued after the verdict, before its newline.
    assert of_line(f"{line}\x1b[36m(TrainController pid=4, ip=10.77.0.2)\x1b[0m     raise e") == verdict
    assert of_line("epoch 3: loss 0.1") is None
    assert of_line(FAILURE_MARK + "{not json") is None
    assert json.loads(line[len(FAILURE_MARK) :])["hint"] == verdict.hint


def test_a_verdict_marked_with_a_token_is_read_only_with_that_token():
    verdict = Failure(FailureClass.USER_CODE, "ValueError: boom")
    line = verdict.line("0123456789abcdef")
    assert line.startswith("AHP_FAILURE:0123456789abcdef {")
    assert of_line(f"(TrainController pid=4) {line}", "0123456789abcdef") == verdict
    assert of_line(line, "fedcba9876543210") is None
    assert of_line(verdict.line(), "0123456789abcdef") is None  # a bare verdict, in a job that has a token


def test_the_answer_names_the_class_rank_exception_and_frames_then_what_to_do():
    verdict = failures.user_failure(raise_in_user_code(), rank=1)
    text = verdict.explain().splitlines()
    assert text[0] == "user code, rank 1: ZeroDivisionError: float division by zero"
    assert text[1] == "Traceback (the user's own frames):"
    assert any(f'File "{__file__}"' in line and "in train" in line for line in text)
    assert 'return config["lr"] / 0' in verdict.traceback
    assert text[-1].startswith("What to do: fix the function")


def test_a_shipped_files_frame_is_named_by_its_path_in_what_was_shipped():
    shipped = "/tmp/ray/session_x/runtime_resources/working_dir_files/_ray_pkg_95a1b7/"
    namespace: dict = {}
    exec(compile("def load():\n    raise ValueError('empty')\n", shipped + "scripts/train.py", "exec"), namespace)
    try:
        namespace["load"]()
    except ValueError as error:
        frames = failures.user_frames(error)
    assert '  File "scripts/train.py", line 2, in load' in frames.splitlines(), frames
    assert "_ray_pkg_" not in frames


def test_frames_of_libraries_python_and_the_provider_are_trimmed():
    assert failures._users("/home/me/dags/train.py")
    assert failures._users(
        "/tmp/ray/session_x/runtime_resources/py_modules_files/_ray_pkg_ab/airflow_provider_horovod/"
        "examples/retraining.py"
    )
    for library in (
        "/venv/lib/python3.11/site-packages/ray/train/_internal/utils.py",
        "/usr/lib/python3.11/json/decoder.py",
        "<string>",
        "/opt/x/airflow_provider_horovod/runtime/trainers.py",
    ):
        assert not failures._users(library), library


def test_an_error_out_of_a_task_function_is_the_users_and_a_missing_module_is_configuration():
    assert of_error(raise_in_user_code(), user_code=True).failure_class is FailureClass.USER_CODE
    try:
        import no_such_module_for_the_test  # noqa: F401
    except ImportError as err:
        assert of_error(err, user_code=True).failure_class is FailureClass.CONFIGURATION


def test_a_workers_error_marked_in_the_worker_keeps_its_rank_after_a_pickle():
    import pickle

    error = raise_in_user_code()
    failures.mark_user_error(error, rank=3)
    back = pickle.loads(pickle.dumps(error))  # as Ray carries it from the worker to the driver

    class WorkerGroupError(Exception):
        def __init__(self, worker_failures):
            super().__init__("Training failed due to worker errors")
            self.worker_failures = worker_failures

    verdict = of_error(WorkerGroupError({3: back}), user_code=False)
    assert (verdict.failure_class, verdict.rank, verdict.error_type) == (FailureClass.USER_CODE, 3, "ZeroDivisionError")
    assert "in train" in verdict.traceback


@pytest.mark.parametrize(
    "full",
    [
        OSError(28, "No space left on device"),
        OSError(122, "Disk quota exceeded"),
        # pyarrow's, from ray.train.report persisting a checkpoint: the errno only in its text.
        OSError("Error writing bytes to file. Detail: [errno 28] No space left on device"),
        # pyarrow's S3 refusing a checkpoint's upload (the chaos soak's storage_refusal found it classed user_code).
        OSError(
            "When creating key 'runs/' in bucket 'chaos': AWS Error SLOW_DOWN during PutObject operation: "
            "Please reduce your request rate."
        ),
    ],
)
def test_a_full_volume_or_a_refusing_s3_under_the_users_function_is_storage_on_its_rank_not_the_users_bug(full):
    failures.mark_user_error(full, rank=0)
    peer = RuntimeError("Horovod has been shut down. This was caused by an exception on one of the ranks")

    class WorkerGroupError(Exception):
        def __init__(self, worker_failures):
            super().__init__("Training failed due to worker errors")
            self.worker_failures = worker_failures

    verdict = of_error(WorkerGroupError({0: full, 1: peer}), user_code=False)
    assert verdict.failure_class is FailureClass.STORAGE
    assert verdict.failure_class.retryable
    assert verdict.rank == 0
    assert "has room" in verdict.hint


def test_an_error_raised_while_handling_a_full_volume_is_storage_too():
    try:
        try:
            raise OSError(28, "No space left on device")
        except OSError as full:
            raise RuntimeError("could not save the model") from full
    except RuntimeError as err:
        assert failures.user_failure(err).failure_class is FailureClass.STORAGE


def test_a_communication_error_in_the_users_function_is_no_bug_of_the_users():
    error = RuntimeError("Gloo all-reduce failed: Connection reset by peer")
    failures.mark_user_error(error, rank=0)
    assert not hasattr(error, "ahp_user_error")
    assert of_error(error, user_code=False).failure_class is FailureClass.INFRASTRUCTURE


# Ray 2.60's job info of jobs whose runtime said nothing (its driver never ran, or was killed).
JOB_INFOS = [
    (
        {
            "status": "FAILED",
            "error_type": "RUNTIME_ENV_SETUP_FAILURE",
            "driver_exit_code": None,
            "message": "Failed to set up runtime environment.\nCould not install packages due to an OSError: ... "
            "No matching distribution found for ahp-no-such-package-0000",
        },
        FailureClass.CONFIGURATION,
    ),
    (
        {
            "status": "FAILED",
            "error_type": "JOB_ENTRYPOINT_COMMAND_ERROR",
            "driver_exit_code": -9,
            "message": "Job entrypoint command failed with exit code -9, last available logs ...",
        },
        FailureClass.INFRASTRUCTURE,
    ),
    (
        {"status": "FAILED", "error_type": "JOB_ENTRYPOINT_COMMAND_ERROR", "driver_exit_code": 137, "message": "..."},
        FailureClass.INFRASTRUCTURE,
    ),
    (
        {
            "status": "FAILED",
            "error_type": "JOB_SUPERVISOR_ACTOR_DIED",
            "driver_exit_code": None,
            "message": "Job supervisor actor died: The actor died unexpectedly before finishing this task.",
        },
        FailureClass.INFRASTRUCTURE,
    ),
    (
        {
            "status": "FAILED",
            "error_type": "JOB_SUPERVISOR_ACTOR_START_TIMEOUT",
            "driver_exit_code": None,
            "message": "Job supervisor actor could not be scheduled: ...",
        },
        FailureClass.CAPACITY,
    ),
    (
        {
            "status": "STOPPED",
            "error_type": None,
            "driver_exit_code": None,
            "message": "Job was intentionally stopped.",
        },
        FailureClass.INFRASTRUCTURE,
    ),
]


@pytest.mark.parametrize("info, expected", JOB_INFOS, ids=[i["error_type"] or i["status"] for i, _ in JOB_INFOS])
def test_rays_job_info_decides_when_the_runtime_said_nothing(info, expected):
    failure = of_job(info, None)
    assert failure.failure_class is expected
    assert failure.summary
    assert failure.rank is None


def test_the_runtimes_verdict_wins_and_a_foreign_jobs_failing_entrypoint_is_its_own_code():
    verdict = Failure(FailureClass.STORAGE, "OSError: AWS Error NETWORK_CONNECTION")
    info = {"status": "FAILED", "error_type": "JOB_ENTRYPOINT_COMMAND_ERROR", "driver_exit_code": 1}
    assert of_job(info, verdict) is verdict
    assert of_job(info, None).failure_class is FailureClass.INFRASTRUCTURE  # ours, yet said nothing
    assert of_job(info, None, provider_job=False).failure_class is FailureClass.USER_CODE


def test_errors_of_the_provider_that_end_a_wait():
    assert failures.class_of_provider_error(exceptions.RayAuthenticationError("401")) is FailureClass.CONFIGURATION
    assert (
        failures.class_of_provider_error(exceptions.RayClusterUnreachableError("down")) is FailureClass.INFRASTRUCTURE
    )


class HorovodNetworkError(RuntimeError):
    """As the runtime's backend raises it (told apart by its name: this module imports no Ray)."""


class ControllerError(RuntimeError):
    def __init__(self, cause):
        super().__init__(f"Controller failed: {cause!r}")
        self.controller_failure = cause


def test_a_connection_check_that_failed_is_infrastructure_with_every_connection_named():
    text = (
        "Horovod's ranks cannot connect to each other:\n  host-b (10.77.0.2) -> host-a 10.77.0.1:40411: "
        "timed out after 8 s\nSet horovod_nics, or raise horovod_timeout_s."
    )
    failure = of_error(ControllerError(HorovodNetworkError(text)), user_code=False)
    assert failure.failure_class is FailureClass.INFRASTRUCTURE
    assert failure.failure_class.retryable
    assert "10.77.0.1:40411" in failure.explain()
    assert "horovod_nics" in failure.explain()


ABORT_TAIL = [
    "(RayTrainWorker pid=1, ip=10.77.0.2) [2026-11-24 11:29:29,275 E 1 2] logging.cc:118: Unhandled exception: "
    "N4gloo11IoExceptionE. what(): [/tmp/build/gloo/gloo/transport/tcp/pair.cc:799] connect [127.0.1.1]:4492: "
    "Connection refused /venv/ray/_raylet.so(+0x1812b9a) [0x7f10ef012b9a] ray::operator<<()",
    "(RayTrainWorker pid=1, ip=10.77.0.2) Fatal Python error: Aborted",
]


def test_a_worker_dead_of_a_gloo_abort_says_why_and_not_memory():
    died = Failure(FailureClass.INFRASTRUCTURE, "ActorDiedError: The actor died unexpectedly")
    told = failures.with_network_reason(died, ABORT_TAIL)
    assert "connect [127.0.1.1]:4492: Connection refused" in told.summary
    assert "horovod_nics" in told.summary
    assert "memory" not in told.explain()
    # Only an infrastructure failure, and only when the log has Gloo's reason.
    assert failures.with_network_reason(died, ["epoch 1"]) is died
    users = Failure(FailureClass.USER_CODE, "ZeroDivisionError: division by zero")
    assert failures.with_network_reason(users, ABORT_TAIL) is users


def test_a_job_ray_stopped_on_request_is_told_from_every_other_failure():
    # As a killed task's post-mortem keeps it: Ray's status and message, no verdict of the runtime's.
    stopped = failures.of_job({"status": "STOPPED", "message": "Job was intentionally stopped."}, None).to_dict()
    assert stopped["summary"] == "STOPPED: Job was intentionally stopped."
    assert failures.stopped_by_request(stopped)
    # Anything else that ended a job is not a stop request: Ray's own failure, a driver killed by a signal,
    # the runtime's verdict, the provider's stop of a job that waited too long.
    others = [
        failures.of_job({"status": "FAILED", "message": "the driver failed"}, None),
        failures.of_job({"status": "FAILED", "driver_exit_code": -9, "message": ""}, None),
        failures.of_job({"status": "STOPPED"}, failures.Failure(failures.FailureClass.USER_CODE, "ValueError: x")),
        failures.Failure(failures.FailureClass.CAPACITY, "the 2 workers found no room within 8 s"),
    ]
    assert [failures.stopped_by_request(f.to_dict()) for f in others] == [False] * 4


def test_a_script_missing_from_a_nodes_working_dir_is_configuration_on_any_rank():
    from airflow_provider_horovod.exceptions import ScriptMissingError

    error = ScriptMissingError("the script train.py is not in the job's working_dir on this node (/tmp/x)")
    failures.mark_user_error(error, rank=1)
    verdict = of_error(error, user_code=False)
    assert verdict.failure_class is FailureClass.CONFIGURATION
    assert verdict.rank == 1
