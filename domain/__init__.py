"""What the product means, in plain Python (no torch, no I/O): the payload grammar, facts and
their slots, the checkers, the tools' semantics, and the corpora's templates and generators.
Imported by the model (its training data) and by the runtime and the workflows alike, so that
what the model learns and what the runtime checks cannot disagree."""
