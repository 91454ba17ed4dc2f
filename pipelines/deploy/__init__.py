"""Serving: the embedded vLLM server and a client for its LoRA admin and completion API.

- :mod:`pipelines.deploy.vllm_server` starts/stops vLLM on 127.0.0.1 from its own virtualenv
  (``.venv-vllm``: vLLM pins its own transformers/numpy/setuptools), with runtime LoRA loading on.
- :mod:`pipelines.deploy.admin` talks to any vLLM 0.32 OpenAI server (ours or the user's) with
  the standard library only: load / unload adapters, list models, complete with token ids and
  per-token logprobs.

Nothing here imports torch or vllm: the server runs in another interpreter.
"""
