"""What the tests, the benchmarks and the chaos run share, one helper per concern: Ray heads from the
cluster's environment (``cluster``), Airflow's components on PostgreSQL (``stack``, ``postgres``), hosts
made of network namespaces (``hosts``) and a Ray cluster on them (``ray_hosts``), an S3 server (``s3``),
an operator run in this process (``tasks``), ``airflow dags test`` and tagged output lines
(``airflow_cli``), this machine's processes and their CPU (``processes``). Importable from the
checkout's root; the tests add that root at the end of ``sys.path``, after the installed provider."""
