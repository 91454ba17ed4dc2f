"""tracerl.toml: what a user writes lands in the typed config, a mistake anywhere (a target's
override included) is an error that names the setting, at load time, not a crash deep in a stage,
and a target's effective settings are its entries merged over the global ones."""

import dataclasses
import json
import math
import subprocess
import sys
import tempfile
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.config import PER_TARGET, ConfigError, TracerlConfig, load_config
from pipelines.config.parse import _members


def _load(tmp_path: Path, text: str, **overrides):
    path = tmp_path / "tracerl.toml"
    path.write_text(text)
    return load_config(path, **overrides)


def test_settings_land_typed(tmp_path, monkeypatch):
    monkeypatch.delenv("TRACERL_HOME", raising=False)
    cfg = _load(tmp_path, f'home = "{tmp_path / "h"}"\n[kafka]\nbootstrap_servers = "k1:9092"\npartitions = 3\n'
                          '[gate]\nconfidence = 0.9\nn_bootstrap = 500\nmin_gain = 0\n'
                          '[gateway]\nupstreams = ["http://10.0.0.5:8000"]\n[serve]\nmax_loras = 2\n')
    assert cfg.home == tmp_path / "h" and cfg.kafka.bootstrap_servers == "k1:9092" and cfg.kafka.partitions == 3
    assert cfg.gate.confidence == 0.9 and cfg.gate.n_bootstrap == 500
    assert cfg.gate.min_gain == 0.0 and isinstance(cfg.gate.min_gain, float)  # an int where a float goes
    assert cfg.gateway.upstreams == ["http://10.0.0.5:8000"] and cfg.serve.max_loras == 2


def test_env_overrides_the_file_and_keyword_overrides_win(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACERL_HOME", str(tmp_path / "from-env"))
    assert _load(tmp_path, f'home = "{tmp_path / "from-file"}"\n').home == tmp_path / "from-env"
    assert _load(tmp_path, "", home=tmp_path / "kw").home == tmp_path / "kw"


@pytest.mark.parametrize("text, words", [
    ('[kafka]\nbootstrapservers = "x"\n', "unknown setting 'kafka.bootstrapservers'; known here: bootstrap_servers"),
    ('[serve]\nmax_loras = "four"\n', "serve.max_loras = 'four': expected int"),
    ('[gateway]\nport = 8400.5\n', "gateway.port = 8400.5: expected int | None"),
    ('[gate]\nreview = "yes"\n', "gate.review = 'yes': expected bool"),
    ('[gateway]\nupstreams = "http://x:8000"\n', "gateway.upstreams = 'http://x:8000': expected list[str]"),
    ('[serve]\nmax_lora_rank = 7\n', "serve.max_lora_rank=7 is not one vLLM accepts"),  # the section's own check
    ('[gate]\nconfidence = 1\n', "gate.confidence=1.0 must be in [0.5, 1)"),
    ("kafka = 3\n", "kafka = 3: expected a table"),
])
def test_a_wrong_setting_is_an_error_that_names_it(tmp_path, text, words):
    with pytest.raises(ValueError) as err:
        _load(tmp_path, text)
    assert words in str(err.value)


# -- every setting, any mistake: hypothesis over the whole tree ------------------------------------

def _leaves(cls=TracerlConfig, prefix=()):
    """(path, annotation) of every setting, and the path of every table, under ``cls``."""
    leaves, tables = [], [prefix]
    for f in dataclasses.fields(cls):
        if prefix == () and f.name == "targets":
            continue
        tp = typing.get_type_hints(cls, include_extras=True)[f.name]
        classes = [m for m in _members(tp) if dataclasses.is_dataclass(m)]
        if len(classes) == 1:
            sub_leaves, sub_tables = _leaves(classes[0], prefix + (f.name,))
            leaves += sub_leaves
            tables += sub_tables
        else:  # a scalar, list or dict setting, or the objective union (its default, policy gradient)
            leaves.append((prefix + (f.name,), tp))
            if classes:
                sub_leaves, sub_tables = _leaves(classes[0], prefix + (f.name,))
                leaves += sub_leaves
                tables += sub_tables
    return leaves, tables


LEAVES, TABLES = _leaves()
PER_TARGET_LEAVES = [(p, tp) for p, tp in LEAVES if p[0] in PER_TARGET
                     and p != ("train", "base_model")]


def _nest(path, value):
    for key in reversed(path):
        value = {key: value}
    return value


def _wrong(tp):
    """A TOML value no annotation of this kind accepts: a table for scalars and lists, a number
    for tables and the objective union."""
    members = _members(tp)
    takes_table = any(dataclasses.is_dataclass(m) or m is dict or typing.get_origin(m) is dict for m in members)
    return 3 if takes_table else {"oops": 1}


known_name = st.from_regex(r"[a-z][a-z0-9_]{0,14}", fullmatch=True)


@given(st.sampled_from(TABLES), known_name)
def test_an_unknown_key_anywhere_is_an_error_naming_its_path(table, key):
    cls = TracerlConfig
    for name in table:  # the dataclass at that table
        cls = next(m for m in _members(typing.get_type_hints(cls)[name]) if dataclasses.is_dataclass(m))
    if key in {f.name for f in dataclasses.fields(cls)}:
        return
    dotted = ".".join(table + (key,))
    with pytest.raises(ConfigError) as err:
        TracerlConfig.from_dict(_nest(table + (key,), 1), "tracerl.toml")
    assert f"tracerl.toml: unknown setting '{dotted}'; known here: " in str(err.value)
    assert all(f.name in str(err.value) for f in dataclasses.fields(cls))


@given(st.sampled_from(LEAVES))
def test_a_wrong_type_anywhere_is_an_error_naming_its_path(leaf):
    path, tp = leaf
    with pytest.raises(ConfigError) as err:
        TracerlConfig.from_dict(_nest(path, _wrong(tp)), "tracerl.toml")
    assert f"tracerl.toml: {'.'.join(path)} = " in str(err.value)


@given(st.sampled_from(PER_TARGET_LEAVES), known_name, st.sampled_from(["acme", "acme/concise"]))
def test_mistakes_in_a_target_entry_name_the_target_and_the_path(leaf, key, target):
    path, tp = leaf
    with pytest.raises(ConfigError) as err:
        TracerlConfig.from_dict({"targets": {target: _nest(path, _wrong(tp))}}, "tracerl.toml")
    assert f'tracerl.toml: targets."{target}": {".".join(path)} = ' in str(err.value)
    if key not in {p[-1] for p, _ in LEAVES}:
        with pytest.raises(ConfigError) as err:
            TracerlConfig.from_dict({"targets": {target: _nest(path[:-1] + (key,), 1)}}, "tracerl.toml")
        assert f'targets."{target}": unknown setting \'{".".join(path[:-1] + (key,))}\'' in str(err.value)


def _toml(data, table=()):
    """A minimal TOML writer for to_dict() output (None values are defaults: left out)."""
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
        if isinstance(v, (int, str)):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items() if x is not None) + "}"
    nested = {k: v for k, v in data.items() if isinstance(v, dict) and any(isinstance(x, dict) for x in v.values())}
    inline = [f"{json.dumps(k)} = {value(v)}" for k, v in data.items() if k not in nested and v is not None]
    header = [f"[{'.'.join(json.dumps(t) for t in table)}]"] if table and inline else []
    return "\n".join(header + inline + [_toml(v, table + (k,)) for k, v in nested.items()])


