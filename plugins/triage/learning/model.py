"""The learned classifier's model: TF-IDF word and character n-grams, and a linear layer.

Trained with scikit-learn (:mod:`triage.learning.training`), kept as data: the two vocabularies,
their IDF weights, the coefficients and intercepts, written as an ``.npz`` archive of plain
arrays (little-endian float32 numbers and UTF-8 text as bytes, nothing else: each member's
``.npy`` header is checked before a byte of its data is taken, and neither :func:`numpy.load` nor
pickle is ever called, so a row of the registry can hold numbers and text, never code).
:meth:`LinearTextModel.from_bytes` checks the bytes against the SHA-256 the registry stored
beside them before it parses anything, then the archive's shape, and refuses anything else with
:class:`ArtifactRefused`. The SHA-256 guards against a damaged or half-written artifact, not an
attacker who can write the row (they write the hash too): against them stand the checks of
shapes, dtypes and values, and a loader that only ever reads numbers and text.

Inference does not use scikit-learn: the features are computed here exactly as scikit-learn's
``TfidfVectorizer`` computes them (word 1-2 grams over ``(?u)\\b\\w\\w+\\b`` tokens, ``char_wb``
2-5 grams, lower case, sublinear term frequency, each block L2-normalised as a
``FeatureUnion`` of the two leaves it; tests/unit/test_learned_model.py holds the two equal), one
document at a time without sparse-matrix overhead (:meth:`LinearTextModel.features`), or many
at once (:meth:`LinearTextModel.ranked_many`, what a claim of the classify step takes): there the
Python work per document is a lookup per whitespace-separated word (its character n-gram ids and
its tokens' ids, cached per word) and everything else is one pass of array operations over the
whole chunk, so numpy's per-call overhead is paid once per chunk instead of a dozen times per
document. Words seen before keep their ids in a bounded cache.
"""

from __future__ import annotations

import io
import json
import math
import re
import threading
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from triage.payload_packs import sha256_hex

__all__ = [
    "ARTIFACT_FORMAT",
    "ArtifactRefused",
    "ArtifactTampered",
    "FeatureSpec",
    "LinearTextModel",
    "char_ngrams",
    "sha256_hex",
    "word_ngrams",
]

ARTIFACT_FORMAT: Final = "triage-linear-text-v1"
"""The artifact's format name, stored in it; another is refused."""

_TOKEN: Final = re.compile(r"(?u)\b\w\w+\b")
_WHITE_SPACES: Final = re.compile(r"\s\s+")
_ARRAYS: Final = frozenset({"meta", "labels", "word_terms", "char_terms", "idf", "coef", "intercept"})
_WORD_CACHE_SIZE: Final = 200_000
MAX_ARTIFACT_BYTES: Final = 512 << 20
"""The largest artifact (uncompressed arrays) a load accepts: a bound on what a row can make it allocate."""


class ArtifactRefused(ValueError):
    """The bytes are not a model artifact this code reads (format, arrays, shapes, values)."""


class ArtifactTampered(ArtifactRefused):
    """The bytes do not hash to the SHA-256 the registry stored for them."""


@dataclass(frozen=True, slots=True)
class FeatureSpec:
    """The features: word n-grams and character n-grams within word boundaries."""

    word_ngrams: tuple[int, int] = (1, 2)
    char_ngrams: tuple[int, int] = (2, 5)

    def to_dict(self) -> dict[str, Any]:
        return {"word_ngrams": list(self.word_ngrams), "char_ngrams": list(self.char_ngrams)}

    @classmethod
    def from_dict(cls, data: Any) -> FeatureSpec:
        """The settings an artifact names, checked: two pairs of integers within 1..8.

        :raises ArtifactRefused: anything else (never a bare ``ValueError`` or ``OverflowError``).
        """
        if not isinstance(data, dict):
            raise ArtifactRefused("the artifact's feature settings are not word_ngrams/char_ngrams pairs")
        pairs = []
        for key in ("word_ngrams", "char_ngrams"):
            pair = data.get(key)
            # Exact integers only: a float (Infinity, 1e308) or a bool is no n-gram size.
            if not (isinstance(pair, list) and len(pair) == 2 and all(type(n) is int for n in pair)):
                raise ArtifactRefused("the artifact's feature settings are not word_ngrams/char_ngrams pairs")
            low, high = pair
            if not (1 <= low <= high <= 8):
                raise ArtifactRefused("the artifact's n-gram ranges are outside 1..8")
            pairs.append((low, high))
        return cls(pairs[0], pairs[1])


