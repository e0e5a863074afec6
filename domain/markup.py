"""The control tokens' text: setflow's vocabularies hold each as one id (model/tokenizer.py).
Free text that spells one is refused at the edge (runtime/jobs/specs.py), and a checker counts
one written into a product's text as a problem."""

from __future__ import annotations

# setflow's own vocabularies put these first, in this order (model/config.py: their default ids)
SPECIAL_TOKENS = ("[PAD]", "[MASK]", "[BOS]", "[EOS]")
# markup the workflows emit and parse; each is one id, right after the special tokens
MARKUP_TOKENS = ("<call>", "</call>", "<result>", "</result>", "<section>", "</section>", "<hole>")
# fact slots: a job's facts enter the model's input as these, and the model writes them where a
# fact goes (domain/facts.py); enough for a payload of 8 metrics and 12 breakdown rows and a title
N_SLOTS = 96
SLOT_TOKENS = tuple(f"[F{i}]" for i in range(1, N_SLOTS + 1))
