"""The control tokens' text: setflow's vocabularies hold each as one id (model/tokenizer.py).
Free text that spells one is refused at the edge (runtime/jobs/specs.py), and a checker counts
one written into a product's text as a problem."""

from __future__ import annotations

# setflow's own vocabularies put these first, in this order (model/config.py: their default ids)
SPECIAL_TOKENS = ("[PAD]", "[MASK]", "[BOS]", "[EOS]")
# markup the workflows emit and parse; each is one id, right after the special tokens
MARKUP_TOKENS = ("<call>", "</call>", "<result>", "</result>", "<section>", "</section>", "<hole>")
