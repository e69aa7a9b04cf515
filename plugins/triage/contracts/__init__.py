"""Pydantic contracts: the events Triage emits and the results it records."""
