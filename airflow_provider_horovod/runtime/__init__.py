"""What runs on the Ray cluster: the job entrypoint, the trainers and the result record.

Nothing here imports Airflow: a Ray image has no Airflow.
"""
