"""An agent's facts as slots (domain/facts.py): the names of its question that its source holds,
and each tool result.  The model reads "Q: What was [F1] in [F2] in [F3]?", writes
`metric("[F1]", "[F2]", "[F3]")`, reads `<result>[F4]</result>`, writes `calc("([F5]-[F4])/[F4]*100")`
and an answer that points at the last result; the runtime writes every one of them back before a
tool runs and before anything is returned.  A name the question holds that no source knows stays
text (the guide keeps its copy whole), and so do the numbers the question writes (a calc's
constants): only what a source or a tool gave is a slot.  Knows nothing of tokens."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from domain.agent import Task
from domain.facts import Slots
from domain.markup import N_SLOTS
from domain.tools import END_RESULT, RESULT

MAX_CALLS = 8  # runtime/jobs/specs.py AgentSpec.max_calls' bound: a result's slot each
MAX_NAMES = N_SLOTS - MAX_CALLS  # a question's names that become slots, at most


def source_names(question: str, held: Iterable[str]) -> list[str]:
    """The names of `held` that `question` holds whole (no letter or digit beside them), in the
    order it first says them; where two overlap, the longer ("EMEA North" over "EMEA")."""
    taken: list[tuple[int, int, str]] = []
    for name in sorted(set(held), key=lambda n: (-len(n), n)):
        i = question.find(name) if name else -1
        while i >= 0:
            j = i + len(name)
            whole = (i == 0 or not question[i - 1].isalnum()) and (j == len(question) or not question[j].isalnum())
            if whole and all(j <= a or i >= b for a, b, _ in taken):
                taken.append((i, j, name))
            i = question.find(name, i + 1)
    return list(dict.fromkeys(n for _, _, n in sorted(taken)))


@dataclass
class AgentFacts:
    """One agent job's slot table: the question's names first, then each result as it comes (one
    slot per distinct text: a result equal to an earlier one points at the same slot)."""

    slots: Slots
    question: str  # the question in slot form: what the model reads

    @classmethod
    def of(cls, question: str, names: list[str], first: int = 0) -> AgentFacts:
        """names: source_names(question, what the source holds), as the job first found them (a
        rerun must find the same: a tenant's table may change meanwhile)."""
        slots = Slots(first=first, dedup=True)
        for n in names[:MAX_NAMES]:  # a question of more names keeps the rest as text (copied)
            slots.add(n)
        return cls(slots, slots.delexicalise(question) if slots.texts else question)

    def result(self, text: str) -> str:
        """A tool's result as the model reads it: a number's slot, or an error line with the
        names it quotes as their slots (the model mends a call from them)."""
        return self.slots.delexicalise(text) if text.startswith("error:") else self.slots.add(text)

    def written(self, text: str) -> str:
        """What the model wrote, its slots written out."""
        return self.slots.lexicalise(text)


def in_slots(task: Task, pieces: list[tuple[str, bool]], held: Iterable[str], first: int = 0
             ) -> tuple[AgentFacts, list[tuple[str, bool]]]:
    """A transcript (domain/agent.py transcript) in slot form, as the runtime would make it: the
    question's held names, then each result, take slots in turn; each call and the answer point at
    them (Slots.delexicalise)."""
    facts = AgentFacts.of(task.question, source_names(task.question, held), first)
    out: list[tuple[str, bool]] = []
    for text, given in pieces:
        if given and text.startswith(RESULT):
            result = text[len(RESULT):].removesuffix("\n").removesuffix(END_RESULT)
            out.append((f"{RESULT}{facts.result(result)}{END_RESULT}\n", True))
        else:
            out.append((facts.slots.delexicalise(text), given))
    return facts, out
