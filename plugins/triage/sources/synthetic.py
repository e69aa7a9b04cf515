"""A deterministic generator of realistic support tickets, for demos, tests, drills and benchmarks.

Same ``(interval, seed, documents)`` in, byte-identical documents in the same order out, in any
process: everything is drawn from one :class:`random.Random` seeded by a BLAKE2b digest of
the seed and the interval start (never Python's salted ``hash()``).

Tickets are assembled from precomputed sentences that embed the taxonomy's own keywords, so
the keyword classifier gets most of them right, with a controlled share of hard cases:

* about 12% *confused* tickets also mention one or two keywords of another label (lower
  confidence, sometimes the wrong label);
* about 3% *vague* tickets mention no keyword at all (no label, inconclusive).

It is fast (tens of microseconds per ticket): no pydantic validation per document; the
canonical JSON is written directly with an encoder configured exactly like
:func:`~triage.contracts.documents.canonical_json_bytes`, which the tests check by round-trip.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import random
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import Final, Literal, overload

from triage.classifiers.taxonomy import Taxonomy
from triage.sources.base import SourceDocument, require_aware

__all__ = ["SyntheticSource"]

VAGUE_SHARE: Final = 0.03
CONFUSED_SHARE: Final = 0.12

# Relative frequency of each default label in a support inbox; other labels weigh 1.0.
_LABEL_WEIGHTS: Final = {
    "billing": 1.8,
    "refund_request": 1.2,
    "account_access": 1.5,
    "bug_report": 1.5,
    "feature_request": 0.8,
    "shipping": 1.5,
    "cancellation": 1.0,
    "general_inquiry": 0.7,
}

# Frames never contain a keyword of the default taxonomy themselves (a test checks that vague
# tickets, made of frames only, match nothing).
_SUBJECT_FRAMES: Final = (
    "Problem with {kw}",
    "Help needed: {kw}",
    "Re: {kw}",
    "Urgent: {kw}",
    "About {kw}",
    "{kw} - please help",
    "Regarding {kw}",
)
_KEYWORD_FRAMES: Final = (
    "I'm writing about {kw}.",
    "Can someone on your team look into {kw} for me?",
    "I already tried to sort out the {kw} situation myself, without luck.",
    "To be clear, the main topic here is {kw}.",
    "Your website did not say much about {kw}.",
    "A colleague had the same experience with {kw} last month.",
    "Please get back to me about {kw} as soon as possible.",
    "It is the second time this month I have to contact you about {kw}.",
)
_MINOR_FRAMES: Final = (
    "Also, unrelated, I noticed something about {kw}.",
    "Not sure if it matters, but there was also {kw} earlier.",
)
_CONTEXT: Final = (
    "I have been a happy customer of yours for several years now.",
    "My order number is #{n}, in case you need it.",
    "My customer number is C-{n}, registered under this email address.",
    "I am using the mobile app on my phone, version 4.{n}.",
    "This all started on Monday afternoon and nothing has changed since.",
    "I appreciate your time and I know you get a lot of messages.",
    "I hope this makes sense, English is not my first language.",
    "Let me know if you need anything else from me, like screenshots.",
    "I work from home, so I am usually reachable during the day.",
    "My reference from the previous conversation was #{n}.",
)
_VAGUE_SUBJECTS: Final = ("Hello", "Need some help", "Following up", "Quick one", "Ticket #{n}")
_VAGUE_BODY: Final = (
    "I contacted you last week and I am still waiting.",
    "Could you get back to me when you have a moment?",
    "Something is not right and I am not sure who to ask.",
    "My partner says I should write to you.",
)
_GREETINGS: Final = ("Hi,", "Hello,", "Dear team,", "Good morning,", "Hey there,")
_CLOSINGS: Final = ("Thanks,", "Best regards,", "Kind regards,", "Cheers,", "Many thanks,")
_NAMES: Final = (
    "Ana",
    "Ben",
    "Chloe",
    "Dmitri",
    "Emeka",
    "Fatima",
    "Goran",
    "Hana",
    "Ines",
    "Jonas",
    "Kenji",
    "Leila",
    "Marta",
    "Noah",
    "Olu",
    "Priya",
    "Quentin",
    "Rosa",
    "Sven",
    "Tomasz",
)
_CHANNELS: Final = ("email", "email", "web_form", "chat", None)


def _escaped(text: str) -> str:
    """``text`` as inside a JSON string written with ``ensure_ascii=False``, without quotes."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _escaped_all(texts: Iterable[str]) -> tuple[str, ...]:
    return tuple(_escaped(text) for text in texts)


