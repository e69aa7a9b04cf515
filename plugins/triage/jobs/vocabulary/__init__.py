"""The ledger's vocabulary: states, errors, backoff and the domain objects of the store."""
