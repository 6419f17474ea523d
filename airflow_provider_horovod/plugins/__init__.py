"""Airflow UI plugin: a training task's curves, where the run is."""
