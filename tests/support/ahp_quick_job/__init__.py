"""A Ray job that stands in for a training run, for tests of the Airflow side (re-attach, storage
faults, backfills, kills) where training itself is not what is checked.

It reads the operator's real payload and writes a real checkpoint and result record where a training
would (local disk or S3), in a second or two: ``python -m ahp_quick_job <payload module>``. Its
``train_loop_config`` steers it: ``quick_lines`` lines printed every ``quick_line_s`` seconds,
``quick_fail`` to end in error (of the class ``quick_fail_class``, user code unless it says
otherwise; any other error it meets is classified as the runtime does), ``quick_stall_s`` to go
quiet that long on attempt 1, ``run`` copied into the metrics; it prints the folders it would
resume from.
"""
