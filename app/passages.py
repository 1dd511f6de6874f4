"""The parts of a long file that a question needs: a file longer than the context is cut into
passages at line boundaries, ranked against the question with BM25 (term counts only: offline, no
model), and the best that fit the budget go to the model in file order, each under the lines it
came from, so the model can cite them and the user can find them."""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

from app.attachments import Attachment

K1, B = 1.5, 0.75  # BM25's usual constants: term-frequency saturation and length normalization


@dataclass(frozen=True)
class Passage:
    first: int  # 1-based line numbers, both included
    last: int
    text: str

    def where(self) -> str:
        return f"line {self.first}" if self.first == self.last else f"lines {self.first}–{self.last}"


@dataclass(frozen=True)
class Excerpt:
    attachment: Attachment  # what the model reads in place of the whole file
    sent: int
    total: int
    budget: int  # the tokens it was cut to (a new question re-ranks within the same budget)


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def split(text: str, size: int) -> list[Passage]:
    """Whole lines gathered into passages of about `size` characters (a longer line is a passage
    of its own): a line is never cut, so every citation points at whole lines."""
    out: list[Passage] = []
    lines = text.split("\n")
    start, chunk, length = 1, [], 0
    for n, line in enumerate(lines, 1):
        if chunk and length + len(line) + 1 > size:
            out.append(Passage(start, n - 1, "\n".join(chunk)))
            start, chunk, length = n, [], 0
        chunk.append(line)
        length += len(line) + 1
    if any(s.strip() for s in chunk):
        out.append(Passage(start, len(lines), "\n".join(chunk)))
    return [p for p in out if p.text.strip()]


def bm25(query: str, passages: list[Passage]) -> list[float]:
    """Okapi BM25 of each passage for the query's words."""
    docs = [Counter(words(p.text)) for p in passages]
    if not docs:
        return []
    avg = sum(sum(d.values()) for d in docs) / len(docs) or 1.0
    terms = set(words(query))
    df = {t: sum(1 for d in docs if t in d) for t in terms}
    scores = []
    for d in docs:
        length, score = sum(d.values()), 0.0
        for t in terms:
            if d[t]:
                idf = math.log(1 + (len(docs) - df[t] + 0.5) / (df[t] + 0.5))
                score += idf * d[t] * (K1 + 1) / (d[t] + K1 * (1 - B + B * length / avg))
        scores.append(score)
    return scores


def excerpt(a: Attachment, question: str, budget_tokens: int) -> Excerpt | None:
    """The passages of `a` most relevant to `question` within `budget_tokens` (measured by the file's
    own characters per token, from its counted tokens); None when the file fits whole, is not
    counted yet, or is one passage (nothing to choose from: it stays too long, and is said so)."""
    if a.tokens is None or a.tokens <= budget_tokens or budget_tokens <= 0:
        return None
    chars = int(budget_tokens * len(a.text) / max(1, a.tokens)) - len(_head(a.name, 999_999, 999_999)) - 16
    passages = split(a.text, max(80, chars // 4))  # about four passages' worth fits
    if len(passages) < 2 or chars <= 0:
        return None
    scores = bm25(question, passages)
    ranked = sorted(range(len(passages)), key=lambda i: (-scores[i], i))
    chosen, used = [], 0
    for i in ranked:
        cost = len(passages[i].text) + len(a.name) + 16  # with its heading
        if used + cost <= chars:
            chosen.append(i)
            used += cost
    if not chosen:
        return None
    body = "\n\n".join(f"[{a.name}, {passages[i].where()}]\n{passages[i].text}" for i in sorted(chosen))
    return Excerpt(Attachment(a.name, a.kind, _head(a.name, len(chosen), len(passages)) + body), len(chosen),
                   len(passages), budget_tokens)


def _head(name: str, sent: int, total: int) -> str:
    return f"{name} is longer than the context: {sent} of its {total} passages, the most relevant, by lines:\n\n"
