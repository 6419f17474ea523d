"""A training command line as a team's shell scripts write it (``horovodrun -np 4 python train.py
--epochs 90``) turned into what script mode runs: the script, its own arguments, and the operator
parameters that the launcher's flags map to.

Every flag of horovodrun 0.28.1 (``horovod/runner/launch.py``) is a row of FLAGS: mapped to a
parameter (the ``HOROVOD_*`` variables are those horovodrun itself sets, ``config_parser.
set_env_from_args``), accepted without effect, or refused, with why and what to use instead, before
anything is submitted. docs/migrating.md's table is FLAGS row for row (its unit test checks that).
Pure, standard library only.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import posixpath
import re
import shlex
from collections.abc import Callable, Sequence
from typing import Any

from airflow_provider_horovod.exceptions import InvalidParameterError

REFUSED = "refused"
NOTHING = "nothing"
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")
EXAMPLE = "horovodrun -np 4 python train.py --epochs 90"


@dataclasses.dataclass(frozen=True)
class ScriptCommand:
    script: str  # the script's path as written, or the module's dotted name when `module` is True
    module: bool  # run as `python -m pkg.mod`
    args: list[str]  # the script's own arguments (sys.argv[1:]), as written
    parameters: dict[str, Any]  # operator parameters the launcher's flags set


@dataclasses.dataclass(frozen=True)
class Flag:
    """A horovodrun flag: its names, what it maps to (an operator parameter, ``horovod_env``, NOTHING or
    REFUSED) and the line that the docs and a refusal say about it."""

    names: tuple[str, ...]
    parameter: str
    note: str
    env: str = ""  # the variable, when `parameter` is horovod_env
    value: Callable[[str], Any] | None = None  # reads the flag's value (ValueError: a bad one); None: a switch
    sets: str = "1"  # what a switch sets `env` to


class _Refusal(Exception):
    """Why the command is refused; parse_command raises it as an InvalidParameterError with the command."""


def _whole(text: str, least: int = 0) -> int:
    if not re.fullmatch(r"-?[0-9]+", text):
        raise ValueError(f"{text!r} is not a whole number.")
    if int(text) < least:
        raise ValueError(f"{text} is less than {least}.")
    return int(text)


def _number(text: str, most: float = math.inf) -> float:
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number.") from None
    if number < 0:
        raise ValueError(f"{text} is less than 0.")
    if number > most:
        raise ValueError(f"{text} is more than {most:g}.")
    return number


def _megabytes(text: str) -> str:
    return str(_whole(text) * 1024 * 1024)  # horovodrun sets bytes


def _level(text: str) -> str:
    if text.upper() not in LOG_LEVELS:
        raise ValueError(f"{text!r} is not one of {', '.join(LOG_LEVELS)}.")
    return text.upper()


def _names(text: str) -> list[str]:
    names = [n for n in text.split(",") if n]
    if not names:
        raise ValueError("give interface names, e.g. eth0,eth1.")
    return names


_count = functools.partial(_whole, least=1)
_fraction = functools.partial(_number, most=1.0)


def _env(names: tuple[str, ...], env: str, note: str, value=None, sets: str = "1") -> Flag:
    return Flag(names, "horovod_env", note, env=env, value=value, sets=sets)


PLACEMENT = (
    "Ray places the workers on the cluster's nodes: give num_workers, and resources_per_worker to shape placement."
)
MPI = "MPI only: Horovod runs over Gloo on Ray; leave it out."
ELASTIC = "Elastic runs restart through Ray Train: give num_workers=[min, max]; max_failures bounds restarts."
SSH = "Ray starts the workers, without ssh: give num_workers, and resources_per_worker to shape placement."
NOT_TRAINING = "Not a training: run it where Horovod is installed."

FLAGS: tuple[Flag, ...] = (
    Flag(("-np", "--num-proc"), "num_workers", "The number of workers (Horovod ranks).", value=_count),
    Flag(
        ("--min-np", "--min-num-proc"),
        "num_workers",
        "With --max-np: the elastic range num_workers=[min, max] (-np, horovodrun's starting size, is then ignored).",
        value=_count,
    ),
    Flag(("--max-np", "--max-num-proc"), "num_workers", "With --min-np: see --min-np.", value=_count),
    Flag(("--gloo-timeout-seconds",), "horovod_timeout_s", "Gloo's rendezvous and collective timeout.", value=_count),
    Flag(
        ("--network-interfaces", "--network-interface"),
        "horovod_nics",
        "Names separated by commas, or the flag repeated, in order of preference.",
        value=_names,
    ),
    Flag(
        ("--timeline-filename",),
        "horovod_timeline",
        "True: rank 0's timeline is stored next to the checkpoints (timeline_uri); the file name is not used.",
        value=str,
    ),
    _env(("--timeline-mark-cycles",), "HOROVOD_TIMELINE_MARK_CYCLES", "Cycles marked on the timeline."),
    _env(("--no-timeline-mark-cycles",), "HOROVOD_TIMELINE_MARK_CYCLES", "No cycle marks.", sets="0"),
    _env(("--fusion-threshold-mb",), "HOROVOD_FUSION_THRESHOLD", "In bytes (MB * 1024 * 1024).", _megabytes),
    _env(("--cycle-time-ms",), "HOROVOD_CYCLE_TIME", "Milliseconds between fusion cycles.", _number),
    _env(("--cache-capacity",), "HOROVOD_CACHE_CAPACITY", "Tensor names cached.", _whole),
    _env(("--hierarchical-allreduce",), "HOROVOD_HIERARCHICAL_ALLREDUCE", "Hierarchical allreduce."),
    _env(("--no-hierarchical-allreduce",), "HOROVOD_HIERARCHICAL_ALLREDUCE", "Off, autotune too.", sets="0"),
    _env(("--hierarchical-allgather",), "HOROVOD_HIERARCHICAL_ALLGATHER", "Hierarchical allgather."),
    _env(("--no-hierarchical-allgather",), "HOROVOD_HIERARCHICAL_ALLGATHER", "Off, autotune too.", sets="0"),
    _env(("--torus-allreduce",), "HOROVOD_TORUS_ALLREDUCE", "NCCL torus allreduce (GPUs)."),
    _env(("--no-torus-allreduce",), "HOROVOD_TORUS_ALLREDUCE", "Off, autotune too.", sets="0"),
    _env(("--autotune",), "HOROVOD_AUTOTUNE", "Autotuning of the knobs not set."),
    _env(("--no-autotune",), "HOROVOD_AUTOTUNE", "No autotuning.", sets="0"),
    # Horovod reads the autotune knobs only when autotuning is on: setting them without --autotune is harmless.
    _env(("--autotune-log-file",), "HOROVOD_AUTOTUNE_LOG", "A path on rank 0's node.", str),
    _env(("--autotune-warmup-samples",), "HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "Samples discarded first.", _whole),
    _env(("--autotune-steps-per-sample",), "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "Steps per sample.", _whole),
    _env(
        ("--autotune-bayes-opt-max-samples",), "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "Samples per search.", _whole
    ),
    _env(("--autotune-gaussian-process-noise",), "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "0 to 1.", _fraction),
    _env(("--no-stall-check",), "HOROVOD_STALL_CHECK_DISABLE", "No stall warnings."),
    _env(("--stall-check",), "HOROVOD_STALL_CHECK_DISABLE", "Stall check on (the default).", sets="0"),
    _env(("--stall-check-warning-time-seconds",), "HOROVOD_STALL_CHECK_TIME_SECONDS", "Until a warning.", _whole),
    _env(("--stall-check-shutdown-time-seconds",), "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "Until shutdown.", _whole),
    _env(("--num-nccl-streams",), "HOROVOD_NUM_NCCL_STREAMS", "NCCL streams (GPUs).", _whole),
    _env(("--thread-affinity",), "HOROVOD_THREAD_AFFINITY", "The background thread's core.", _whole),
    _env(("--log-level",), "HOROVOD_LOG_LEVEL", "One of " + ", ".join(LOG_LEVELS) + ".", _level),
    _env(("--log-without-timestamp", "--log-hide-timestamp"), "HOROVOD_LOG_HIDE_TIME", "No timestamps."),
    _env(("--log-with-timestamp", "--no-log-hide-timestamp"), "HOROVOD_LOG_HIDE_TIME", "Timestamps.", sets="0"),
    Flag(("--gloo",), NOTHING, "Gloo is what runs."),
    Flag(("--verbose",), NOTHING, "The task log has the provider's own messages."),
    Flag(("--disable-cache",), NOTHING, "It caches horovodrun's ssh and interface checks, which do not run on Ray."),
    Flag(("-prefix-timestamp", "--prefix-output-with-timestamp"), NOTHING, "The task log stamps every line."),
    Flag(("-H", "--hosts"), REFUSED, PLACEMENT),
    Flag(("-hostfile", "--hostfile"), REFUSED, PLACEMENT),
    Flag(("--host-discovery-script",), REFUSED, PLACEMENT),
    Flag(("--slots-per-host",), REFUSED, PLACEMENT),
    Flag(("-p", "--ssh-port"), REFUSED, SSH),
    Flag(("-i", "--ssh-identity-file"), REFUSED, SSH),
    Flag(("--mpi",), REFUSED, MPI),
    Flag(("--jsrun",), REFUSED, MPI),
    Flag(("--mpi-args",), REFUSED, MPI),
    Flag(("--binding-args",), REFUSED, MPI),
    Flag(("--mpi-threads-disable", "--no-mpi-threads-disable"), REFUSED, MPI),
    Flag(
        ("--tcp",),
        REFUSED,
        "Gloo talks TCP already; to keep NCCL off InfiniBand as --tcp does, "
        'give runtime_env={"env_vars": {"NCCL_IB_DISABLE": "1"}}.',
    ),
    Flag(("--elastic-timeout",), REFUSED, ELASTIC),
    Flag(("--reset-limit",), REFUSED, ELASTIC),
    Flag(("--blacklist-cooldown-range",), REFUSED, ELASTIC),
    Flag(("--start-timeout",), REFUSED, "Give pending_timeout_seconds: how long the job may wait for its workers."),
    Flag(("--output-filename",), REFUSED, "Each rank's lines are in the task log, marked by rank; leave it out."),
    Flag(("--config-file",), REFUSED, "The file is not read: give its values as flags or operator parameters."),
    Flag(("-cb", "--check-build"), REFUSED, NOT_TRAINING),
    Flag(("-v", "--version"), REFUSED, NOT_TRAINING),
)
BY_NAME = {name: flag for flag in FLAGS for name in flag.names}
ENV_FIX = 'put environment variables in runtime_env={"env_vars": {...}} (or horovod_env for HOROVOD_* ones).'
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
PYTHON_SWITCHES = re.compile(r"-[uBOEsSIq]+")  # -u, -B, -O, -OO, -uB ...


def parse_command(command: str | Sequence[str], parameter: str = "command") -> ScriptCommand:
    """The script, its arguments and the parameters of a ``horovodrun``/``mpirun``/``python`` command
    line (a string, split as a shell would, or an argv list). InvalidParameterError for anything the
    provider cannot honour, naming the flag, why, and what to give instead."""
    try:
        return _parse(_tokens(command))
    except _Refusal as refusal:
        raise InvalidParameterError(parameter, command, str(refusal)) from None


def _tokens(command: Any) -> list[str]:
    if isinstance(command, str):
        try:
            tokens = shlex.split(command)
        except ValueError as err:  # an unclosed quote
            raise _Refusal(f"{err}; quote as a shell would.") from None
    elif isinstance(command, Sequence):
        tokens = list(command)
        for position, item in enumerate(tokens):
            if not isinstance(item, str):
                raise _Refusal(f"item {position} ({item!r}) is not a string: give every argument as a string.")
    else:
        raise _Refusal(f"give a command line as a string or a list of strings, e.g. {EXAMPLE!r}.")
    if not tokens:
        raise _Refusal(f"the command is empty: give one, e.g. {EXAMPLE!r}.")
    return tokens


def _parse(tokens: list[str]) -> ScriptCommand:
    _refuse_env(tokens[0])
    launcher = posixpath.basename(tokens[0])
    parameters: dict[str, Any] = {}
    rest = tokens
    if launcher == "horovodrun":
        rest = _horovodrun(tokens[1:], parameters)
    elif launcher in ("mpirun", "mpiexec"):
        rest = _mpirun(launcher, tokens[1:], parameters)
    return _program(rest, parameters)


def _refuse_env(token: str) -> None:
    if token == "env" or ASSIGNMENT.match(token):
        raise _Refusal(f"{token} sets an environment variable: {ENV_FIX}")


def _horovodrun(tokens: list[str], parameters: dict[str, Any]) -> list[str]:
    """Reads the flags up to the program; returns the program and its arguments."""
    given: dict[str, int] = {}  # -np, --min-np, --max-np
    nics: list[str] = []
    env: dict[str, str] = {}
    i = 0
    while i < len(tokens) and tokens[i].startswith("-"):
        written, equals, value = tokens[i].partition("=")
        flag = BY_NAME.get(written)
        if flag is None:
            raise _Refusal(f"horovodrun's {written} is not a flag the provider knows; leave it out.")
        if flag.parameter == REFUSED:
            raise _Refusal(f"horovodrun's {written} is refused: {flag.note}")
        if flag.value is None:
            if equals:
                raise _Refusal(f"horovodrun's {written} takes no value.")
            value = flag.sets
        elif not equals:
            i += 1
            # A value that looks like a flag is a missing value (argparse says the same), a negative number not.
            if i == len(tokens) or (tokens[i].startswith("-") and not re.match(r"-\d", tokens[i])):
                raise _Refusal(f"horovodrun's {written} needs a value.")
            value = tokens[i]
        try:
            read: Any = flag.value(value) if flag.value else value
        except ValueError as err:
            raise _Refusal(f"horovodrun's {written}: {err}") from None
        if flag.parameter == "num_workers":
            given[flag.names[0]] = read
        elif flag.parameter == "horovod_nics":
            nics += [n for n in read if n not in nics]  # repeated flags add names, as horovodrun does
        elif flag.parameter == "horovod_env":
            env[flag.env] = str(read)
        elif flag.parameter == "horovod_timeline":
            parameters["horovod_timeline"] = True
        elif flag.parameter != NOTHING:
            parameters[flag.parameter] = read
        i += 1
    if "--min-np" in given or "--max-np" in given:
        if not ("--min-np" in given and "--max-np" in given):
            raise _Refusal("horovodrun's --min-np and --max-np: give both, the elastic range num_workers=[min, max].")
        if given["--min-np"] > given["--max-np"]:
            raise _Refusal("horovodrun's --min-np is more than --max-np.")
        # -np is horovodrun's starting size inside the range; Ray Train starts with what fits.
        parameters["num_workers"] = [given["--min-np"], given["--max-np"]]
    elif "-np" in given:
        parameters["num_workers"] = given["-np"]
    if nics:
        parameters["horovod_nics"] = nics
    if env:
        parameters["horovod_env"] = env
    return tokens[i:]


def _mpirun(launcher: str, tokens: list[str], parameters: dict[str, Any]) -> list[str]:
    i = 0
    while i < len(tokens) and tokens[i].startswith("-"):
        written = tokens[i]
        if written not in ("-np", "-n"):
            raise _Refusal(
                f"{launcher}'s {written} is refused: Ray places the workers and runs Horovod over Gloo (no MPI); "
                "only -np/-n maps (num_workers)."
            )
        if i + 1 == len(tokens):
            raise _Refusal(f"{launcher}'s {written} needs a value.")
        try:
            parameters["num_workers"] = _count(tokens[i + 1])
        except ValueError as err:
            raise _Refusal(f"{launcher}'s {written}: {err}") from None
        i += 2
    return tokens[i:]


def _program(tokens: list[str], parameters: dict[str, Any]) -> ScriptCommand:
    """``python [options] script.py ARGS``, ``python -m pkg.mod ARGS`` or ``script.py ARGS``."""
    if not tokens:
        raise _Refusal(f"no script after the launcher's flags: give one, e.g. {EXAMPLE!r}.")
    _refuse_env(tokens[0])
    if tokens[0].endswith(".py"):
        return ScriptCommand(tokens[0], False, tokens[1:], parameters)
    if not PYTHON.fullmatch(posixpath.basename(tokens[0])):
        raise _Refusal(
            f"{tokens[0]!r} is not python nor a .py script: give 'python train.py ...', 'python -m pkg.mod ...' "
            "or 'train.py ...', after horovodrun's or mpirun's flags."
        )
    i = 1
    # The interpreter's own options are dropped: every worker runs the script in the job's interpreter.
    while i < len(tokens) and tokens[i].startswith("-"):
        option = tokens[i]
        if PYTHON_SWITCHES.fullmatch(option):
            i += 1
        elif option[:2] in ("-X", "-W"):
            i += 1 if len(option) > 2 else 2
        elif option[:2] == "-m":
            name = option[2:] or (tokens[i + 1] if i + 1 < len(tokens) else "")
            i += 1 if option[2:] else 2
            if not name or not all(part.isidentifier() for part in name.split(".")):
                raise _Refusal(f"python -m {name!r}: give a module's dotted name, e.g. -m my_project.train.")
            return ScriptCommand(name, True, tokens[i:], parameters)
        elif option[:2] == "-c":
            raise _Refusal("python -c runs code given inline: give a script file, e.g. python train.py.")
        else:
            raise _Refusal(f"python's option {option} is not one the provider knows: give a script, e.g. train.py.")
    if i >= len(tokens):
        raise _Refusal(f"no script after python: give one, e.g. {EXAMPLE!r}.")
    return ScriptCommand(tokens[i], False, tokens[i + 1 :], parameters)
