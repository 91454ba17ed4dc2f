"""Synthetic customer traffic: prompts, a hidden user preference, and a policy that serves them."""
