"""horovodrun.parse_command: the shapes of command line it accepts, what each horovodrun flag maps to or
why it is refused (an InvalidParameterError naming the flag), the script's own arguments kept as written,
and docs/migrating.md's flag table written from FLAGS."""

from pathlib import Path

import pytest

from airflow_provider_horovod.exceptions import InvalidParameterError
from airflow_provider_horovod.horovodrun import FLAGS, NOTHING, REFUSED, Flag, ScriptCommand, parse_command

DOCS = Path(__file__).resolve().parents[2] / "docs" / "migrating.md"


def refused(command, fix: str) -> InvalidParameterError:
    with pytest.raises(InvalidParameterError) as err:
        parse_command(command)
    assert err.value.parameter == "command"
    assert err.value.value == command
    assert fix in err.value.fix, err.value.fix
    return err.value


def given(flags: str) -> dict:
    """The parameters that horovodrun's ``flags`` set."""
    return parse_command(f"horovodrun {flags} python train.py").parameters


# --- the shapes of a command line -----------------------------------------------------------------


@pytest.mark.parametrize(
    "command, parsed",
    [
        (
            "horovodrun -np 4 python train.py --epochs 90",
            ScriptCommand("train.py", False, ["--epochs", "90"], {"num_workers": 4}),
        ),
        (
            "horovodrun -np 2 python3 -u -B -O -X faulthandler -W ignore src/train.py",
            ScriptCommand("src/train.py", False, [], {"num_workers": 2}),
        ),
        (
            "horovodrun -np 2 python3.11 -m my_project.train --lr 0.1",
            ScriptCommand("my_project.train", True, ["--lr", "0.1"], {"num_workers": 2}),
        ),
        ("horovodrun -np 2 train.py", ScriptCommand("train.py", False, [], {"num_workers": 2})),
        ("/opt/venv/bin/horovodrun -np 2 python train.py", ScriptCommand("train.py", False, [], {"num_workers": 2})),
        ("python train.py --epochs 90", ScriptCommand("train.py", False, ["--epochs", "90"], {})),
        ("/opt/venv/bin/python -OO -Xdev train.py", ScriptCommand("train.py", False, [], {})),
        ("python -m pkg.mod a b", ScriptCommand("pkg.mod", True, ["a", "b"], {})),
        ("python -mpkg.mod", ScriptCommand("pkg.mod", True, [], {})),
        ("train.py --epochs 90", ScriptCommand("train.py", False, ["--epochs", "90"], {})),
        ("mpirun -np 4 python train.py", ScriptCommand("train.py", False, [], {"num_workers": 4})),
        ("mpiexec -n 2 python -m pkg.train", ScriptCommand("pkg.train", True, [], {"num_workers": 2})),
        ('python train.py --name "a b"', ScriptCommand("train.py", False, ["--name", "a b"], {})),
    ],
)
def test_accepted_shapes(command, parsed):
    assert parse_command(command) == parsed


def test_an_argv_list_is_taken_as_it_is():
    parsed = parse_command(["horovodrun", "-np", "2", "python", "train.py", "--name", "a b"])
    assert parsed == ScriptCommand("train.py", False, ["--name", "a b"], {"num_workers": 2})


def test_the_scripts_arguments_are_kept_verbatim_launcher_flags_among_them():
    parsed = parse_command("horovodrun -np 2 python train.py --epochs 90 -np 8 --hosts a:2 X=1 -c 'x y'")
    assert parsed.args == ["--epochs", "90", "-np", "8", "--hosts", "a:2", "X=1", "-c", "x y"]
    assert parsed.parameters == {"num_workers": 2}


def test_the_error_names_the_parameter_it_is_given():
    with pytest.raises(InvalidParameterError) as err:
        parse_command("", parameter="train_script")
    assert err.value.parameter == "train_script"


@pytest.mark.parametrize("command", ["", "   ", []])
def test_an_empty_command(command):
    refused(command, "the command is empty")


def test_a_command_neither_text_nor_a_list():
    refused(42, "a string or a list of strings")


def test_a_list_item_that_is_not_a_string_is_named_by_its_position():
    refused(["python", "train.py", "--epochs", 90], "item 3 (90) is not a string")


def test_an_unclosed_quote():
    refused("python train.py --name 'a b", "quote as a shell would")


@pytest.mark.parametrize(
    "command",
    ["env FOO=1 python train.py", "FOO=1 horovodrun -np 2 python train.py", "horovodrun -np 2 FOO=1 python train.py"],
)
def test_environment_assignments_are_refused_for_runtime_env(command):
    error = refused(command, "sets an environment variable")
    assert 'runtime_env={"env_vars"' in error.fix
    assert "horovod_env for HOROVOD_*" in error.fix


def test_python_c_is_refused_for_a_script():
    refused("horovodrun -np 2 python -c 'import train'", "give a script file")


