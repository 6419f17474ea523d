"""The job's one-line error: the chain of causes, and a hint when a training worker died."""

from airflow_provider_horovod.runtime.job import WORKER_DIED_HINT, describe


class ActorDiedError(RuntimeError):
    pass


class WorkerGroupError(RuntimeError):
    def __init__(self, message, worker_failures):
        super().__init__(message)
        self.worker_failures = worker_failures


def test_a_dead_worker_behind_a_train_v2_worker_group_error_gets_the_hint():
    err = WorkerGroupError("Training failed due to worker errors:\nrank 1 ...", {1: ActorDiedError("gone")})
    line = describe(err)
    assert line.startswith("WorkerGroupError: Training failed due to worker errors: <- ActorDiedError: gone")
    assert line.endswith(WORKER_DIED_HINT)


def test_an_error_in_the_training_function_gets_no_hint():
    try:
        try:
            raise ValueError("bad shape")
        except ValueError as inner:
            raise RuntimeError("fit failed") from inner
    except RuntimeError as err:
        assert describe(err) == "RuntimeError: fit failed <- ValueError: bad shape"


def test_a_dead_worker_behind_a_train_v1_task_error_gets_the_hint():
    """Train V1 (legacy) raises TrainingFailedError from Ray's own RayTaskError(ActorDiedError)."""
    from ray.exceptions import ActorDiedError as RayActorDied
    from ray.exceptions import RayTaskError

    cause = RayTaskError("_Inner.train", "traceback", RayActorDied()).as_instanceof_cause()
    try:
        try:
            raise cause
        except RayTaskError as inner:
            raise RuntimeError("The Ray Train run failed.") from inner
    except RuntimeError as err:
        line = describe(err)
    assert "<- RayTaskError(ActorDiedError)" in line
    assert line.endswith(WORKER_DIED_HINT)
