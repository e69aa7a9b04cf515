"""The label provider of the failure tests lives with the drill that uses it too."""

from triage_tools.drill.provider import FakeProvider

__all__ = ["FakeProvider"]
