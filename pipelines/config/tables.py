"""``[tables]``: where the lake's Delta tables (``events``, ``quarantine``) live: the lake folder
on local disk (the default), or an S3-compatible object store, so that ingest workers on several
hosts append to one table (`pipelines/lake/delta.py`; S3 commits are safe at once through its
conditional writes, no lock service)."""

from __future__ import annotations

import os
from dataclasses import dataclass as plain_dataclass
from pathlib import Path

from pydantic.dataclasses import dataclass

from pipelines.config.parse import SECTION


@dataclass(config=SECTION)
class TablesConfig:
    """Unset ``uri``: the tables are folders of the lake root. Credentials are read from the
    environment variables named here (never from the file), as every AWS client does by default."""

    uri: str = ""                        # "" = <lake root>; "s3://bucket/prefix" = an S3-compatible store
    endpoint_url: str = ""               # "" = AWS itself; e.g. "http://minio:9000"
    region: str = ""                     # "" = $AWS_REGION, else us-east-1
    allow_http: bool = False             # a plain-HTTP endpoint (a store on a private network)
    access_key_id_env: str = "AWS_ACCESS_KEY_ID"
    secret_access_key_env: str = "AWS_SECRET_ACCESS_KEY"

    def __post_init__(self) -> None:
        if self.uri and not self.uri.startswith("s3://"):
            raise ValueError(f"tables.uri={self.uri!r}: expected s3://bucket[/prefix], or unset for the lake folder")
        if self.uri and not self.uri[len("s3://"):].strip("/"):
            raise ValueError("tables.uri='s3://' names no bucket")

    def store(self, lake_root: Path) -> "TableStore":
        if not self.uri:
            return TableStore(str(Path(lake_root).resolve()))
        options = {"AWS_REGION": self.region or os.environ.get("AWS_REGION") or "us-east-1"}
        if self.endpoint_url:
            options["AWS_ENDPOINT_URL"] = self.endpoint_url
        if self.allow_http:
            options["AWS_ALLOW_HTTP"] = "true"
        for key, env in (("AWS_ACCESS_KEY_ID", self.access_key_id_env),
                         ("AWS_SECRET_ACCESS_KEY", self.secret_access_key_env)):
            if os.environ.get(env):
                options[key] = os.environ[env]
        return TableStore(self.uri.rstrip("/"), tuple(sorted(options.items())))


@plain_dataclass(frozen=True)
class TableStore:
    """Where the tables are: a folder (``uri`` an absolute path) or an object store prefix, with
    the options delta-rs opens it with. One value per deployment: `TracerlConfig.table_store`."""

    uri: str
    options: tuple[tuple[str, str], ...] = ()

    @property
    def local(self) -> bool:
        return "://" not in self.uri

    @property
    def storage_options(self) -> dict[str, str] | None:
        return dict(self.options) or None

    def table_uri(self, dataset: str) -> str:
        return f"{self.uri}/{dataset}"
