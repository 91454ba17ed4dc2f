"""A local policy that samples replies with their behaviour logprobs (transformers + peft).

It stands in for the serving engine where no vLLM runs (the learner's tests and
benchmarks): it returns exactly what a served turn logs, the sampled token ids and
log q(token) under the sampling distribution. Sampling uses top_k=0, top_p=1 so
that q is the plain softmax(logits / T); HF's default top_k=50 would skew it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class Sample:
    prompt_ids: list[int]
    output_ids: list[int]        # includes the stop token when the reply ended by itself
    logprobs: list[float]        # log q of each output token
    text: str
    finish_reason: str           # "stop" | "length"

    @property
    def tokens(self) -> int:
        """Completion tokens, the stop token included (what a server's usage reports)."""
        return len(self.output_ids)


class HFPolicy:
    def __init__(self, base_model: Path, adapter: Path | None = None, threads: int | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if threads:
            torch.set_num_threads(threads)
        self.tokenizer = AutoTokenizer.from_pretrained(base_model)
        model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
        if adapter is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, adapter)
        self.model = model.eval()
        self.eos_id = self.tokenizer.eos_token_id
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_id

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """The chat-templated prompt; a final assistant message is continued, as vLLM's
        ``continue_final_message`` does for a forced tool call's opening."""
        cont = bool(messages) and messages[-1].get("role") == "assistant"
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=not cont, continue_final_message=cont,
                                                 tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)

    def sample(self, prompts: list[list[dict]], n: int, max_new_tokens: int, temperature: float = 1.0,
               seed: int = 0) -> list[list[Sample]]:
        """`n` samples per prompt (a group sharing the prompt), in prompt order."""
        import torch

        torch.manual_seed(seed)
        ids = [self.prompt_ids(m) for m in prompts for _ in range(n)]
        width = max(len(x) for x in ids)
        inp = torch.full((len(ids), width), self.pad_id, dtype=torch.long)
        att = torch.zeros_like(inp)
        for i, x in enumerate(ids):  # left padding: generation continues from the right edge
            inp[i, width - len(x):] = torch.tensor(x)
            att[i, width - len(x):] = 1
        with torch.no_grad():
            out = self.model.generate(
                input_ids=inp, attention_mask=att, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                max_new_tokens=max_new_tokens, eos_token_id=self.eos_id, pad_token_id=self.pad_id,
                output_logits=True, return_dict_in_generate=True)
        new = out.sequences[:, width:]
        logits = torch.stack(out.logits, dim=1).float() / temperature
        lp = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        samples = []
        for i, x in enumerate(ids):
            toks = new[i].tolist()
            stop = toks.index(self.eos_id) + 1 if self.eos_id in toks else len(toks)
            out_ids = toks[:stop]
            samples.append(Sample(
                prompt_ids=x, output_ids=out_ids, logprobs=[round(v, 6) for v in lp[i, :stop].tolist()],
                text=self.tokenizer.decode(out_ids, skip_special_tokens=True),
                finish_reason="stop" if stop < len(toks) or (toks and toks[-1] == self.eos_id) else "length"))
        return [samples[i * n:(i + 1) * n] for i in range(len(prompts))]
