import json
import subprocess
import sys
from importlib import resources

import jsonschema

from airflow_provider_horovod import __version__, get_provider_info


def test_provider_info_is_valid_against_airflows_schema():
    schema = json.loads(resources.files("airflow").joinpath("provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)


def test_provider_info_names_classes_that_exist():
    import importlib

    info = get_provider_info()
    paths = (
        [c["hook-class-name"] for c in info["connection-types"]]
        + info["extra-links"]
        + [d["class-name"] for d in info["task-decorators"]]
    )
    for path in paths:
        module, _, name = path.rpartition(".")
        assert hasattr(importlib.import_module(module), name), path
    for group in ("operators", "sensors", "hooks", "triggers"):
        for entry in info[group]:
            for module in entry["python-modules"]:
                importlib.import_module(module)


def test_connection_form_has_labels_and_placeholders():
    (ray,) = get_provider_info()["connection-types"]
    assert ray["connection-type"] == "ray"
    assert ray["hook-name"] == "Ray"
    fields = ray["conn-fields"]
    assert list(fields) == ["verify", "ca_bundle", "shared_storage", "runtime_env", "headers", "prices"]
    assert all(field["label"] for field in fields.values())
    # Booleans are switches in Airflow's form (a JSON boolean, not the text "true", which Airflow's
    # secrets masker takes for a secret too short to mask, and warns about at every task).
    assert fields["verify"]["schema"]["type"] == ["boolean", "null"]
    assert fields["verify"]["schema"]["default"] is True
    assert fields["shared_storage"]["schema"]["type"] == ["boolean", "null"]
    behaviour = ray["ui-field-behaviour"]
    assert behaviour["relabeling"] == {"host": "Ray dashboard address", "password": "Ray auth token"}
    # The address in one field, as a URL is read, then the token.
    assert {"port", "schema", "login", "extra"} <= set(behaviour["hidden-fields"])
    assert behaviour["placeholders"]["host"].startswith("https://")


def test_the_connection_form_fields_are_the_extras_the_hook_reads():
    from airflow_provider_horovod.hooks.ray_connection import EXTRAS

    (ray,) = get_provider_info()["connection-types"]
    assert set(ray["conn-fields"]) == set(EXTRAS)


def test_task_decorators():
    assert {d["name"] for d in get_provider_info()["task-decorators"]} == {"horovod", "horovod_script", "ray"}


def test_importing_the_airflow_side_does_not_import_the_training_stack():
    code = (
        "import sys\n"
        "import airflow_provider_horovod.operators.horovod, airflow_provider_horovod.sensors.ray\n"
        "import airflow_provider_horovod.triggers.ray, airflow_provider_horovod.hooks.ray\n"
        "import airflow_provider_horovod.links.ray, airflow_provider_horovod.operators.ray\n"
        "import airflow_provider_horovod.decorators.horovod, airflow_provider_horovod.decorators.ray\n"
        "heavy = [m for m in ('torch', 'horovod', 'ray.train', 'ray.data') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_airflow_registers_the_provider_from_its_entry_point():
    """What `airflow providers list`/`hooks` show and `@task.horovod` needs, asked of Airflow's
    ProvidersManager in a fresh interpreter (the installed entry point, no state of this process)."""
    code = (
        "import json\n"
        "from airflow.providers_manager import ProvidersManager\n"
        "pm = ProvidersManager()\n"
        "ours = pm.providers['airflow-provider-horovod']\n"
        "hook = pm.hooks['ray']\n"
        "print(json.dumps({'version': ours.version, 'hook': hook.hook_class_name if hook else None,\n"
        "                  'conn_type': hook.connection_type if hook else None,\n"
        "                  'decorators': {k: pm.taskflow_decorators[k].__module__ for k in ('horovod', 'ray')}}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found == {
        "version": __version__,
        "hook": "airflow_provider_horovod.hooks.ray.RayHook",
        "conn_type": "ray",
        "decorators": {
            "horovod": "airflow_provider_horovod.decorators.horovod",
            "ray": "airflow_provider_horovod.decorators.ray",
        },
    }
