"""A deterministic keyword classifier: the default, the baseline, and the benchmark workhorse.

Text and keywords are normalised the same way (lower case, apostrophes dropped, other
punctuation as spaces) and split into words; a keyword matches a run of whole words, its last
word optionally followed by a plural ``s``/``es``.

Matching uses a set intersection and substring tests (C loops) over the words, rather than one
large regular expression: Python's ``re`` tries alternatives one by one, which is an order of
magnitude slower with ~150 keywords.
"""

from __future__ import annotations

import string
import time
from collections.abc import Sequence
from typing import Final

from triage.classifiers.base import MAX_CANDIDATES, ClassifyRequest, ModelOutput
from triage.classifiers.taxonomy import Taxonomy, TaxonomyError

__all__ = ["KeywordClassifier", "keyword_candidates", "keyword_confidence", "normalise_words"]

_VERSION_PREFIX: Final = "keyword-v1"

# Apostrophes vanish ("doesn't" -> "doesnt"); every other ASCII punctuation splits words.
_NORMALISE: Final = str.maketrans(
    {
        **{char: " " for char in string.punctuation if char != "'"},
        "'": None,
        "\u2019": None,
    }
)

_STRENGTH_BASE: Final = 0.35
"""Confidence strength is ``1 - 0.35 ** top_score``: one hit 0.65, two 0.88, three 0.96."""


def normalise_words(text: str) -> list[str]:
    """Split ``text`` into the normalised words keywords are matched against."""
    return text.lower().translate(_NORMALISE).split()


def keyword_confidence(scores: Sequence[float]) -> tuple[int | None, float]:
    """Pick the best label index and a confidence from per-label scores.

    Confidence is the top score's share of all scores (agreement) times a strength that grows
    with the top score (evidence): two hits of one label alone are more convincing than one,
    and a ticket matching two labels equally is at most 0.5. Ties go to the label listed first
    in the taxonomy, so the result is deterministic. No hits at all is ``(None, 0.0)``.
    """
    total = sum(scores)
    if total <= 0.0:
        return None, 0.0
    top = max(scores)
    best = scores.index(top)  # the first among equals
    return best, (top / total) * (1.0 - _STRENGTH_BASE**top)


def keyword_candidates(names: Sequence[str], scores: Sequence[float]) -> tuple[tuple[str, float], ...]:
    """The labels with hits, best first (at most :data:`~triage.classifiers.base.MAX_CANDIDATES`),
    each scored as :func:`keyword_confidence` scores the best: its share of all hits times the
    strength of its own, so the first candidate's score is the answer's confidence and the gap to
    the second says how close the call was. Ties in the taxonomy's order, as the answer's."""
    hits = [i for i, score in enumerate(scores) if score > 0.0]
    if len(hits) > 1:  # most documents hit one label: nothing to sort
        hits.sort(key=scores.__getitem__, reverse=True)  # stable: the first among equals stays first
    total = sum(scores)
    return tuple(
        (names[i], round((scores[i] / total) * (1.0 - _STRENGTH_BASE ** scores[i]), 4)) for i in hits[:MAX_CANDIDATES]
    )


def _plural_variants(words: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """The keyword itself and its plural forms (last word + s, or + es after s/x/z/ch/sh)."""
    last = words[-1]
    if not last.isalpha():
        return (words,)
    suffixes = ("s", "es") if last.endswith(("s", "x", "z", "ch", "sh")) else ("s",)
    return (words, *((*words[:-1], last + suffix) for suffix in suffixes))


def keyword_version(taxonomy: Taxonomy) -> str:
    """The keyword rules' version over ``taxonomy``, without building the rules (a pure function
    of the taxonomy: its content hash).

    :raises TaxonomyError: a label of ``taxonomy`` has no keywords (it could never be found).
    """
    bare = [label.name for label in taxonomy.labels if not label.keywords]
    if bare:
        raise TaxonomyError(
            f"the keyword classifier needs keywords for every label; {', '.join(bare)} has none: add keywords "
            "to the taxonomy, or run the learned classifier (triage train) or the llm one"
        )
    return f"{_VERSION_PREFIX}+tax-{taxonomy.content_hash[:8]}"


class KeywordClassifier:
    """Scores each label by the distinct keywords found; see :func:`keyword_confidence`.

    A keyword counts once however often it is repeated (shouting "refund" five times is not
    five pieces of evidence); a keyword of ``n`` words weighs ``1 + 0.5 * (n - 1)`` because
    phrases are more specific than single words. Stateless after construction, hence
    thread-safe.
    """

    def __init__(self, taxonomy: Taxonomy) -> None:
        """:raises TaxonomyError: a label of ``taxonomy`` has no keywords (it could never be found)."""
        self.version = keyword_version(taxonomy)
        self.taxonomy = taxonomy
        self._names: tuple[str, ...] = tuple(label.name for label in taxonomy.labels)
        # anchor word -> [(keyword number, " the whole phrase " or None for a single word,
        # label, weight)]; plural variants share the keyword number, so they count once.
        # A phrase is anchored on its longest word, the least likely to be a common word
        # ("in transit" on "transit", not "in"), so phrases are rarely searched for nothing.
        index: dict[str, list[tuple[int, str | None, int, float]]] = {}
        keywords = (
            (label_index, keyword) for label_index, label in enumerate(taxonomy.labels) for keyword in label.keywords
        )
        for number, (label_index, keyword) in enumerate(keywords):
            words = tuple(normalise_words(keyword))
            if words:
                weight = 1.0 + 0.5 * (len(words) - 1)
                for variant in _plural_variants(words):
                    phrase = f" {' '.join(variant)} " if len(variant) > 1 else None
                    anchor = max(reversed(variant), key=len)
                    index.setdefault(anchor, []).append((number, phrase, label_index, weight))
        self._index = index
        self._anchors = frozenset(index)

    def scores(self, text: str) -> list[float]:
        """Weighted distinct keyword hits per label, in taxonomy order."""
        scores = [0.0] * len(self._names)
        words = normalise_words(text)
        joined: str | None = None
        found: set[int] = set()
        # Only the anchors present are looked at (one C-level set intersection); a Python
        # loop over every word was most of the cost.
        for anchor in self._anchors.intersection(words):
            for number, phrase, label_index, weight in self._index[anchor]:
                if phrase is not None:
                    if joined is None:
                        joined = f" {' '.join(words)} "
                    if phrase not in joined:
                        continue
                if number not in found:
                    found.add(number)
                    scores[label_index] += weight
        return scores

    def classify(self, request: ClassifyRequest) -> ModelOutput:
        """Label ``request.text``, with the labels it hit as candidates (:func:`keyword_candidates`);
        no keyword at all is ``label=None, confidence=0.0``, no candidates."""
        started = time.perf_counter()
        scores = self.scores(request.text)
        best, confidence = keyword_confidence(scores)
        return ModelOutput(
            label=None if best is None else self._names[best],
            confidence=confidence,
            rejected_reason=None,
            latency_ms=(time.perf_counter() - started) * 1000.0,
            candidates=keyword_candidates(self._names, scores) if best is not None else (),
        )

    def close(self) -> None:
        """Nothing to release."""
