"""The speculation-length policy: each round's k from measured round costs and the acceptance seen."""
