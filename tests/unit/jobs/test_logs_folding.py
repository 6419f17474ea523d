"""What of a job's log is the user's: Ray's own lines known with their level and folded in the task
log, its known noise lowered to info, the user's lines kept as the user's."""

from __future__ import annotations

import logging

import pytest

from airflow_provider_horovod.jobs.logs import ray_level, task_log

# Lines as Ray 2.60's jobs print them: the user's (some through a worker's prefix) and Ray's own.
USERS = [
    "epoch 3: loss 0.25",
    "(RayTrainWorker pid=4711) rank 1: batch 20 of 40",
    "(RayTrainWorker pid=4711, ip=10.77.0.2) Traceback (most recent call last):",
    "AHP_ERROR user_code: ...",
]
RAYS = [
    (
        "[2026-11-24 10:01:02,345 E 4711 4722] core_worker.cc:585: :info_message: Attempting to recover 1 lost objects",
        logging.ERROR,
    ),
    ("(TrainController pid=42) [2026-11-24 10:01:02,345 W 42 42] gcs_client.cc:12: GCS is slow", logging.WARNING),
    ("2026-11-24 10:01:03,000\tINFO worker_group.py:433 -- Started training worker group of size 2:", logging.INFO),
    (
        "/venv/lib/python3.11/site-packages/ray/data/_internal/execution/interfaces/execution_options.py:352: "
        "UserWarning: ExecutionOptions.exclude_resources is deprecated",
        logging.INFO,
    ),
    ("*** SIGABRT received at time=1795521210 on cpu 1 ***", logging.INFO),
    ("PC: @     0x7f3a1b2c3d4e  (unknown)  pthread_kill", logging.INFO),
    ("    @     0x7f3a1b2c3d4e        192  (unknown)", logging.INFO),
    ("Fatal Python error: Aborted", logging.INFO),
    ('AHP_FAILURE {"failure_class": "user_code"}', logging.DEBUG),
    # A worker's abort across hosts, as captured on two namespaced hosts.
    (
        "(RayTrainWorker pid=18927, ip=10.77.0.2) /venv/lib/python3.11/site-packages/ray/_raylet.so(+0x181364c) "
        "[0x7f3cbe81364c] ray::RayLog::operator<< <>()",
        logging.INFO,
    ),
    (
        "(RayTrainWorker pid=18927) /lib/x86_64-linux-gnu/libc.so.6(+0x1098ec) [0x7f3cbf5278ec]"
        "\x1b[32m [repeated 2x across cluster]\x1b[0m",
        logging.INFO,
    ),
    (
        "(RayTrainWorker pid=19660, ip=10.77.0.2) "
        "[2026-11-24 11:50:03.428569: E /build/horovod/common/operations.cc:697] "
        "[1]: Horovod background loop uncaught exception: [/build/gloo/transport/tcp/unbound_buffer.cc:133] Timed out",
        logging.ERROR,
    ),
    (
        "(RayTrainWorker pid=18927, ip=10.77.0.2) Extension modules: msgpack._cmsgpack, psutil._psutil_linux",
        logging.INFO,
    ),
    ("terminate called after throwing an instance of 'gloo::IoException'", logging.INFO),
    ("  what():  [/build/gloo/transport/tcp/pair.cc:799] connect [127.0.1.1]:4492: Connection refused", logging.INFO),
    ('  File "/venv/lib/python3.11/site-packages/horovod/common/basics.py", line 153 in init', logging.INFO),
]


@pytest.mark.parametrize("line", USERS)
def test_the_users_lines_are_the_users(line):
    assert ray_level(line) is None


@pytest.mark.parametrize("line, level", RAYS, ids=[line[:40] for line, _ in RAYS])
def test_rays_own_lines_are_known_with_their_level(line, level):
    assert ray_level(line) == level


def test_runs_of_rays_own_lines_are_folded_each_at_its_level():
    lines = ["epoch 1", RAYS[0][0], RAYS[1][0], "epoch 2", RAYS[3][0]]
    assert task_log(lines) == [
        (logging.INFO, "[ray] epoch 1"),
        (logging.INFO, "::group::Ray's own output"),
        (logging.ERROR, f"[ray] {RAYS[0][0]}"),
        (logging.WARNING, f"[ray] {RAYS[1][0]}"),
        (logging.INFO, "::endgroup::"),
        (logging.INFO, "[ray] epoch 2"),
        (logging.INFO, "::group::Ray's own output"),
        (logging.INFO, f"[ray] {RAYS[3][0]}"),
        (logging.INFO, "::endgroup::"),
    ]


def test_a_blank_line_is_folded_only_inside_a_native_dump():
    dump, blank = RAYS[4][0], "(RayTrainWorker pid=18927, ip=10.77.0.2) "
    assert task_log([blank, dump, blank, dump, "epoch 2"]) == [
        (logging.INFO, f"[ray] {blank}"),
        (logging.INFO, "::group::Ray's own output"),
        (logging.INFO, f"[ray] {dump}"),
        (logging.INFO, f"[ray] {blank}"),
        (logging.INFO, f"[ray] {dump}"),
        (logging.INFO, "::endgroup::"),
        (logging.INFO, "[ray] epoch 2"),
    ]


