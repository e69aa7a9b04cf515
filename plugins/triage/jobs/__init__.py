"""The job ledger: states, schema, the named transitions and the store. No Airflow imports."""

# The tables of who may do what live on the schema's metadata in a module of their own; imported
# with the package so that the metadata is whole wherever any part of the ledger is imported.
from triage.jobs import access_schema as _access_schema  # noqa: F401
