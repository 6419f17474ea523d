"""Airflow UI plugin: the Training views (``training.py``; their front end in ``www/``)."""
