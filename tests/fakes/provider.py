"""The label provider of the failure tests lives with the drill that uses it too."""

from triage.drill.provider import FakeProvider

__all__ = ["FakeProvider"]
