"""The ledger's named SQLAlchemy Core statements: built here, executed only by the store."""
