"""Review: a human resolves jobs in ``manual_review`` with a label, a requeue or a rejection.

No Airflow here: :mod:`triage.operators.review` adapts it. Importing this package is cheap.
"""