objectives = st.one_of(
    st.builds(dict, kind=st.just("policy_gradient"), correction=st.sampled_from(["tis", "cispo", "mis"]),
              kl_coef=st.floats(0, 1), advantage_norm=st.sampled_from(["batch", "group", "none"])),
    st.builds(dict, kind=st.just("kto"), beta=st.floats(0.01, 1), desirable_weight=st.floats(0.1, 4)))
configs = st.fixed_dictionaries({
    "kafka": st.fixed_dictionaries({"topic": st.text("abcxyz.-_", min_size=1, max_size=12),
                                    "partitions": st.integers(1, 64)}),
    "ingest": st.fixed_dictionaries({"topic_tenants": st.dictionaries(st.text("abc.", min_size=1, max_size=5),
                                                                      st.sampled_from(["acme", "globex"]))}),
    "learner": st.fixed_dictionaries({"branch": st.booleans(), "replay_half_life": st.floats(0.1, 10)}),
    "train": st.fixed_dictionaries({
        "objective": objectives, "seed": st.integers(0, 2**31),
        "optimizer": st.fixed_dictionaries({"lr": st.floats(1e-6, 1e-2), "betas": st.tuples(
            st.floats(0, 0.99), st.floats(0, 0.999))}),
        "lora": st.fixed_dictionaries({"r": st.sampled_from([1, 8, 16]),
                                       "target_modules": st.lists(st.sampled_from(["q_proj", "v_proj"]), min_size=1)})}),
    "gate": st.fixed_dictionaries({"max_looks": st.integers(1, 6), "review": st.booleans(),
                                   "signatures": st.fixed_dictionaries({"clarify": st.floats(0, 0.99)})}),
    "gateway": st.fixed_dictionaries({"upstreams": st.lists(st.just("http://10.0.0.1:8000"), max_size=2)}),
    "reward": st.fixed_dictionaries({"spec": st.sampled_from(["/srv/rewards.toml", "/etc/r.toml"])}),
    "targets": st.dictionaries(st.sampled_from(["acme", "acme/concise", "globex/sql"]), st.fixed_dictionaries({
        "train": st.fixed_dictionaries({"optimizer": st.fixed_dictionaries({"lr": st.floats(1e-6, 1e-2)}),
                                        "objective": objectives}),
        "gate": st.fixed_dictionaries({"min_gain": st.floats(0, 0.5)})}), max_size=3),
})


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(configs)
def test_to_dict_round_trips_through_a_tracerl_toml(monkeypatch, data):
    for name in ("TRACERL_HOME", "TRACERL_LAKE", "TRACERL_KAFKA_BOOTSTRAP", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    cfg = TracerlConfig.from_dict(data)
    assert TracerlConfig.from_dict(cfg.to_dict()) == cfg
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tracerl.toml"
        path.write_text(_toml(cfg.to_dict()))
        assert load_config(path) == cfg
    for key in cfg.targets:  # and a target's effective settings are a config of their own
        tenant, _, task = key.partition("/")
        eff = cfg.for_target(tenant, task or None)
        assert TracerlConfig.from_dict(eff.to_dict()) == eff


# -- per-target settings ---------------------------------------------------------------------------

TARGETS = '''
[train.optimizer]
lr = 1e-4
[train.objective]
kind = "kto"
beta = 0.2
[targets."acme".gate]
min_gain = 0.02
[targets."acme".train.optimizer]
lr = 3e-4
[targets."acme/concise".train.optimizer]
lr = 1e-3
[targets."acme/concise".train.objective]
kind = "policy_gradient"
kl_coef = 0.05
[targets."acme/concise".learner]
min_new_turns = 8
'''


def test_for_target_merges_task_over_tenant_over_global(tmp_path):
    cfg = _load(tmp_path, TARGETS)
    concise, other, globex = cfg.for_target("acme", "concise"), cfg.for_target("acme", "other"), cfg.for_target("globex", "x")
    assert (concise.train.optimizer.lr, other.train.optimizer.lr, globex.train.optimizer.lr) == (1e-3, 3e-4, 1e-4)
    assert concise.gate.min_gain == other.gate.min_gain == 0.02 and globex.gate.min_gain == 0.0
    assert concise.learner.min_new_turns == 8 and other.learner.min_new_turns == 32
    # a different objective kind replaces the table whole (KTO's beta means nothing to policy gradient)
    assert concise.train.objective.kind == "policy_gradient" and concise.train.objective.kl_coef == 0.05
    assert other.train.objective.kind == "kto" and other.train.objective.beta == 0.2
    assert concise.train.optimizer.steps_per_iteration == cfg.train.optimizer.steps_per_iteration  # merged, not replaced
    assert globex is cfg and cfg.train.optimizer.lr == 1e-4  # no entry: the config itself, untouched
    assert concise.for_target("acme", "concise") == concise  # asking again changes nothing
    cfg.learner.max_turns = 64  # an in-code tweak of the global settings reaches every target
    assert cfg.for_target("acme", "concise").learner.max_turns == 64


@pytest.mark.parametrize("text, words", [
    ('[targets."acme".kafka]\ntopic = "x"\n', 'targets."acme": kafka cannot be set per target'),
    ('[targets."acme".train]\nbase_model = "tiny"\n', 'targets."acme".train.base_model: one base model serves every'),
    ('[targets."acme/a/b".gate]\nreview = true\n', 'targets."acme/a/b": expected "<tenant>" or "<tenant>/<task>"'),
    ('[targets."acme".gate]\nconfidence = 2\n', 'targets."acme": gate.confidence=2.0 must be in [0.5, 1)'),
    ('[targets."acme/x".train.lora]\nr = 32\n', 'targets."acme/x": train.lora.r=32 > serve.max_lora_rank=16'),
])
def test_a_bad_target_entry_fails_at_load(tmp_path, text, words):
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, text)
    assert words in str(err.value)


