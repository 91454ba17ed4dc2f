"""The learner's settings live at the ground, in ``pipelines.config.train``; re-exported here so
the stage reads ``from pipelines.train.config import TrainConfig`` as before."""

from pipelines.config.train import (  # noqa: F401
    OBJECTIVES,
    VLLM_LORA_RANKS,
    KTOObjective,
    LoraSettings,
    Objective,
    OptimizerSettings,
    PolicyGradientObjective,
    StalenessSettings,
    TrainConfig,
    objective_from_dict,
)
