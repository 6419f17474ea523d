"""Helpers of the tests: the cluster's environment, Airflow's CLI, and a quick stand-in job."""