@pytest.mark.parametrize(
    "command, fix",
    [
        ("python", "no script after python"),
        ("python -u", "no script after python"),
        ("horovodrun -np 2", "no script after the launcher's flags"),
        ("python -", "python's option - is not one the provider knows"),
        ("python --version", "python's option --version"),
        ("python -m", "give a module's dotted name"),
        ("python -m pkg/train.py", "give a module's dotted name"),
        ("torchrun --nproc-per-node 2 train.py", "'torchrun' is not python nor a .py script"),
        ("bash run.sh", "'bash' is not python nor a .py script"),
    ],
)
def test_commands_without_a_script(command, fix):
    refused(command, fix)


# --- horovodrun's flags ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, parameters",
    [
        ("-np 4", {"num_workers": 4}),
        ("--num-proc 4", {"num_workers": 4}),
        ("--num-proc=4", {"num_workers": 4}),
        ("--min-np 2 --max-np 4", {"num_workers": [2, 4]}),
        ("-np 3 --min-num-proc=2 --max-num-proc 4", {"num_workers": [2, 4]}),
        ("--gloo-timeout-seconds 120", {"horovod_timeout_s": 120}),
        ("--network-interfaces eth0,eth1", {"horovod_nics": ["eth0", "eth1"]}),
        ("--network-interface eth0 --network-interface=eth1,eth0", {"horovod_nics": ["eth0", "eth1"]}),
        ("--timeline-filename /tmp/timeline.json", {"horovod_timeline": True}),
        ("--timeline-mark-cycles", {"horovod_env": {"HOROVOD_TIMELINE_MARK_CYCLES": "1"}}),
        ("--fusion-threshold-mb 32", {"horovod_env": {"HOROVOD_FUSION_THRESHOLD": str(32 * 1024 * 1024)}}),
        ("--fusion-threshold-mb=0", {"horovod_env": {"HOROVOD_FUSION_THRESHOLD": "0"}}),
        ("--cycle-time-ms 2.5", {"horovod_env": {"HOROVOD_CYCLE_TIME": "2.5"}}),
        ("--cache-capacity 0", {"horovod_env": {"HOROVOD_CACHE_CAPACITY": "0"}}),
        ("--hierarchical-allreduce", {"horovod_env": {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}}),
        ("--no-hierarchical-allreduce", {"horovod_env": {"HOROVOD_HIERARCHICAL_ALLREDUCE": "0"}}),
        ("--hierarchical-allgather", {"horovod_env": {"HOROVOD_HIERARCHICAL_ALLGATHER": "1"}}),
        ("--torus-allreduce", {"horovod_env": {"HOROVOD_TORUS_ALLREDUCE": "1"}}),
        (
            "--autotune --autotune-log-file /tmp/at.csv --autotune-warmup-samples 3 --autotune-steps-per-sample 10 "
            "--autotune-bayes-opt-max-samples 20 --autotune-gaussian-process-noise 0.8",
            {
                "horovod_env": {
                    "HOROVOD_AUTOTUNE": "1",
                    "HOROVOD_AUTOTUNE_LOG": "/tmp/at.csv",
                    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "3",
                    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "10",
                    "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "20",
                    "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.8",
                }
            },
        ),
        (
            "--no-stall-check --stall-check-warning-time-seconds 60 --stall-check-shutdown-time-seconds 600",
            {
                "horovod_env": {
                    "HOROVOD_STALL_CHECK_DISABLE": "1",
                    "HOROVOD_STALL_CHECK_TIME_SECONDS": "60",
                    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "600",
                }
            },
        ),
        ("--log-level debug", {"horovod_env": {"HOROVOD_LOG_LEVEL": "DEBUG"}}),
        ("--log-without-timestamp", {"horovod_env": {"HOROVOD_LOG_HIDE_TIME": "1"}}),
        (
            "--thread-affinity 2 --num-nccl-streams 2",
            {"horovod_env": {"HOROVOD_THREAD_AFFINITY": "2", "HOROVOD_NUM_NCCL_STREAMS": "2"}},
        ),
        ("--gloo --verbose --disable-cache --prefix-output-with-timestamp", {}),
    ],
)
def test_mapped_flags(flags, parameters):
    assert given(flags) == parameters


ACCEPTED = [(name, flag) for flag in FLAGS if flag.parameter not in (REFUSED, NOTHING) for name in flag.names]
SAMPLE = {"--log-level": "INFO"}


@pytest.mark.parametrize("name, flag", ACCEPTED, ids=[name for name, _ in ACCEPTED])
def test_every_mapped_flag_sets_its_parameter(name, flag):
    value = [SAMPLE.get(name, "1")] if flag.value else []
    # Each end of the elastic range needs the other.
    elastic = {"--min-np": ["--max-np", "4"], "--max-np": ["--min-np", "1"]}.get(flag.names[0], [])
    parsed = parse_command(["horovodrun", *elastic, name, *value, "python", "train.py"])
    found = parsed.parameters.get("horovod_env", {}) if flag.env else parsed.parameters
    assert (flag.env or flag.parameter) in found


@pytest.mark.parametrize("name", [name for flag in FLAGS if flag.parameter == NOTHING for name in flag.names])
def test_flags_without_effect_set_nothing(name):
    assert given(name) == {}


