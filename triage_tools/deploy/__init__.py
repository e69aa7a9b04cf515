"""Deployment helpers: what a Triage deployment needs from Airflow, checked before it is applied.

No Airflow imports here: these modules only describe and drive the Airflow CLI (and read, never
change, Airflow's metadata tables, except ``fernet.forget`` on an operator's command).
"""