def word_ngrams(text: str, low: int, high: int) -> list[str]:
    """scikit-learn's ``analyzer="word"`` n-grams of lower-cased ``text``."""
    return _word_ngrams(text.lower(), low, high)


def _word_ngrams(lowered: str, low: int, high: int) -> list[str]:
    tokens = _TOKEN.findall(lowered)
    if high == 1:
        return tokens if low == 1 else []
    grams = list(tokens) if low == 1 else []
    count = len(tokens)
    for n in range(max(low, 2), min(high + 1, count + 1)):
        grams.extend(" ".join(tokens[i : i + n]) for i in range(count - n + 1))
    return grams


def _word_char_ngrams(word: str, low: int, high: int) -> list[str]:
    """The ``char_wb`` n-grams of one word (as scikit-learn pads and cuts it)."""
    padded = f" {word} "
    length = len(padded)
    grams: list[str] = []
    for n in range(low, high + 1):
        if n >= length:
            grams.append(padded)  # a short word counts once, whole (scikit-learn's rule)
            break
        grams.extend(padded[i : i + n] for i in range(length - n + 1))
    return grams


def char_ngrams(text: str, low: int, high: int) -> list[str]:
    """scikit-learn's ``analyzer="char_wb"`` n-grams of lower-cased ``text``."""
    grams: list[str] = []
    for word in _WHITE_SPACES.sub(" ", text.lower()).split():
        grams.extend(_word_char_ngrams(word, low, high))
    return grams


