"""Private eval suites, their scorers and prompt hashing, and the contamination check.

The learner (never train on an eval prompt) and the gate (score candidates, re-check their
training data) both import this package, so neither imports the other.
"""
