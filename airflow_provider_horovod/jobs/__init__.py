"""The life of one Ray job seen from Airflow: its protocol, the request that starts it, the wait
and the finish. The operator, the trigger, the sensor and the decorators share these steps and do
only their own I/O around them."""
