"""The held-back slice: conversations no learner trains on, so an off-policy estimate of a candidate
reads turns it never fit (its importance weights on trained turns would be inflated by the fit).

One predicate, used by both sides (the learner's "new turns" query excludes it, the estimate
selects it), so the two can never disagree. The unit is the conversation (tenant + trace id),
like the canary's: a session is held back whole. DuckDB's ``md5_number`` is stable across
processes and versions (``hash()`` is not), so a trace stays on its side forever.
"""

from __future__ import annotations

BUCKETS = 10_000


def held_back_sql(share: float, tenant: str = "t.tenant", trace_id: str = "t.trace_id") -> str:
    """SQL that is true for the ``share`` of conversations held back (false everywhere at 0)."""
    if not 0.0 <= share < 1.0:
        raise ValueError(f"holdout share {share!r} must be in [0, 1)")
    cut = int(round(share * BUCKETS))
    return f"(md5_number({tenant} || '/' || {trace_id}) % {BUCKETS}) < {cut}"


def held_back(tenant: str, trace_id: str, share: float) -> bool:
    """Is this conversation held back? The same predicate, evaluated by DuckDB (for tools and tests)."""
    import duckdb

    sql = held_back_sql(share, "$tenant", "$trace")
    return bool(duckdb.execute(f"SELECT {sql}", {"tenant": tenant, "trace": trace_id}).fetchone()[0])
