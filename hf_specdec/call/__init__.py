"""The call layer: one ``generate()`` call from its checked request to its output. ``generate.py`` builds
it; ``loop.py`` runs its rounds (admission, rounds, rows leaving and joining, host reads at each sync)."""
