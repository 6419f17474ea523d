import json
import subprocess
import sys
from importlib import resources

import jsonschema

from airflow_provider_horovod import get_provider_info


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
