"""The Training view's plugin: registered where Airflow loads it, and the task it is asked about."""

from importlib.metadata import entry_points

from airflow_provider_horovod.plugins.training import HorovodTrainingPlugin, parse_map_index


def test_the_plugin_is_an_airflow_plugins_entry_point_of_the_installed_provider():
    # Airflow loads provider-info plugins only with lazy_discover_providers off; entry points always.
    found = [e for e in entry_points(group="airflow.plugins") if e.name == "horovod_training"]
    assert [e.load() for e in found] == [HorovodTrainingPlugin]


def test_the_ui_leaves_the_map_index_placeholder_for_an_unmapped_task():
    assert parse_map_index("{MAP_INDEX}") == -1
    assert parse_map_index("3") == 3 and parse_map_index("-1") == -1
