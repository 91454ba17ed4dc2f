"""The learner: small incremental RL steps on LoRA adapters.

Its settings are ``pipelines.config.train`` (torch-free: parse and validate anywhere); ``losses``
holds the pure loss functions and imports torch, so only the learner process imports it.
"""
