import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.config.train import (
    KTOObjective,
    LoraSettings,
    OptimizerSettings,
    PolicyGradientObjective,
    StalenessSettings,
    TrainConfig,
    objective_from_dict,
)


def test_defaults_are_valid_and_round_trip():
    cfg = TrainConfig()
    assert cfg.lora.r == 16 and cfg.optimizer.lr == 5e-4
    assert isinstance(cfg.objective, PolicyGradientObjective)
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    kto = TrainConfig(objective=KTOObjective(beta=0.2))
    assert TrainConfig.from_dict(kto.to_dict()) == kto


@pytest.mark.parametrize("build, quoted", [
    (lambda: LoraSettings(r=12), "lora.r=12"),
    (lambda: LoraSettings(dropout=1.0), "lora.dropout=1.0"),
    (lambda: PolicyGradientObjective(correction="ppo"), "'ppo'"),
    (lambda: PolicyGradientObjective(tis_cap=0.5), "tis_cap=0.5"),
    (lambda: PolicyGradientObjective(mis_min=1.5), "mis_min=1.5"),
    (lambda: PolicyGradientObjective(kl_coef=-1.0), "kl_coef=-1.0"),
    (lambda: PolicyGradientObjective(group_min_size=1), "group_min_size=1"),
    (lambda: PolicyGradientObjective(uniform_groups="keep"), "'keep'"),
    (lambda: PolicyGradientObjective(positive_bc_coef=-0.5), "positive_bc_coef=-0.5"),
    (lambda: PolicyGradientObjective(positive_threshold=float("nan")), "positive_threshold=nan"),
    (lambda: KTOObjective(beta=0.0), "beta=0.0"),
    (lambda: OptimizerSettings(lr=0.5), "lr=0.5"),
    (lambda: OptimizerSettings(micro_batch_size=0), "micro_batch_size=0"),
    (lambda: StalenessSettings(mode="ignore"), "'ignore'"),
    (lambda: StalenessSettings(weight=0.0), "weight=0.0"),
])
def test_bad_values_are_rejected_with_the_value_quoted(build, quoted):
    with pytest.raises(ValueError) as err:
        build()
    assert quoted in str(err.value)


def test_from_dict_dispatches_on_kind_and_rejects_unknown_keys():
    assert isinstance(objective_from_dict({"kind": "kto", "beta": 0.3}), KTOObjective)
    cfg = TrainConfig.from_dict({"objective": {"correction": "cispo"}, "lora": {"r": 8}})
    assert cfg.objective.correction == "cispo" and cfg.lora.r == 8
    with pytest.raises(ValueError, match=r"unknown setting 'optimizer.learning_rate'; known here: betas, grad_clip, lr"):
        TrainConfig.from_dict({"optimizer": {"learning_rate": 1e-4}})
    with pytest.raises(ValueError, match="objective: kind = 'dpo': choose one of 'policy_gradient', 'kto'"):
        objective_from_dict({"kind": "dpo"})


def test_defaults_keep_rare_positives_and_long_branches():
    obj = PolicyGradientObjective()
    assert obj.uniform_groups == "task_baseline" and obj.positive_bc_coef == 0.0 and obj.positive_threshold == 0.0
    st = StalenessSettings()
    assert (st.max_versions_behind, st.mode, st.weight) == (8, "downweight", 0.5)
    # a learner 8 versions ahead of the champion still trains fully on its traffic; older: half
    assert [st.sample_weight(v) for v in (0, 8, 9, 50)] == [1.0, 1.0, 0.5, 0.5]
    cfg = TrainConfig.from_dict({"objective": {"uniform_groups": "drop", "positive_bc_coef": 0.5}})
    assert cfg.objective.uniform_groups == "drop" and cfg.objective.positive_bc_coef == 0.5


def test_staleness_weights():
    drop = StalenessSettings(max_versions_behind=2, mode="drop")
    assert [drop.sample_weight(v) for v in (0, 2, 3)] == [1.0, 1.0, 0.0]
    down = StalenessSettings(max_versions_behind=1, mode="downweight", weight=0.25)
    assert [down.sample_weight(v) for v in (1, 2)] == [1.0, 0.25]
    with pytest.raises(ValueError):
        drop.sample_weight(-1)


def test_lora_to_peft():
    peft_cfg = LoraSettings(r=8, alpha=16).to_peft()
    assert peft_cfg.r == 8 and peft_cfg.lora_alpha == 16
    assert set(peft_cfg.target_modules) == {"q_proj", "k_proj", "v_proj", "o_proj"}


def test_config_and_model_registry_do_not_import_torch():
    code = ("import sys, pipelines.config.train, pipelines.models; "
            "print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"
