"""The job ledger: states, schema, the named transitions and the store. No Airflow imports."""

# The schema's metadata is whole (its access and learning tables included) wherever any part of
# the ledger is imported.
from triage.jobs import schema as _schema  # noqa: F401
