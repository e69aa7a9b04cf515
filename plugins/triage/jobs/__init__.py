"""The job ledger: states, schema, the named transitions and the store. No Airflow imports."""
