"""The round layer: what one speculative round computes (``fixed_round.py``: propose, score, verify,
commit), its proposers (``proposers.py``), the logits processors in the round's form (``logits/``) and
the speculation-length policy that picks each round's k (``policy/``)."""
