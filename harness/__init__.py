"""What the tests and the benchmarks run against, as deployed: Ray heads from the cluster's
environment (``cluster``), Airflow's components on PostgreSQL (``stack``, ``postgres``), hosts made of
network namespaces (``hosts``), an S3 server (``s3``). Importable from the checkout's root; the tests
add that root at the end of ``sys.path``, after the installed provider."""
