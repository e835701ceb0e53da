"""How alike two pieces of writing are, by their wording: the share of word shingles they have in common.

A text's words are its runs of letters and digits, lower-cased, so whitespace, line wrapping, punctuation and
case never count. Its shingles are every run of SHINGLE_WORDS consecutive words; the shingles of the template
a course hands out (the headings, the questions, the guidance) are set aside, since every learner starts from
them. Two texts' similarity is the Jaccard index of what is left: the shingles both have over the shingles
either has. Changing one word changes at most SHINGLE_WORDS shingles, so a text with a handful of words changed
and its lines wrapped anew keeps most of its shingles; two explanations written independently share few, even
on the same questions. A text with fewer than MIN_SHINGLES shingles of its own (a few words of answer) is too
short to tell a copy from a coincidence and is never compared.

What it cannot see: a text rewritten in other words (a paraphrase, a translation, reordered sentences of new
wording) keeps none of its shingles, and two learners who quote the same records or the same sentence of the
lab share those shingles honestly. ALIKE_THRESHOLD is where a pair is shown to a person, never a verdict.
"""

from __future__ import annotations

import re
from typing import Optional

SHINGLE_WORDS = 3
ALIKE_THRESHOLD = 0.5  # a pair at or above this share of shingles in common is flagged for a person
MIN_SHINGLES = 12
_WORD = re.compile(r"[^\W_]+")


def words(text: str) -> list[str]:
    """The text's words, lower-cased: runs of letters and digits (whitespace, line breaks, punctuation aside)."""
    return _WORD.findall(text.lower())


def shingles(text: str, set_aside: frozenset = frozenset()) -> frozenset:
    """Every run of SHINGLE_WORDS consecutive words of the text, less those in set_aside (a template's)."""
    found = words(text)
    return frozenset(tuple(found[i:i + SHINGLE_WORDS]) for i in range(len(found) - SHINGLE_WORDS + 1)) - set_aside


def own_shingles(text: str, template: str) -> Optional[frozenset]:
    """The text's shingles that its template does not have; None when fewer than MIN_SHINGLES are left."""
    own = shingles(text, shingles(template))
    return own if len(own) >= MIN_SHINGLES else None


def similarity(a: frozenset, b: frozenset) -> float:
    """The Jaccard index of two shingle sets: 1.0 for the same wording, 0.0 for none in common."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def rule_text() -> str:
    """The rule in words, for the page, the JSON and the findings."""
    return (f"the share of {SHINGLE_WORDS}-word shingles two texts have in common (Jaccard index, words compared "
            f"lower-case with whitespace, line breaks and punctuation set aside, the template's own wording "
            f"removed), flagged at {ALIKE_THRESHOLD:.0%} or more; texts with fewer than {MIN_SHINGLES} shingles of "
            f"their own are not compared")
