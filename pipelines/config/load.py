"""``load_config``: defaults, then ``tracerl.toml``, then environment variables, then keyword overrides."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pipelines.config.parse import ConfigError, merge, parse, plain
from pipelines.config.tracerl import TracerlConfig

# Environment variables that override one setting each (after the file, before keyword overrides).
ENV: dict[str, tuple[str, ...]] = {
    "TRACERL_HOME": ("home",),
    "TRACERL_LAKE": ("lake_root",),
    "TRACERL_TABLES_URI": ("tables", "uri"),
    "TRACERL_KAFKA_BOOTSTRAP": ("kafka", "bootstrap_servers"),
    "MLFLOW_TRACKING_URI": ("mlflow", "tracking_uri"),
}


def load_config(path: str | Path | None = None, **overrides: Any) -> TracerlConfig:
    """Defaults, then the TOML file, then env vars, then keyword overrides (later wins).

    ``path``: else ``$TRACERL_CONFIG``, else ``./tracerl.toml``; a missing file is fine.
    ``overrides`` are top-level settings; a table (``reward={"spec": p}``, ``gate=GateConfig()``)
    deep-merges like one in the file. Every layer is validated: an error names the setting and
    where it came from.
    """
    path = Path(path or os.environ.get("TRACERL_CONFIG") or "tracerl.toml")
    raw: dict[str, Any] = {}
    cfg = None
    if path.exists():
        try:
            raw = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
        _anchor_specs(raw, path.resolve().parent)
        cfg = parse(TracerlConfig, raw, str(path))
    later: dict[str, Any] = {}
    for name, keys in ENV.items():
        if os.environ.get(name):
            later = merge(later, _nested(keys, os.environ[name]))
    later = merge(later, plain(overrides))
    if cfg is not None and not later:
        return cfg
    names = [f"${n}" for n in ENV if os.environ.get(n)] + (["keyword overrides"] if overrides else [])
    return parse(TracerlConfig, merge(raw, later), f"{path if cfg else 'defaults'} + {', '.join(names)}")


def _nested(keys: tuple[str, ...], value: Any) -> dict[str, Any]:
    for key in reversed(keys):
        value = {key: value}
    return value


def _anchor_specs(raw: dict[str, Any], base: Path) -> None:
    """A relative ``reward.spec`` in a file is relative to that file's folder (the CLI and
    Dagster run in different working directories and must read the same spec)."""
    targets = raw.get("targets")
    entries = list(targets.values()) if isinstance(targets, dict) else []
    for table in [raw.get("reward")] + [e.get("reward") for e in entries if isinstance(e, dict)]:
        if isinstance(table, dict) and isinstance(table.get("spec"), str) and not Path(table["spec"]).is_absolute():
            table["spec"] = str(base / table["spec"])
