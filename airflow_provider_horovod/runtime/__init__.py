"""What runs on the Ray cluster: ``entrypoint`` (every job's), ``trainers`` (Horovod on Ray Train),
``horovod_backend`` and ``horovod_network`` (the Horovod backend for Train V2 and how its workers meet),
``ray_compat`` (the Ray Train internals it uses, across Ray minors) and ``storage`` (the job's files).

Nothing here imports Airflow, or the provider's Airflow side: a Ray image has neither. The
contract with the Airflow side is ``airflow_provider_horovod.contract`` (the names) and
``airflow_provider_horovod.documents`` (the spec, the record, the result).
"""
