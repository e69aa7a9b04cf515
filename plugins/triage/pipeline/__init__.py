"""The stages of ``classify_documents`` as plain functions over the ledger. No Airflow imports:
the operators adapt these, and tests and benchmarks call them directly."""