@pytest.mark.parametrize("name", [name for flag in FLAGS if flag.parameter == REFUSED for name in flag.names])
def test_every_refused_flag_is_named_with_its_reason(name):
    note = next(flag.note for flag in FLAGS if name in flag.names)
    error = refused(f"horovodrun {name} x python train.py", f"horovodrun's {name} is refused: ")
    assert note in error.fix


@pytest.mark.parametrize(
    "flags, fix",
    [
        ("-H a:2,b:2", "resources_per_worker"),
        ("--hostfile=hosts.txt", "Ray places the workers"),
        ("-p 2222", "without ssh"),
        ("--mpi", "Horovod runs over Gloo on Ray"),
        ("--mpi-args='--map-by ppr:6:node'", "Horovod runs over Gloo on Ray"),
        ("--tcp", "NCCL_IB_DISABLE"),
        ("--elastic-timeout 600", "max_failures bounds restarts"),
        ("--blacklist-cooldown-range 60 300", "max_failures bounds restarts"),
        ("--start-timeout 60", "pending_timeout_seconds"),
        ("--output-filename logs", "marked by rank"),
        ("--config-file hvd.yaml", "give its values as flags or operator parameters"),
        ("--check-build", "Not a training"),
        ("--version", "Not a training"),
    ],
)
def test_refusals_say_what_to_use_instead(flags, fix):
    refused(f"horovodrun -np 2 {flags} python train.py", fix)


@pytest.mark.parametrize("flag", ["--bogus", "--fusion-threshold", "-x", "--"])
def test_unknown_flags_are_refused_by_name(flag):
    refused(f"horovodrun -np 2 {flag} python train.py", f"horovodrun's {flag} is not a flag the provider knows")


@pytest.mark.parametrize(
    "flags, fix",
    [
        ("--min-np 2", "give both"),
        ("-np 2 --max-np 4", "give both"),
        ("--min-np 4 --max-np 2", "--min-np is more than --max-np"),
    ],
)
def test_the_elastic_range_needs_both_ends_in_order(flags, fix):
    refused(f"horovodrun {flags} python train.py", fix)


@pytest.mark.parametrize(
    "flags, fix",
    [
        ("-np 0", "horovodrun's -np: 0 is less than 1"),
        ("-np two", "horovodrun's -np: 'two' is not a whole number"),
        ("-np 2.0", "horovodrun's -np: '2.0' is not a whole number"),
        ("--num-proc --verbose", "horovodrun's --num-proc needs a value"),
        ("--gloo-timeout-seconds 0", "horovodrun's --gloo-timeout-seconds: 0 is less than 1"),
        ("--fusion-threshold-mb=-1", "horovodrun's --fusion-threshold-mb: -1 is less than 0"),
        ("--cycle-time-ms fast", "horovodrun's --cycle-time-ms: 'fast' is not a number"),
        ("--cycle-time-ms=-1", "horovodrun's --cycle-time-ms: -1 is less than 0"),
        ("--autotune-gaussian-process-noise 2", "--autotune-gaussian-process-noise: 2 is more than 1"),
        ("--log-level loud", "horovodrun's --log-level: 'loud' is not one of TRACE"),
        ("--network-interfaces ,", "horovodrun's --network-interfaces: give interface names"),
        ("--verbose=1", "horovodrun's --verbose takes no value"),
    ],
)
def test_bad_flag_values_name_the_flag(flags, fix):
    refused(f"horovodrun {flags} python train.py", fix)


def test_a_flag_missing_its_value_at_the_end():
    refused("horovodrun --timeline-filename", "horovodrun's --timeline-filename needs a value")


# --- mpirun ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("flags", ["-H a,b", "-x FOO", "--bind-to core", "--hostfile hosts"])
def test_mpirun_flags_but_np_are_refused_by_name(flags):
    error = refused(f"mpirun -np 2 {flags} python train.py", f"mpirun's {flags.split()[0]} is refused")
    assert "Horovod over Gloo (no MPI)" in error.fix


@pytest.mark.parametrize(
    "command, fix",
    [("mpirun -np 0 python train.py", "mpirun's -np: 0 is less than 1"), ("mpiexec -n", "mpiexec's -n needs a value")],
)
def test_mpirun_bad_counts(command, fix):
    refused(command, fix)


# --- the docs -------------------------------------------------------------------------------------


def maps_to(flag: Flag) -> str:
    if flag.parameter == "horovod_env":
        return f'`horovod_env["{flag.env}"]`' if flag.value else f'`horovod_env["{flag.env}"] = "{flag.sets}"`'
    if flag.parameter == "horovod_timeline":
        return "`horovod_timeline=True`"
    return flag.parameter if flag.parameter in (NOTHING, REFUSED) else f"`{flag.parameter}`"


def row(flag: Flag) -> str:
    return f"| {', '.join(f'`{name}`' for name in flag.names)} | {maps_to(flag)} | {flag.note} |"


@pytest.mark.parametrize("flag", FLAGS, ids=[flag.names[0] for flag in FLAGS])
def test_the_migration_guide_has_every_flag_as_the_code_maps_it(flag):
    assert row(flag) in DOCS.read_text().splitlines()


def test_no_flag_has_two_rows():
    names = [name for flag in FLAGS for name in flag.names]
    assert len(names) == len(set(names))
