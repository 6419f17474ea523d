"""What runs on the Ray cluster: ``entrypoint`` (every job's), ``trainers`` (Horovod on Ray Train),
``horovod_v2`` (the Horovod backend for Train V2) and ``storage`` (the job's files).

Nothing here imports Airflow, or the provider's Airflow side: a Ray image has neither. The
contract with the Airflow side is ``airflow_provider_horovod.contract``.
"""
