"""Deployment helpers: what a Triage deployment needs from Airflow, checked before it is applied.

No Airflow imports here: these modules only describe and drive the Airflow CLI (and read, never
change, Airflow's metadata tables, except ``fernet.forget`` on an operator's command). The one
exception is ``reconcile_user.provision_fab``, which docker-compose's ``airflow-init`` runs inside
the image: it makes a FAB role and user through FAB's security manager, as ``airflow users`` does.
"""
