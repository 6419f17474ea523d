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


def test_an_actor_that_failed_in_its_constructor_gets_no_hint_and_shows_its_error():
    """Train V2's controller raises in its constructor when the storage cannot be reached: that is
    no dead worker, and raising max_failures would not help."""
    from ray.exceptions import ActorDiedError as RayActorDied
    from ray.exceptions import RayTaskError

    traceback = ('Traceback (most recent call last):\n  File "controller.py", line 1, in __init__\n'
                 "OSError: When creating bucket 'b': AWS Error NETWORK_CONNECTION: Could not connect to server")
    init_error = RayTaskError("TrainController.__init__", traceback, OSError("Could not connect to server"))
    died = RayActorDied(cause=init_error)
    assert died.actor_init_failed
    try:
        try:
            raise died
        except RayActorDied as inner:
            raise RuntimeError("The Ray Train run failed.") from inner
    except RuntimeError as err:
        line = describe(err)
    assert WORKER_DIED_HINT not in line
    assert "ActorDiedError: The actor died because of an error raised in its creation task" in line
    assert line.endswith("AWS Error NETWORK_CONNECTION: Could not connect to server")
