"""``[learner]``: when and on what the learner runs (the how is ``[train]``)."""

from __future__ import annotations

from typing import Literal

from pydantic.dataclasses import dataclass

from pipelines.config.parse import SECTION


@dataclass(config=SECTION)
class LearnerConfig:
    """When and on what the learner runs (the how is `TrainConfig`)."""

    min_new_turns: int = 32              # fewer new settled turns: skip, no empty run (replay never triggers one)
    max_turns: int = 256                 # new turns per iteration (oldest first)
    # Training branch (docs/learning.md): while the gate rejects candidates, the next one continues
    # from the last (adapter + AdamW state + reward baselines), not from the unchanged champion.
    branch: bool = True                  # False: every candidate starts from the champion (no memory)
    branch_max_kl: float = 0.3           # head's last-step KL to the base above this: reset to the
                                         # champion; the gate rejects above gate.max_kl=0.5, so reset first
    branch_max_depth: int = 8            # this many unpromoted candidates in a row: reset (a branch the
                                         # gate keeps rejecting is drifting, not converging)
    # Replay (docs/learning.md): settled turns of earlier iterations train again, rare outcomes first.
    replay_turns: int = 256              # replayed turns per iteration at most (0: no replay); = max_turns,
                                         # so a batch is at most half old data
    replay_max_uses: int = 4             # a turn trains at most this many times (1 = first use only): a
                                         # 2% positive gets 4 gradient contributions, not 1, without overfitting it
    replay_half_life: float = 2.0        # weight 0.5 ** (age / half_life), age in learner iterations since
                                         # first use: the policy moved on, old evidence counts less
    replay_min_weight: float = 0.1       # below this weight a turn leaves the pool (age > ~6.6 at half-life 2)
    # The reward model (pipelines/reward/model.py, docs/learning.md): a probe fitted each iteration on
    # the target's labelled turns labels the unlabelled ones it is confident about. Off until its
    # proof under realistic users lands (issue #41).
    reward_model: bool = False
    reward_model_window: int = 2000      # the most recent labelled turns it is fitted on
    reward_model_min_auroc: float = 0.65  # refused below this AUROC on held-out explicit votes
    reward_model_min_confidence: float = 0.5  # a prediction labels a turn only at |2p - 1| >= this
    reward_model_labels: Literal["liked", "both"] = "liked"  # which predictions label a turn: "liked" only
                                         # (real labels under realistic users are ~all negative: the model's
                                         # -1s added nothing but KL, measured in docs/learning.md) or both signs
    reward_model_silence_weight: float = 0.0  # silent settled turns (no signal at all) fit as liked at this
                                         # weight (positive-unlabelled); 0: off. Measured on the tiny model's
                                         # style traffic, 0.003 lowered held-out AUROC 0.94 -> 0.88: silence
                                         # is ~as often after a disliked reply as a liked one (docs/learning.md)

    def __post_init__(self) -> None:
        for name in ("min_new_turns", "max_turns", "branch_max_depth", "replay_max_uses"):
            if getattr(self, name) < 1:
                raise ValueError(f"learner.{name}={getattr(self, name)!r} must be >= 1")
        if self.replay_turns < 0:
            raise ValueError(f"learner.replay_turns={self.replay_turns!r} must be >= 0 (0 turns replay off)")
        if not self.branch_max_kl > 0:
            raise ValueError(f"learner.branch_max_kl={self.branch_max_kl!r} must be > 0 (KL is >= 0; "
                             f"use a large value to never reset on KL)")
        if not self.replay_half_life > 0:
            raise ValueError(f"learner.replay_half_life={self.replay_half_life!r} must be > 0 iterations")
        if not (self.reward_model_window >= 10 and 0.5 <= self.reward_model_min_auroc <= 1
                and 0 <= self.reward_model_min_confidence <= 1 and 0 <= self.reward_model_silence_weight <= 1):
            raise ValueError(f"learner.reward_model_*: window {self.reward_model_window!r} must be >= 10, "
                             f"min_auroc {self.reward_model_min_auroc!r} in [0.5, 1], "
                             f"min_confidence {self.reward_model_min_confidence!r} in [0, 1], "
                             f"silence_weight {self.reward_model_silence_weight!r} in [0, 1]")
        if not 0 < self.replay_min_weight <= 1:
            raise ValueError(f"learner.replay_min_weight={self.replay_min_weight!r} must be in (0, 1]")