class LinearTextModel:
    """The model: ``labels``, the two vocabularies (term -> column), IDF per column, and the
    linear layer ``coef`` (labels x columns) with its ``intercept``. Probabilities are the
    softmax of the scores (scikit-learn's multinomial logistic regression), or the sigmoid of
    the one score of a two-label model. Thread-safe: the word cache is only ever added to.
    """

    def __init__(
        self,
        labels: Sequence[str],
        word_terms: Sequence[str],
        char_terms: Sequence[str],
        idf: npt.NDArray[np.floating[Any]],
        coef: npt.NDArray[np.floating[Any]],
        intercept: npt.NDArray[np.floating[Any]],
        spec: FeatureSpec = FeatureSpec(),
    ) -> None:
        self.labels = tuple(labels)
        self.spec = spec
        self.word_terms = tuple(word_terms)
        self.char_terms = tuple(char_terms)
        self.n_word = len(self.word_terms)
        self.word_index = {term: i for i, term in enumerate(self.word_terms)}
        self.char_index = {term: i + self.n_word for i, term in enumerate(self.char_terms)}
        width = self.n_word + len(self.char_terms)
        self.idf = np.ascontiguousarray(idf, dtype=np.float32)
        self.coef = np.ascontiguousarray(coef, dtype=np.float32)
        self.intercept = np.ascontiguousarray(intercept, dtype=np.float32)
        rows = 1 if len(self.labels) == 2 else len(self.labels)
        if len(self.labels) < 2 or len(set(self.labels)) != len(self.labels):
            raise ArtifactRefused("a model needs at least two distinct labels")
        if self.idf.shape != (width,) or self.coef.shape != (rows, width) or self.intercept.shape != (rows,):
            raise ArtifactRefused("the artifact's arrays do not fit its vocabularies and labels")
        if not (np.isfinite(self.idf).all() and np.isfinite(self.coef).all() and np.isfinite(self.intercept).all()):
            raise ArtifactRefused("the artifact holds a number that is not finite")
        if len(self.word_index) != self.n_word or len(self.char_index) != len(self.char_terms):
            raise ArtifactRefused("a vocabulary holds a term twice")
        # Rows of the transposed layer are gathered per document: contiguous per column.
        self._weights = np.ascontiguousarray(self.coef.T)
        self._word_cache: dict[str, tuple[int, ...]] = {}
        # The chunk path's per-word entries (its tokens' unigram ids, -1 for a token outside the
        # vocabulary, and its char_wb n-gram ids, each as int32 bytes) and its bigram table.
        self._token_bytes: dict[str, bytes] = {}
        self._char_bytes: dict[str, bytes] = {}
        self._bigrams: tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]] | None = None
        self._bigrams_lock = threading.Lock()

    # -- features ---------------------------------------------------------------------------

    def _char_ids(self, word: str) -> tuple[int, ...]:
        cached = self._word_cache.get(word)
        if cached is None:
            index = self.char_index
            low, high = self.spec.char_ngrams
            cached = tuple(i for gram in _word_char_ngrams(word, low, high) if (i := index.get(gram)) is not None)
            if len(self._word_cache) < _WORD_CACHE_SIZE:
                self._word_cache[word] = cached
        return cached

    def features(self, text: str) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float32]]:
        """The document's non-zero columns and their TF-IDF values (each block L2-normalised)."""
        lowered = text.lower()
        word_index = self.word_index
        low, high = self.spec.word_ngrams
        ids = [i for gram in _word_ngrams(lowered, low, high) if (i := word_index.get(gram)) is not None]
        cache, extend = self._word_cache, ids.extend
        for word in lowered.split():  # what scikit-learn's whitespace folding then split() gives
            cached = cache.get(word)
            extend(cached if cached is not None else self._char_ids(word))
        if not ids:
            return np.empty(0, dtype=np.intp), np.empty(0, dtype=np.float32)
        # Counted by numpy (one sort of the ids), not a Python loop: the loop was most of a call's time.
        columns, tf = np.unique(np.array(ids, dtype=np.intp), return_counts=True)
        values = ((np.log(tf.astype(np.float32)) + 1.0) * self.idf[columns]).astype(np.float32, copy=False)
        split = int(np.searchsorted(columns, self.n_word))  # word columns come first
        for block in (values[:split], values[split:]):
            norm = math.sqrt(float(np.dot(block, block)))
            if norm > 0.0:
                block /= norm
        return columns, values

    # -- features of a chunk ----------------------------------------------------------------

    def _chunkable(self) -> bool:
        """Whether :meth:`_chunk_features` computes this model's features: word n-grams of sizes
        1 and 2 only (a longer n-gram would need a lookup per n-gram, the per-document path's)."""
        return self.spec.word_ngrams[1] <= 2 and self._bigram_table() is not None

    def _bigram_table(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]] | None:
        """The word bigrams of the vocabulary as sorted keys ``first * n_word + second`` (the
        unigram columns of their two tokens) and their columns; None when a bigram's tokens are
        not both unigrams of the vocabulary (never so for a fitted model: a token's document
        frequency is at least its bigrams')."""
        if self._bigrams is None:
            with self._bigrams_lock:
                if self._bigrams is None:
                    keys: list[int] = []
                    columns: list[int] = []
                    index, width = self.word_index, self.n_word
                    for column, term in enumerate(self.word_terms):
                        parts = term.split(" ")
                        if len(parts) == 2:
                            first, second = index.get(parts[0]), index.get(parts[1])
                            if first is None or second is None:
                                keys, columns = [-1], [-1]  # not a fitted model's vocabulary
                                break
                            keys.append(first * width + second)
                            columns.append(column)
                    order = np.argsort(np.array(keys, dtype=np.int64), kind="stable")
                    self._bigrams = (
                        np.array(keys, dtype=np.int64)[order],
                        np.array(columns, dtype=np.int32)[order],
                    )
        return None if len(self._bigrams[0]) and self._bigrams[0][0] < 0 else self._bigrams

    def _learn_words(self, unseen: set[str], needed: set[str]) -> tuple[dict[str, bytes], dict[str, bytes]]:
        """Add ``unseen`` (whitespace-separated words not in the caches) to the chunk path's caches: each
        one's token ids (-1 for a token outside the vocabulary) and char_wb n-gram ids, as int32
        bytes. A word's tokens are the document's tokens within it: a token (``\\w\\w+``
        between word boundaries) never holds white space, so none spans two words. Past
        :data:`_WORD_CACHE_SIZE` words new caches replace them (the two stay in step), holding
        every word of ``needed`` (the document's). Returns the caches the words were added to: a
        caller reads its words there, whatever another thread replaced meanwhile (entries are
        only ever added to a cache, never removed)."""
        token_bytes, char_bytes = self._token_bytes, self._char_bytes
        words = unseen
        if len(token_bytes) >= _WORD_CACHE_SIZE:
            token_bytes, char_bytes, words = {}, {}, needed
            self._token_bytes, self._char_bytes = token_bytes, char_bytes
        index, chars = self.word_index, self.char_index
        low, high = self.spec.char_ngrams
        for word in words:
            tokens = [index.get(token, -1) for token in _TOKEN.findall(word)]
            grams = [i for gram in _word_char_ngrams(word, low, high) if (i := chars.get(gram)) is not None]
            # The token entry first: a reader takes a word as known once it is in char_bytes.
            token_bytes[word] = np.array(tokens, dtype=np.int32).tobytes()
            char_bytes[word] = np.array(grams, dtype=np.int32).tobytes()
        return token_bytes, char_bytes

    def _chunk_features(self, texts: Sequence[str]) -> tuple[Any, Any]:
        """The TF-IDF rows of ``texts`` as two sparse matrices (documents x word columns,
        documents x character columns), each row L2-normalised: :meth:`features` of each."""
        from scipy import sparse

        count = len(texts)
        token_parts: list[bytes] = []
        char_parts: list[npt.NDArray[np.int32]] = []
        for text in texts:
            words = text.lower().split()
            # Thread-safe: a cache is only added to (a token entry before its char entry), and
            # a full one is replaced, never emptied, so the pair read here keeps what it holds.
            token_bytes, char_bytes = self._token_bytes, self._char_bytes
            needed = set(words)
            unseen = needed.difference(char_bytes)
            if unseen:
                token_bytes, char_bytes = self._learn_words(unseen, needed)
            token_parts.append(b"".join(map(token_bytes.__getitem__, words)))
            # Sorted per document (small sorts): one sort of the whole chunk costs more.
            char_parts.append(np.sort(np.frombuffer(b"".join(map(char_bytes.__getitem__, words)), dtype=np.int32)))
        documents = np.arange(count, dtype=np.int32)
        tokens = np.frombuffer(b"".join(token_parts), dtype=np.int32)
        token_rows = np.repeat(documents, [len(b) // 4 for b in token_parts])
        rows, columns = [], []
        low, high = self.spec.word_ngrams
        if low == 1:
            known = tokens >= 0
            rows.append(token_rows[known])
            columns.append(tokens[known])
        if high == 2:
            keys_table, bigram_columns = self._bigrams or (np.empty(0, np.int64), np.empty(0, np.int32))
            first, second = tokens[:-1], tokens[1:]
            pairs = (token_rows[1:] == token_rows[:-1]) & (first >= 0) & (second >= 0)
            keys = first[pairs].astype(np.int64) * self.n_word + second[pairs]
            found = np.searchsorted(keys_table, keys)
            found[found == len(keys_table)] = 0
            hit = keys_table[found] == keys if len(keys_table) else np.zeros(len(keys), dtype=bool)
            rows.append(token_rows[1:][pairs][hit])
            columns.append(bigram_columns[found[hit]])
        word_rows = np.concatenate(rows) if rows else np.empty(0, dtype=np.int32)
        word_columns = np.concatenate(columns) if columns else np.empty(0, dtype=np.int32)
        # To CSR sorts each row and sums the duplicates (each column's count in its document).
        words = sparse.coo_matrix(
            (np.ones(len(word_rows), dtype=np.float32), (word_rows, word_columns)), shape=(count, self.n_word)
        ).tocsr()
        indptr = np.zeros(count + 1, dtype=np.int64)
        np.cumsum([len(part) for part in char_parts], out=indptr[1:])
        char_ids = np.concatenate(char_parts) if char_parts else np.empty(0, dtype=np.int32)
        chars = sparse.csr_matrix(
            (np.ones(len(char_ids), dtype=np.float32), char_ids - self.n_word, indptr),
            shape=(count, len(self.char_terms)),
        )
        chars.has_sorted_indices = True
        chars.sum_duplicates()
        for matrix, offset in ((words, 0), (chars, self.n_word)):
            matrix.data = (np.log(matrix.data) + np.float32(1.0)) * self.idf[matrix.indices + offset]
            lengths = np.diff(matrix.indptr)
            norms = np.sqrt(
                np.bincount(
                    np.repeat(np.arange(count), lengths),
                    weights=np.square(matrix.data, dtype=np.float64),
                    minlength=count,
                )
            )
            norms[norms == 0.0] = 1.0
            matrix.data /= np.repeat(norms, lengths).astype(np.float32)
        return words, chars

    def ranked_many(self, texts: Sequence[str], k: int) -> list[list[tuple[str, float]]]:
        """:meth:`ranked` of each of ``texts``, computed for all of them at once (the same labels
        and, within float32 rounding, the same probabilities)."""
        if not texts:
            return []
        if not self._chunkable():
            return [self.ranked(text, k) for text in texts]
        words, chars = self._chunk_features(texts)
        scores = (
            np.asarray(words @ self._weights[: self.n_word]) + np.asarray(chars @ self._weights[self.n_word :])
        ) + self.intercept
        if len(self.labels) == 2:
            positive = 1.0 / (1.0 + np.exp(-scores[:, 0].astype(np.float64)))
            probabilities = np.stack([1.0 - positive, positive], axis=1)
            # As ranked(): the second label first from 0.5 up.
            order = np.where((positive >= 0.5)[:, None], [1, 0], [0, 1])[:, :k]
        else:
            shifted = np.exp((scores - scores.max(axis=1, keepdims=True)).astype(np.float64))
            probabilities = shifted / shifted.sum(axis=1, keepdims=True)
            # Best first; equals keep label order (the first listed first, as argmax and ranked()).
            order = np.argsort(-probabilities, axis=1, kind="stable")[:, :k]
        best = np.take_along_axis(probabilities, order, axis=1).clip(0.0, 1.0)
        labels = self.labels
        return [
            [(labels[i], p) for i, p in zip(row, values, strict=True)]
            for row, values in zip(order.tolist(), best.tolist(), strict=True)
        ]

    # -- scores -----------------------------------------------------------------------------

    def _probabilities(self, scores: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        if len(self.labels) == 2:
            positive = 1.0 / (1.0 + np.exp(-scores[..., 0]))
            return np.stack([1.0 - positive, positive], axis=-1).astype(np.float32)
        shifted = np.exp(scores - scores.max(axis=-1, keepdims=True))
        return (shifted / shifted.sum(axis=-1, keepdims=True)).astype(np.float32)

    def scores(self, text: str) -> npt.NDArray[np.float32]:
        """The linear layer's scores of one document (before the softmax or sigmoid)."""
        columns, values = self.features(text)
        return self.intercept + values @ self._weights[columns] if len(columns) else self.intercept.copy()

    def tempered(self, temperature: float) -> LinearTextModel:
        """This model with its scores divided by ``temperature`` (the layer scaled, nothing else):
        the same label for every document, its probability sharper (below 1) or softer (above)."""
        if not (math.isfinite(temperature) and temperature > 0.0):
            raise ValueError("a temperature is a positive number")
        return LinearTextModel(
            self.labels,
            self.word_terms,
            self.char_terms,
            self.idf,
            self.coef / np.float32(temperature),
            self.intercept / np.float32(temperature),
            self.spec,
        )

    def probabilities(self, text: str) -> npt.NDArray[np.float32]:
        """The probability of each label (in :attr:`labels` order) for one document."""
        columns, values = self.features(text)
        scores = self.intercept + values @ self._weights[columns] if len(columns) else self.intercept.copy()
        return self._probabilities(scores)

    def predict(self, text: str) -> tuple[str, float]:
        """The most probable label and its probability (the softmax's largest term alone)."""
        columns, values = self.features(text)
        scores = self.intercept + values @ self._weights[columns] if len(columns) else self.intercept
        if len(self.labels) == 2:
            positive = 1.0 / (1.0 + math.exp(-float(scores[0])))
            best, probability = (1, positive) if positive >= 0.5 else (0, 1.0 - positive)
        else:
            best = int(np.argmax(scores))
            probability = 1.0 / float(np.exp(scores - scores[best]).sum())
        return self.labels[best], min(max(probability, 0.0), 1.0)

    def ranked(self, text: str, k: int) -> list[tuple[str, float]]:
        """The ``k`` most probable labels with their probabilities, best first. The first is
        :meth:`predict`'s answer, the same label and probability (ties go to the label listed
        first, as ``argmax``)."""
        columns, values = self.features(text)
        scores = self.intercept + values @ self._weights[columns] if len(columns) else self.intercept
        if len(self.labels) == 2:
            positive = 1.0 / (1.0 + math.exp(-float(scores[0])))
            pairs = [(self.labels[1], positive), (self.labels[0], 1.0 - positive)]
            return (pairs if positive >= 0.5 else pairs[::-1])[:k]
        shifted = np.exp(scores - scores.max())
        total = float(shifted.sum())
        # A Python sort of a few dozen floats costs less than numpy's calls on so small an array;
        # reversed, it still keeps equals in label order (the first one first, as argmax).
        values = shifted.tolist()
        order = sorted(range(len(values)), key=values.__getitem__, reverse=True)[:k]
        return [(self.labels[i], min(max(values[i] / total, 0.0), 1.0)) for i in order]

    def predict_many(self, texts: Iterable[str]) -> list[tuple[str, float]]:
        """:meth:`predict` of each of ``texts``, by :meth:`ranked_many` in chunks of 1,000."""
        texts = list(texts)
        out: list[tuple[str, float]] = []
        for start in range(0, len(texts), 1000):
            out.extend(ranked[0] for ranked in self.ranked_many(texts[start : start + 1000], 1))
        return out

    # -- the artifact -----------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """The artifact: an ``.npz`` of plain arrays (text as UTF-8 bytes, never objects).
        Deterministic: the same model gives the same bytes (and so the same SHA-256)."""
        meta = {"format": ARTIFACT_FORMAT, "features": self.spec.to_dict()}
        arrays = {
            "meta": _utf8(json.dumps(meta, sort_keys=True)),
            "labels": _utf8("\n".join(self.labels)),
            "word_terms": _utf8("\n".join(self.word_terms)),
            "char_terms": _utf8("\n".join(self.char_terms)),
            "idf": self.idf,
            "coef": self.coef,
            "intercept": self.intercept,
        }
        buffer = io.BytesIO()
        # Written member by member with a fixed date, so the bytes depend on the arrays only.
        with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for name in sorted(arrays):
                member = io.BytesIO()
                np.lib.format.write_array(member, np.ascontiguousarray(arrays[name]), allow_pickle=False)
                info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(info, member.getvalue())
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, expected_sha256: str) -> LinearTextModel:
        """The model in ``data``, once its SHA-256 is ``expected_sha256``.

        :raises ArtifactTampered: the bytes do not hash to ``expected_sha256`` (nothing is parsed).
        :raises ArtifactRefused: not an artifact of :data:`ARTIFACT_FORMAT`: other members, an
            object array (which only pickle could read), shapes that do not fit, numbers that are
            not finite, or more than :data:`MAX_ARTIFACT_BYTES` once uncompressed.
        """
        if sha256_hex(data) != expected_sha256:
            raise ArtifactTampered("the model artifact does not match its SHA-256: refused, not loaded")
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                members = archive.infolist()
                names = {info.filename: info for info in members}
                # A name given twice would leave which of its members is read to the zip reader.
                if len(names) != len(members) or set(names) != {f"{name}.npy" for name in _ARRAYS}:
                    raise ArtifactRefused("the artifact does not hold exactly the model's arrays")
                if sum(info.file_size for info in names.values()) > MAX_ARTIFACT_BYTES:
                    raise ArtifactRefused("the artifact is larger than a model may be")
                arrays = {name: _read_array(archive.read(f"{name}.npy")) for name in _ARRAYS}
        except (zipfile.BadZipFile, OSError, EOFError, KeyError) as exc:
            raise ArtifactRefused(f"the artifact is not a readable archive ({type(exc).__name__})") from None
        try:
            meta = json.loads(_text(arrays["meta"]))
        except (ValueError, RecursionError):
            raise ArtifactRefused("the artifact's metadata is not JSON") from None
        if not isinstance(meta, dict) or meta.get("format") != ARTIFACT_FORMAT:
            raise ArtifactRefused(f"the artifact is not of format {ARTIFACT_FORMAT}")
        for name in ("idf", "coef", "intercept"):
            if arrays[name].dtype != np.float32:
                raise ArtifactRefused(f"the artifact's {name} is not float32")
        return cls(
            labels=_terms(arrays["labels"]),
            word_terms=_terms(arrays["word_terms"]),
            char_terms=_terms(arrays["char_terms"]),
            idf=arrays["idf"],
            coef=arrays["coef"],
            intercept=arrays["intercept"],
            spec=FeatureSpec.from_dict(meta.get("features")),
        )


def _utf8(text: str) -> npt.NDArray[np.uint8]:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


_DTYPES: Final = (np.dtype("<f4"), np.dtype("|u1"))
"""What an artifact's arrays may be: little-endian float32 numbers, or UTF-8 text as bytes."""


def _read_array(member: bytes) -> npt.NDArray[Any]:
    """One ``.npy`` member, read by hand rather than by :func:`numpy.load`: its header is checked
    first (a plain dtype of :data:`_DTYPES`; a shape whose size is exactly the bytes that follow),
    so a header that declares a huge shape allocates nothing and no dtype can ask for pickle."""
    stream = io.BytesIO(member)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            raise ValueError(f"npy version {version}")
    except (ValueError, SyntaxError, TypeError, OverflowError, RecursionError) as exc:
        raise ArtifactRefused(f"the artifact holds an array this loader refuses ({exc})") from None
    if dtype not in _DTYPES or dtype.hasobject:
        raise ArtifactRefused(
            f"the artifact holds an array this loader refuses (dtype {dtype.str}: float32 or uint8 only)"
        )
    if len(shape) > 2 or not all(type(n) is int and n >= 0 for n in shape):
        raise ArtifactRefused("the artifact holds an array this loader refuses (shape)")
    data = member[stream.tell() :]
    if math.prod(shape) * dtype.itemsize != len(data):
        raise ArtifactRefused("the artifact holds an array whose shape does not fit its bytes")
    return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran_order else "C")


def _text(array: npt.NDArray[Any]) -> str:
    if array.dtype != np.uint8 or array.ndim != 1:
        raise ArtifactRefused("the artifact's text is not UTF-8 bytes")
    try:
        return array.tobytes().decode("utf-8")
    except UnicodeDecodeError:
        raise ArtifactRefused("the artifact's text is not UTF-8") from None


def _terms(array: npt.NDArray[Any]) -> list[str]:
    text = _text(array)
    return text.split("\n") if text else []