# Ray's own notices that ask nothing of the user, as Ray 2.60 printed them in the job log of a training
# on a Ray head here (colours and all): each is folded at INFO whatever level Ray gave it.
NOISE = [
    "2026-11-26 03:35:14,928\tWARNING tqdm_ray.py:319 -- tqdm is not installed. Progress bars will be disabled.",
    "\x1b[36m(TrainController pid=10646)\x1b[0m [2026-11-26 03:31:09,026 E 10646 10852] core_worker.cc:2465: Actor "
    "with class name: 'PreemptionWatcher' and ID: '63bd43ab0245864e96bf0ce603000000' has constructor arguments in "
    "the object store and max_restarts > 0. If the arguments in the object store go out of scope or are lost, the "
    "actor restart will fail. See https://github.com/ray-project/ray/issues/53727 for more details.",
    "\x1b[33m(raylet)\x1b[0m WARNING: 8 PYTHON worker processes have been started on node: "
    "254bbd4e55283eb927542724edfb34735013ca3ef118dc02d3a40198 with address: 127.0.0.1, which is 4x the maximum "
    "expected startup concurrency (2). This could be a result of using a large number of actors, tasks blocked in "
    "ray.get() calls, or tasks with fractional CPU requests (e.g., num_cpus=0.1) allowing high concurrency. See "
    "https://github.com/ray-project/ray/issues/3644 for some discussion of workarounds.",
]
# Lines of the same job log that stay what they are: the user's own (through a worker's colored prefix,
# deduplicated by Ray with its note), and Ray's lines that ask for action keep their level.
SAME_LOG_USERS = [
    "\x1b[36m(RayTrainWorker pid=17493)\x1b[0m epoch 4: loss 0.00099 (rank 0 of 2)\x1b[32m [repeated 8x across "
    "cluster] (Ray deduplicates logs by default. Set RAY_DEDUP_LOGS=0 to disable log deduplication, or see "
    "https://docs.ray.io/en/master/ray-observability/user-guides/configure-logging.html#log-deduplication for more "
    "options.)\x1b[0m",
    "Reading the datasets ['train'] before the workers start.",
]
KEEP_LEVEL = [
    (
        "\x1b[36m(TrainController pid=4711)\x1b[0m [2026-11-26 03:31:09,026 E 4711 4722] core_worker.cc:585: "
        ":info_message: Attempting to recover 1 lost objects",
        logging.ERROR,
    ),
    (
        "2026-11-26 03:34:07,830\tINFO worker.py:1691 -- Using address 127.0.0.1:48937 set in the environment "
        "variable RAY_ADDRESS",
        logging.INFO,
    ),
]


@pytest.mark.parametrize("line", NOISE, ids=["tqdm", "preemption-watcher", "raylet-startup-concurrency"])
def test_rays_known_noise_is_lowered_to_info(line):
    assert ray_level(line) == logging.INFO


@pytest.mark.parametrize("line", SAME_LOG_USERS)
def test_the_users_lines_through_rays_colours_stay_the_users(line):
    assert ray_level(line) is None


@pytest.mark.parametrize("line, level", KEEP_LEVEL)
def test_rays_other_lines_keep_their_level(line, level):
    assert ray_level(line) == level


def test_in_a_task_log_no_warning_or_error_comes_from_rays_noise():
    lines = [SAME_LOG_USERS[1], *NOISE, SAME_LOG_USERS[0]]
    out = task_log(lines)
    assert [level for level, _ in out] == [logging.INFO] * len(out)
    assert [text for _, text in out] == [
        f"[ray] {SAME_LOG_USERS[1]}",
        "::group::Ray's own output",
        *[f"[ray] {line}" for line in NOISE],
        "::endgroup::",
        f"[ray] {SAME_LOG_USERS[0]}",
    ]


def test_the_line_of_rays_code_that_warned_is_folded_with_its_warning():
    warning = (
        "\x1b[36m(DatasetManager pid=17986)\x1b[0m /venv/lib/python3.11/site-packages/ray/data/_internal/execution/"
        "interfaces/execution_options.py:436: RayDeprecationWarning: `ExecutionOptions.exclude_resources` is "
        "deprecated and will be removed after January 2027."
    )
    code = "\x1b[36m(DatasetManager pid=17986)\x1b[0m   self.exclude_resources = exclude_resources"
    users = "\x1b[36m(RayTrainWorker pid=17493)\x1b[0m   indented, the user's own"
    assert task_log([warning, code, users]) == [
        (logging.INFO, "::group::Ray's own output"),
        (logging.INFO, f"[ray] {warning}"),
        (logging.INFO, f"[ray] {code}"),
        (logging.INFO, "::endgroup::"),
        (logging.INFO, f"[ray] {users}"),
    ]


