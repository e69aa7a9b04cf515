"""The learning loop: labelled examples, the learned classifier's model, training, the registry
and evaluation. No Airflow: the operators and the ``triage`` command call these."""
