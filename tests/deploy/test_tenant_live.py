"""A tenant added while the stack runs: `tracerl tenant add` against a running gateway *process*
(in front of the boundary's tiny vLLM, real Kafka, MLflow store under the test's home) serves
the new tenant's first champion and its key works at once, no restart; `tenant list` shows it;
the deleted key file stops working, also without a restart."""

from __future__ import annotations

import re

import pytest

from tests.conftest import write_stack_toml
from tracerl.cli import main


@pytest.mark.slow
def test_a_tenant_added_while_the_gateway_runs_chats_at_once_and_a_deleted_key_stops(
        boundary, broker, tmp_path, monkeypatch, capsys):
    from pipelines.config import load_config
    from pipelines.deploy.service import GatewayClient, GatewayError, start_gateway, stop_gateway
    from pipelines.services.kafka import ensure_topic

    toml = write_stack_toml(tmp_path, broker.bootstrap, "tenants", f"""
[train]
base_model = "{boundary.root / 'tiny'}"
[gateway]
port = 0
upstreams = ["{boundary.vllm}"]
[gate]
suites_dir = "{tmp_path / 'evals'}"
""")
    monkeypatch.setenv("TRACERL_CONFIG", str(toml))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = load_config(toml)
    ensure_topic(cfg)
    gw = start_gateway(cfg, config_path=str(toml))  # started before the tenant exists
    try:
        assert main(["--config", str(toml), "tenant", "add", "newco", "--task", "support"]) == 0
        out = capsys.readouterr().out
        key = re.search(r"^  ([0-9a-f]{48})$", out, re.M).group(1)
        assert "newco/support: champion v1 (the base model) serving through the gateway" in out

        client = GatewayClient(gw.url, key)
        reply = client.chat("support", [{"role": "user", "content": "Hello there."}], max_tokens=4)
        assert reply["tracerl"]["adapter_version"] == 1 and reply["model"] == "support"

        assert main(["--config", str(toml), "tenant", "list"]) == 0
        rows = [line.split() for line in capsys.readouterr().out.splitlines()]
        assert ["newco", "support", "v1", "v1", "file", "3", "items", "(3", "placeholders)"] in rows

        (cfg.home / "gateway" / "keys" / "newco.key").unlink()  # revoked by hand: no command, no restart
        with pytest.raises(GatewayError, match="HTTP 401"):
            client.chat("support", [{"role": "user", "content": "Still there?"}], max_tokens=4)

        # a key again (a new one): works at once, the old one stays refused
        assert main(["--config", str(toml), "tenant", "add", "newco", "--task", "faq", "--no-serve"]) == 0
        new_key = re.search(r"^  ([0-9a-f]{48})$", capsys.readouterr().out, re.M).group(1)
        assert new_key != key
        assert GatewayClient(gw.url, new_key).chat("support", [{"role": "user", "content": "Hi."}],
                                                   max_tokens=2)["tracerl"]["adapter_version"] == 1
        with pytest.raises(GatewayError, match="HTTP 401"):
            client.chat("support", [{"role": "user", "content": "Me again."}], max_tokens=2)
    finally:
        stop_gateway(cfg)
