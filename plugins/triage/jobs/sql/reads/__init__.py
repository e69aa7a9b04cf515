"""Read-only questions asked of the ledger by name."""
