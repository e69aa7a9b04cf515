"""Maintenance: retention of what is done (``triage_maintenance``). No Airflow here."""