# Python's report of a Ray Data thread that Ray interrupted, as Ray 2.60's own _InterruptibleQueue
# raises it (printed by running that code in a thread here); in a job's log, through an actor's prefix.
INTERRUPTED_THREAD = [
    "Exception in thread map_tp_filling_worker-0:",
    "Traceback (most recent call last):",
    '  File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 1045, in _bootstrap_inner',
    "    self.run()",
    '  File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 982, in run',
    "    self._target(*self._args, **self._kwargs)",
    '  File "/work/main/.venv/lib/python3.11/site-packages/ray/data/_internal/util.py", line 1058, in get',
    "    raise InterruptedError()",
    "InterruptedError",
]


@pytest.mark.parametrize("prefix", ["", "\x1b[36m(SplitCoordinator pid=18645)\x1b[0m "])
def test_a_ray_thread_interrupted_by_ray_is_folded_at_info(prefix):
    lines = [f"{prefix}{line}" for line in INTERRUPTED_THREAD]
    assert task_log(["epoch 4: loss 0.1", *lines, "AHP_RESULT {}"]) == [
        (logging.INFO, "[ray] epoch 4: loss 0.1"),
        (logging.INFO, "::group::Ray's own output"),
        *[(logging.INFO, f"[ray] {line}") for line in lines],
        (logging.INFO, "::endgroup::"),
        (logging.INFO, "[ray] AHP_RESULT {}"),
    ]


def test_other_thread_tracebacks_stay_the_users():
    # Another exception, or an InterruptedError of the user's own code: not Ray's noise.
    other = [*INTERRUPTED_THREAD[:-1], "ValueError: bad batch"]
    users = [*INTERRUPTED_THREAD[:4], '  File "/job/train.py", line 3, in read', "    q.get()", "InterruptedError"]
    # Interleaved with another process's line: the traceback cannot be told whole.
    mixed = [*INTERRUPTED_THREAD[:3], "(RayTrainWorker pid=7) epoch 1", *INTERRUPTED_THREAD[3:]]
    for lines in (other, users, mixed):
        assert task_log(lines) == [(logging.INFO, f"[ray] {line}") for line in lines], lines


# Ray Train's autoscaling coordinator timing out on a busy node, as it came in a training's job log here
# (through the controller's coloured prefix): Ray's own words call it safe to ignore.
COORDINATOR_PREFIX = "\x1b[36m(TrainController pid=10145)\x1b[0m "
COORDINATOR_TIMEOUT = [
    "Failed to send resource request for train-5c45d7c0a5874ec3a027af6d17054cd1. If this only happens transiently "
    "during network partition or CPU being overloaded, it's safe to ignore this error. If this error persists, file "
    "a GitHub issue.",
    "Traceback (most recent call last):",
    '  File "/work/main/.venv/lib/python3.11/site-packages/ray/train/v2/_internal/execution/scaling_policy/'
    'autoscaling_coordinator_client.py", line 58, in send_resource_request',
    "    ray.get(",
    '  File "/work/main/.venv/lib/python3.11/site-packages/ray/_private/auto_init_hook.py", line 22, in '
    "auto_init_wrapper",
    "    return fn(*args, **kwargs)",
    "           ^^^^^^^^^^^^^^^^^^^",
    '  File "/work/main/.venv/lib/python3.11/site-packages/ray/_private/client_mode_hook.py", line 134, in wrapper',
    "    return func(*args, **kwargs)",
    "           ^^^^^^^^^^^^^^^^^^^^^",
    '  File "/work/main/.venv/lib/python3.11/site-packages/ray/_private/worker.py", line 3009, in get',
    "    values, debugger_breakpoint = worker.get_objects(",
    "                                  ^^^^^^^^^^^^^^^^^^^",
    '  File "/work/main/.venv/lib/python3.11/site-packages/ray/_private/worker.py", line 1007, in get_objects',
    "    ] = self.core_worker.get_objects(",
    "        ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    '  File "python/ray/_raylet.pyx", line 3471, in ray._raylet.CoreWorker.get_objects',
    '  File "python/ray/includes/common.pxi", line 107, in ray._raylet.check_status',
    "ray.exceptions.GetTimeoutError: Get timed out: some object(s) not ready.",
]


def test_the_autoscaling_coordinators_timeout_that_ray_calls_safe_to_ignore_is_folded():
    lines = [COORDINATOR_PREFIX + line for line in COORDINATOR_TIMEOUT]
    after = COORDINATOR_PREFIX + "Attempting to start training worker group of size 2"
    assert task_log([*lines, after]) == [
        (logging.INFO, "::group::Ray's own output"),
        *[(logging.INFO, f"[ray] {line}") for line in lines],
        (logging.INFO, "::endgroup::"),
        (logging.INFO, f"[ray] {after}"),
    ]
    # Its traceback alone, without Ray's note before it, is not known noise.
    assert task_log(lines[1:]) == [(logging.INFO, f"[ray] {line}") for line in lines[1:]]
