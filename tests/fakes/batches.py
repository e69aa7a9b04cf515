"""The batch interface of the fake model server: :mod:`triage_tools.drill.openai_batches`."""

from triage_tools.drill.openai_batches import FakeBatches

__all__ = ["FakeBatches"]
