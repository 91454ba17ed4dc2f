"""A small client for vLLM 0.32's OpenAI server: LoRA admin API and completions with logprobs.

Standard library only (urllib), so it runs in any venv and in Dagster resources without extra
dependencies. Works against our embedded server or a user's own vLLM started with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True --enable-lora``.

Endpoints (docs/measured.md, "vLLM 0.32 runtime LoRA"):
- ``POST /v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace"}``: 200 with a text
  body on success; 400 if the name is loaded and ``load_inplace`` is false; 404 if the path
  holds no adapter; 500 for an adapter the engine refuses (e.g. rank > --max-lora-rank).
- ``POST /v1/unload_lora_adapter {"lora_name"}``: 404 for an unknown name.
- ``GET /v1/models``: the base model and every loaded adapter (``root`` = its path).
- ``POST /v1/completions`` (``prompt``: text or token ids) and ``/v1/chat/completions``
  (``messages``), with ``return_token_ids`` for prompt/completion ids and logprobs of the
  sampled tokens. The server runs ``--logprobs-mode raw_logprobs``: log-softmax of the model's
  logits *before* temperature / top-p / top-k. They are the sampling distribution's logprobs
  only at temperature 1, top_p 1, top_k off (the defaults of :func:`complete`).

Errors raise :class:`VllmAdminError` with the HTTP status and vLLM's own message.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class VllmAdminError(RuntimeError):
    """A failed call: ``status`` is the HTTP status (None when the server was unreachable)."""

    def __init__(self, status: int | None, message: str, url: str):
        self.status, self.message, self.url = status, message, url
        where = f"HTTP {status}" if status is not None else "unreachable"
        super().__init__(f"vLLM {where} at {url}: {message}")


@dataclass
class Completion:
    text: str
    token_ids: list[int]           # sampled tokens, EOS included when the model stopped on it
    logprobs: list[float]          # raw logprob of each sampled token (see module docstring)
    prompt_token_ids: list[int]    # as the server tokenized (and chat-templated) the prompt
    finish_reason: str | None      # "stop" (EOS / stop string) or "length"
    model: str                     # base model name or adapter name that served it
    raw: dict[str, Any] = field(repr=False, default_factory=dict)
    prefix: str = ""               # a continued final assistant message's content (a forced call's opening)

    @property
    def reply(self) -> str:
        """The whole reply as an app reads it: the continued prefix, then what was sampled."""
        return self.prefix + self.text


def _call(method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 120.0) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read().decode()
    except urllib.error.HTTPError as e:
        raise VllmAdminError(e.code, _error_message(e.read().decode(errors="replace")), url) from None
    except (urllib.error.URLError, OSError) as e:  # refused, reset, timed out
        reason = getattr(e, "reason", e)
        raise VllmAdminError(None, f"{type(reason).__name__}: {reason}", url) from None
    try:
        return json.loads(raw)
    except ValueError:
        return raw  # the LoRA endpoints answer plain text on success


def _error_message(body: str) -> str:
    """vLLM's ``{"error": {"message", "type"}}``, FastAPI's ``{"detail"}``, or the raw body."""
    try:
        obj = json.loads(body)
    except ValueError:
        return body.strip()[:2000] or "(empty body)"
    if isinstance(obj, dict) and isinstance(obj.get("error"), dict):
        err = obj["error"]
        return f"{err.get('type', 'Error')}: {err.get('message', '')}".strip()
    if isinstance(obj, dict) and "detail" in obj:
        return json.dumps(obj["detail"])[:2000]
    return body.strip()[:2000]


def _url(base_url: str, path: str) -> str:
    return base_url.rstrip("/") + path


def load_adapter(base_url: str, name: str, path: str | Path, load_inplace: bool = False,
                 timeout: float = 120.0) -> str:
    """Load the PEFT adapter folder ``path`` under ``name``; return vLLM's success message.

    ``path`` is read by the server: an existing local relative path is made absolute.
    ``load_inplace=True`` replaces a loaded name (the engine loads first and swaps only on
    success). Use a new folder per version: a same-path reload can reuse stale prefix-cache
    blocks. Serialize loads: concurrent loads race in 0.32.
    """
    path = Path(path)
    if not path.is_absolute() and path.exists():
        path = path.resolve()
    body = {"lora_name": name, "lora_path": os.fspath(path), "load_inplace": bool(load_inplace)}
    return _call("POST", _url(base_url, "/v1/load_lora_adapter"), body, timeout)


def unload_adapter(base_url: str, name: str, timeout: float = 60.0) -> str:
    """Remove ``name`` from the served models. (0.32 keeps its weights in the CPU LRU cache.)"""
    return _call("POST", _url(base_url, "/v1/unload_lora_adapter"), {"lora_name": name}, timeout)


def list_models(base_url: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """``/v1/models`` entries: ``id`` (name to request), ``root`` (path), ``parent`` (base or None)."""
    return _call("GET", _url(base_url, "/v1/models"), None, timeout)["data"]


def complete(base_url: str, model: str, prompt: str | list[int] | None = None, *,
             messages: list[dict[str, str]] | None = None, max_tokens: int = 64,
             temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1, seed: int | None = None,
             logprobs: bool = True, return_token_ids: bool = True, stop: list[str] | None = None,
             timeout: float = 120.0, **extra: Any) -> Completion:
    """One completion from ``model`` (base name or adapter name).

    Give either ``prompt`` (text, or token ids to skip tokenization) for ``/v1/completions``,
    or chat ``messages`` for ``/v1/chat/completions`` (the server applies the chat template).
    Sampling defaults (temperature 1, top_p 1, top_k -1 = off) make the returned logprobs the
    true log-probabilities of the sampled tokens under the sampling distribution. ``extra``
    goes into the request body unchanged (any vLLM sampling parameter).

    Chat ``messages`` ending with an assistant message are continued, as the gateway serves a
    forced tool call (vLLM ``continue_final_message``): ``text`` and the tokens are what was
    sampled, ``prefix`` that message's content, and ``reply`` both.
    """
    if (prompt is None) == (messages is None):
        raise ValueError("complete() needs exactly one of prompt= (text or token ids) or messages=")
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": temperature,
                            "top_p": top_p, "top_k": top_k, "return_token_ids": return_token_ids,
                            **({"seed": seed} if seed is not None else {}),
                            **({"stop": stop} if stop else {}), **extra}
    prefix = ""
    if messages is not None:
        body.update(messages=messages, logprobs=bool(logprobs))
        if messages and messages[-1].get("role") == "assistant":
            prefix = messages[-1].get("content") or ""
            body.update(continue_final_message=True, add_generation_prompt=False)
        resp = _call("POST", _url(base_url, "/v1/chat/completions"), body, timeout)
        choice = resp["choices"][0]
        text = choice["message"].get("content") or ""
        lps = [t["logprob"] for t in (choice.get("logprobs") or {}).get("content") or []]
        prompt_ids = resp.get("prompt_token_ids") or []
    else:
        body["prompt"] = prompt
        if logprobs:
            body["logprobs"] = 0  # the sampled token's logprob only, no top-k alternatives
        resp = _call("POST", _url(base_url, "/v1/completions"), body, timeout)
        choice = resp["choices"][0]
        text = choice["text"]
        lps = list((choice.get("logprobs") or {}).get("token_logprobs") or [])
        prompt_ids = choice.get("prompt_token_ids") or []
    token_ids = list(choice.get("token_ids") or [])
    if logprobs and return_token_ids and len(lps) != len(token_ids):
        raise VllmAdminError(200, f"{len(lps)} logprobs for {len(token_ids)} tokens", base_url)
    return Completion(text=text, token_ids=token_ids, logprobs=[float(x) for x in lps],
                      prompt_token_ids=list(prompt_ids), finish_reason=choice.get("finish_reason"),
                      model=resp.get("model", model), raw=resp, prefix=prefix)
