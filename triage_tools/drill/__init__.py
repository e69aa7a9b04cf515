"""Failure drills: the invariant checker that decides whether a drill broke a promise."""
