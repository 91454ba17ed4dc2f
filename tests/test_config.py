"""tracerl.toml: what a user writes lands in the typed config, and a mistake is an error that
names the setting, at load time, not a crash deep in a stage."""

from pathlib import Path

import pytest

from pipelines.config import load_config


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
