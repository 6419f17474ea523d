import json
import subprocess
import sys
from importlib import resources
from pathlib import Path

import jsonschema

from airflow_provider_horovod import __version__, get_provider_info


def test_provider_info_is_valid_against_airflows_schema():
    schema = json.loads(resources.files("airflow").joinpath("provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)


def test_provider_info_names_classes_that_exist():
    import importlib

    info = get_provider_info()
    paths = [c["hook-class-name"] for c in info["connection-types"]] + info["extra-links"]
    for path in paths:
        module, _, name = path.rpartition(".")
        assert hasattr(importlib.import_module(module), name), path
    for group in ("operators", "sensors", "hooks", "triggers"):
        for entry in info[group]:
            for module in entry["python-modules"]:
                importlib.import_module(module)


def test_connection_form_has_labels_and_placeholders():
    (ray,) = get_provider_info()["connection-types"]
    assert ray["connection-type"] == "ray" and ray["hook-name"] == "Ray"
    assert set(ray["conn-fields"]) == {"verify", "headers", "runtime_env"}
    assert all(field["label"] for field in ray["conn-fields"].values())
    behaviour = ray["ui-field-behaviour"]
    assert behaviour["relabeling"]["password"] == "Ray auth token"
    assert behaviour["placeholders"]["port"] == "8265"


def test_importing_the_airflow_side_does_not_import_the_training_stack():
    code = (
        "import sys\n"
        "import airflow_provider_horovod.operators.horovod, airflow_provider_horovod.sensors.ray\n"
        "import airflow_provider_horovod.triggers.ray, airflow_provider_horovod.hooks.ray\n"
        "import airflow_provider_horovod.links.ray\n"
        "heavy = [m for m in ('torch', 'horovod', 'ray.train', 'ray.data') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_airflow_lists_the_provider_and_its_connection_type():
    """What `airflow providers list` and `airflow providers hooks` show, from the installed entry point."""
    airflow = str(Path(sys.executable).with_name("airflow"))

    def listed(*args: str) -> list[dict]:
        out = subprocess.run([airflow, "providers", *args, "-o", "json"], capture_output=True, text=True,
                             timeout=120, check=True)
        return json.loads(out.stdout[out.stdout.index("["):])

    (ours,) = [p for p in listed("list") if p["package_name"] == "airflow-provider-horovod"]
    assert ours["version"] == __version__
    (ray,) = [h for h in listed("hooks") if h.get("connection_type") == "ray"]
    assert ray["class"] == "airflow_provider_horovod.hooks.ray.RayHook"
