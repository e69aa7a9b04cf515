"""Every way a job's state changes, as fenced statements."""
