"""The fake OpenAI-compatible server of the tests lives with the drill that uses it too
(``make chaos`` runs outside pytest): :mod:`triage_tools.drill.openai_server`."""

from triage_tools.drill.openai_server import (
    SCHEMA_REFUSED,
    FakeOpenAIServer,
    Reply,
    Responder,
    fixed_label,
    keyword_responder,
)

__all__ = ["SCHEMA_REFUSED", "FakeOpenAIServer", "Reply", "Responder", "fixed_label", "keyword_responder"]
