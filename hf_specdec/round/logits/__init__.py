"""Hugging Face's logits processors and stopping criteria applied to a round's many positions."""
