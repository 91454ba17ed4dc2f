"""``[judge]``: a rubric judge, one more reward signal, optional per tenant/task (pipelines/reward/judge.py).

Off until a rubric is written. The judge is never trusted blindly: it scores the target's voted
turns too, and labels unlabelled turns only where its verdicts agree with the votes.
"""

from __future__ import annotations

from pydantic.dataclasses import dataclass

from pipelines.config.parse import SECTION


@dataclass(config=SECTION)
class JudgeConfig:
    """The rubric, the endpoint, and the bounds of one learner iteration's judging."""

    rubric: str = ""                   # what the tenant wants, in their words; "" = judging off
    url: str = ""                      # OpenAI-compatible base URL, with or without /v1; "" = the embedded
                                       #   vLLM serving the base model, else gateway.upstreams[0]
    model: str = ""                    # the "model" sent; "" = serve.served_model_name (the base model)
    api_key_env: str = "TRACERL_JUDGE_API_KEY"  # env var holding url's key, if any (sent as a bearer token;
                                       #   the gate's llm_judge reads the same one by default)
    max_calls: int = 256               # uncached judge calls per iteration, voted and unlabelled turns together
    batch_size: int = 8                # requests in flight at once (the server batches them)
    timeout_s: float = 30.0            # per call, connect to last byte; a down or hanging endpoint
                                       #   stops the iteration's judging after batch_size failures in a row
    max_rubric_chars: int = 8000       # a longer rubric is refused (not sent), and the run says so
    max_turn_chars: int = 6000         # the conversation and reply shown to the judge are cut to this
    max_votes: int = 200               # the most recent voted turns it is calibrated on
    min_votes: int = 10                # judged votes needed of each class (liked, disliked) to calibrate
    min_auroc: float = 0.65            # refused below this AUROC of its verdicts against the votes

    def __post_init__(self) -> None:
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"judge.url={self.url!r} must start with http:// or https:// "
                             f"(or be \"\" for the served base model)")
        if self.max_calls < 0:
            raise ValueError(f"judge.max_calls={self.max_calls!r} must be >= 0 (0: cached verdicts only)")
        if not 1 <= self.batch_size <= 256:
            raise ValueError(f"judge.batch_size={self.batch_size!r} must be in 1..256 requests in flight")
        if not 0 < self.timeout_s <= 600:
            raise ValueError(f"judge.timeout_s={self.timeout_s!r} must be in (0, 600] seconds")
        for name in ("max_rubric_chars", "max_votes", "min_votes"):
            if getattr(self, name) < 1:
                raise ValueError(f"judge.{name}={getattr(self, name)!r} must be >= 1")
        if self.max_turn_chars < 200:
            raise ValueError(f"judge.max_turn_chars={self.max_turn_chars!r} must be >= 200 characters")
        if self.max_votes < 2 * self.min_votes:
            raise ValueError(f"judge.max_votes={self.max_votes!r} < 2 x judge.min_votes={self.min_votes!r}: "
                             f"it could never calibrate; raise max_votes or lower min_votes")
        if not 0.5 <= self.min_auroc <= 1:
            raise ValueError(f"judge.min_auroc={self.min_auroc!r} must be in [0.5, 1] (0.5 = chance)")
