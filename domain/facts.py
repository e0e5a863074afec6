"""Facts and their slots: each fact a job gives (a name, a unit, a period, a number, a number
the runtime computed) enters the model's input as a slot token ([F1], [F2], ...); the model
writes slot tokens where a fact goes, and the runtime writes the facts (lexicalise).  A small
model phrases; it does not copy a name it never saw.  Knows nothing of what the facts mean."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from domain.markup import N_SLOTS, SLOT_TOKENS

_NO_ALNUM_BEFORE, _NO_ALNUM_AFTER = r"(?<![^\W_])", r"(?![^\W_])"  # no letter or digit beside (an "_" may be)
SLOT = re.compile(r"\[F([0-9]+)\]")  # any slot token's text, also one past the table's end


class TooManyFacts(ValueError):
    """A job gives more facts than the vocabulary has slots."""


@dataclass
class Slots:
    """The slot table of one input: its (first + i)-th slot token holds texts[i], in the order the
    input names them."""

    texts: list[str] = field(default_factory=list)
    first: int = 0  # the table's first slot is SLOT_TOKENS[first] (training draws some tables further on)
    #: one slot per distinct text: a model that writes facts as text (an imported one) writes two
    #: equal facts alike, and its text is read back by delexicalise, which cannot tell them apart
    dedup: bool = False

    def add(self, text: str) -> str:
        """A slot for `text` (a new one, or with dedup the one it has already); its token."""
        if self.dedup and text in self.texts:
            return SLOT_TOKENS[self.first + self.texts.index(text)]
        if self.first + len(self.texts) >= N_SLOTS:
            raise TooManyFacts(f"more than {N_SLOTS - self.first} facts in one input")
        self.texts.append(text)
        return SLOT_TOKENS[self.first + len(self.texts) - 1]

    def tokens(self) -> tuple[str, ...]:
        """The table's slot tokens, in order."""
        return SLOT_TOKENS[self.first: self.first + len(self.texts)]

    def lexicalise(self, text: str) -> str:
        """`text` with each slot token of the table replaced by its fact (a token the table does
        not hold stays: the checker has refused such a text already)."""
        def fact(m: re.Match[str]) -> str:
            i = int(m.group(1)) - 1 - self.first
            return self.texts[i] if 0 <= i < len(self.texts) else m.group(0)
        return SLOT.sub(fact, text)

    def delexicalise(self, text: str) -> str:
        """`text` with each fact it writes out replaced by the fact's slot token: how the text of
        a model that copies facts is read back by the same checker.  The longest fact first at each
        place, and a fact that starts or ends with a letter or digit only where no letter or digit
        stands beside it ("12" is no fact inside "1240", "EMEA" none inside "EMEA2")."""
        if not self.texts:
            return text
        by_length = sorted(set(self.texts), key=len, reverse=True)
        alts = [(_NO_ALNUM_BEFORE if t[:1].isalnum() else "") + re.escape(t) + (_NO_ALNUM_AFTER if t[-1:].isalnum() else "")
                for t in by_length]
        token = {t: SLOT_TOKENS[self.first + self.texts.index(t)] for t in by_length}
        return re.sub("|".join(alts), lambda m: token[m.group(0)], text)


def slots_in(text: str) -> list[str]:
    """The slot tokens of `text`, in order."""
    return [m.group(0) for m in SLOT.finditer(text)]
