"""Triage inside Airflow's API server: the review queue, a job with its document, decisions and
the reconciliation reports as pages and a JSON API, behind Airflow's auth (mounted at ``/triage``
by ``plugins/triage_plugin.py``)."""