_CONTEXT_JSON: Final = _escaped_all(_CONTEXT)
_VAGUE_SUBJECTS_JSON: Final = _escaped_all(_VAGUE_SUBJECTS)
_VAGUE_BODY_JSON: Final = _escaped_all(_VAGUE_BODY)
_GREETINGS_JSON: Final = _escaped_all(_GREETINGS)
_CLOSINGS_JSON: Final = _escaped_all(_CLOSINGS)
_NAMES_JSON: Final = _escaped_all(_NAMES)
_CHANNELS_JSON: Final = tuple(json.dumps(channel) for channel in _CHANNELS)


def _seeded_random(seed: int, start: datetime, purpose: str) -> random.Random:
    material = f"{seed}|{start.astimezone(UTC).isoformat()}|{purpose}".encode()
    return random.Random(int.from_bytes(hashlib.blake2b(material, digest_size=16).digest(), "big"))


class SyntheticSource:
    """``documents`` synthetic tickets per interval, plus ``duplicate_rate`` redeliveries.

    A duplicate has the same external id and the same bytes as its original and comes later
    in the stream, as an at-least-once upstream would redeliver it. Which documents are
    duplicated is drawn from a separate random stream, so the documents themselves do not
    depend on ``duplicate_rate``.
    """

    name = "synthetic"

    def __init__(
        self,
        documents: int,
        seed: int = 0,
        duplicate_rate: float = 0.0,
        taxonomy: Taxonomy | None = None,
    ) -> None:
        if documents < 0:
            raise ValueError("documents must be >= 0")
        if not 0.0 <= duplicate_rate <= 1.0:
            raise ValueError("duplicate_rate must be within [0, 1]")
        self.documents = documents
        self.seed = seed
        self.duplicate_rate = duplicate_rate
        self.taxonomy = taxonomy if taxonomy is not None else Taxonomy.load()
        labels = self.taxonomy.labels
        self._label_names = tuple(label.name for label in labels)
        cumulative, total = [], 0.0
        for label in labels:
            total += _LABEL_WEIGHTS.get(label.name, 1.0)
            cumulative.append(total)
        self._cumulative, self._total_weight = cumulative, total
        self._subjects = tuple(
            _escaped_all(frame.format(kw=kw) for frame in _SUBJECT_FRAMES for kw in label.keywords) for label in labels
        )
        self._sentences = tuple(
            _escaped_all(frame.format(kw=kw) for frame in _KEYWORD_FRAMES for kw in label.keywords) for label in labels
        )
        self._minor = tuple(
            _escaped_all(frame.format(kw=kw) for frame in _MINOR_FRAMES for kw in label.keywords) for label in labels
        )

    def read(self, start: datetime, end: datetime) -> Iterator[SourceDocument]:
        """The documents of ``[start, end)`` (see :meth:`read_labelled`)."""
        for document, _label in self.read_labelled(start, end):
            yield document

    def read_where(self, start: datetime, end: datetime, keep: Callable[[str], bool]) -> Iterator[SourceDocument]:
        """The documents of ``[start, end)`` whose external id ``keep`` accepts, exactly as
        :meth:`read` yields them: a :class:`~triage.sources.base.Shard` reads its share so. The
        others are drawn but never built (their random draws only: the stream is sequential),
        so the shards of a day build each document once between them."""
        for document, _label in self.read_labelled(start, end, keep):
            yield document

    def read_labelled(
        self, start: datetime, end: datetime, keep: Callable[[str], bool] | None = None
    ) -> Iterator[tuple[SourceDocument, str]]:
        """The documents with the label each was written for (the ground truth); with ``keep``,
        only those whose external id it accepts (:meth:`read_where`).

        ``received_at`` is spread over the interval in increasing order, at whole seconds; an
        empty interval (``start == end``) puts every document at ``start``.
        """
        require_aware(start, end)
        count = self.documents
        base = start.astimezone(UTC)
        day = base.strftime("%Y-%m-%d") if base.time() == datetime.min.time() else base.strftime("%Y-%m-%dT%H%M%S")
        # Whole seconds within [start, end), even if the bounds carry microseconds.
        first_second = math.ceil(start.timestamp())
        span = max(math.ceil(end.timestamp()) - first_second, 0)

        redeliver_after: dict[int, list[int]] = {}
        duplicates = round(count * self.duplicate_rate)
        if duplicates:
            plan = _seeded_random(self.seed, start, "duplicates")
            for original in sorted(plan.sample(range(count), duplicates)):
                redeliver_after.setdefault(plan.randrange(original, count), []).append(original)
        held: dict[int, tuple[SourceDocument, str]] = {}
        duplicated = {original for originals in redeliver_after.values() for original in originals}

        rnd = _seeded_random(self.seed, start, "documents").random
        day_prefix: dict[int, str] = {}
        last_second = max(span - 1, 0)
        ticket = self._ticket
        for index in range(count):
            offset = min(int((index + rnd()) * span / count), last_second) if span else 0
            external_id = f"syn-{day}-{index:06d}"
            if keep is not None and not keep(external_id):
                ticket(rnd, build=False)  # drawn, not built; its own redeliveries share its id: never held
            else:
                # Formatting by hand: strftime() per document was a fifth of the generation time.
                days, second_of_day = divmod(first_second + offset, 86_400)
                prefix = day_prefix.get(days)
                if prefix is None:
                    prefix = day_prefix[days] = datetime.fromtimestamp(days * 86_400, UTC).strftime("%Y-%m-%dT")
                hours, rest = divmod(second_of_day, 3600)
                minutes, seconds = divmod(rest, 60)
                subject, body, channel, label = ticket(rnd)
                # Keys in sorted order, compact separators, pieces already JSON-escaped: the exact
                # bytes canonical_json_bytes() would produce (checked by round-trip in the tests).
                content = (
                    f'{{"body":"{body}","channel":{channel},"external_id":"{external_id}",'
                    f'"received_at":"{prefix}{hours:02d}:{minutes:02d}:{seconds:02d}Z",'
                    f'"schema_version":1,"subject":"{subject}"}}'
                ).encode()
                item = (SourceDocument("synthetic", external_id, content), label)
                yield item
                if index in duplicated:
                    held[index] = item
            for original in redeliver_after.get(index, ()):
                if original in held:  # not held: skipped by ``keep``
                    yield held.pop(original)

    @overload
    def _ticket(self, rnd: Callable[[], float]) -> tuple[str, str, str, str]: ...

    @overload
    def _ticket(self, rnd: Callable[[], float], build: Literal[False]) -> None: ...

    def _ticket(self, rnd: Callable[[], float], build: bool = True) -> tuple[str, str, str, str] | None:
        """Draw one ticket: JSON-escaped subject and body, channel as JSON, and its label; with
        ``build`` false, make the same random draws and build nothing (a shard skipping another
        shard's document: the documents after it are the same either way).

        JSON string escaping works character by character, so escaped pieces concatenate into
        the escaped whole; the pieces are escaped once, in ``__init__``.
        """
        names = self._label_names
        label = min(bisect.bisect_right(self._cumulative, rnd() * self._total_weight), len(names) - 1)
        number = rnd()
        context = _CONTEXT_JSON
        kind = rnd()
        if kind < VAGUE_SHARE:
            vague = _VAGUE_BODY_JSON
            subject = _VAGUE_SUBJECTS_JSON[int(rnd() * len(_VAGUE_SUBJECTS_JSON))]
            sentences = [
                vague[int(rnd() * len(vague))],
                context[int(rnd() * len(context))],
                vague[int(rnd() * len(vague))],
                context[int(rnd() * len(context))],
            ]
        else:
            own = self._sentences[label]
            subjects = self._subjects[label]
            subject = subjects[int(rnd() * len(subjects))]
            sentences = [
                context[int(rnd() * len(context))],
                own[int(rnd() * len(own))],
                context[int(rnd() * len(context))],
            ]
            for _ in range(1 + int(rnd() * 3)):
                sentences.insert(1 + int(rnd() * len(sentences)), own[int(rnd() * len(own))])
            if kind < VAGUE_SHARE + CONFUSED_SHARE and len(names) > 1:
                minor = self._minor[(label + 1 + int(rnd() * (len(names) - 1))) % len(names)]
                for _ in range(1 + int(rnd() * 2)):
                    sentences.append(minor[int(rnd() * len(minor))])
        sentences.append(context[int(rnd() * len(context))])
        greeting = _GREETINGS_JSON[int(rnd() * len(_GREETINGS_JSON))]
        closing = _CLOSINGS_JSON[int(rnd() * len(_CLOSINGS_JSON))]
        name = _NAMES_JSON[int(rnd() * len(_NAMES_JSON))]
        channel = _CHANNELS_JSON[int(rnd() * len(_CHANNELS_JSON))]
        if not build:
            return None
        n = str(int(number * 900_000) + 100_000)
        body = f"{greeting}\\n\\n{' '.join(sentences).replace('{n}', n)}\\n\\n{closing}\\n{name}"
        return subject.replace("{n}", n), body, channel, names[label]