def test_reward_spec_paths_are_relative_to_the_file_and_env_and_keywords_layer(tmp_path, monkeypatch):
    monkeypatch.delenv("TRACERL_HOME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # earlier tests may export theirs (the error names every env layer)
    conf = tmp_path / "conf"
    conf.mkdir()
    cfg = _load(conf, '[reward]\nspec = "rewards.toml"\n[targets."acme".reward]\nspec = "sub/acme.toml"\n')
    assert cfg.reward.spec == str(conf / "rewards.toml")
    assert cfg.for_target("acme").reward.spec == str(conf / "sub" / "acme.toml")
    monkeypatch.setenv("TRACERL_KAFKA_BOOTSTRAP", "k9:9092")
    cfg = _load(tmp_path, "[kafka]\ntopic = \"t\"\n", gate={"review": True}, reward={"spec": "/x.toml"})
    assert (cfg.kafka.bootstrap_servers, cfg.kafka.topic, cfg.gate.review, cfg.reward.spec) == ("k9:9092", "t", True, "/x.toml")
    with pytest.raises(ConfigError, match=r"\$TRACERL_KAFKA_BOOTSTRAP, keyword overrides: gate.review = 'yes': expected bool"):
        _load(tmp_path, "", gate={"review": "yes"})


def test_the_configuration_imports_no_stage():
    code = ("import sys, pipelines.config; print(sorted(m for m in sys.modules if m.startswith('pipelines.') "
            "and not m.startswith(('pipelines.config', 'pipelines.contract'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "[]"
