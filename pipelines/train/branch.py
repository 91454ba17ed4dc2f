"""The training branch: where the next candidate trains from.

While the gate rejects candidates, retraining each from the unchanged champion throws the last
iteration away (its adapter, AdamW moments and reward baselines); a rare positive then teaches
once and is gone. A branch keeps that work: each candidate continues from the previous one, and
the gate compares the branch head with the champion as before.

- A candidate's adapter meta carries ``"branch": {"base", "depth", "parent", "reset_reason"}``:
  ``base`` = the champion adapter version it descends from (None = the base model), ``depth`` =
  its place in the branch (1 = trained from the champion), ``parent`` = what it trained from.
- The branch head = the newest adapter version whose ``branch.base`` is the current champion.
  None: a new branch starts at the champion. Once the head is promoted it IS the champion, and the
  next candidate starts a new branch from it.
- Reset (the next candidate starts at the champion, fresh AdamW and baselines) when the head
  drifted too far (its last-step KL to the base model > ``learner.branch_max_kl``), the branch is
  ``learner.branch_max_depth`` candidates deep, or the head's registry version was rejected for
  eval contamination or rolled back. ``learner.branch = false``: always start at the champion.
- Forgotten users (docs/privacy.md#adapters-trained-on-a-user): a version marked as trained on a
  forgotten user under ``privacy.on_forget = "retrain"`` (its ``store.FORGOTTEN`` mark, which
  `tracerl forget` puts on every version that trained on the user's turns and on their descendants)
  is never trained from: a marked head resets the branch, and a marked champion makes the next
  candidate start (depth 1, fresh AdamW) from the champion's newest unmarked ancestor, or from the
  base model when every ancestor is marked. Marks under ``"flag"`` change nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pipelines.adapters.store import FORGOTTEN, AdapterStore, AdapterVersion
from pipelines.train.optim_state import OPTIMIZER_FILE

# registry version tags that end a branch (written by pipelines/gate/run.py and promote.py)
CONTAMINATION_TAG, STATUS_TAG, ROLLED_BACK = "tracerl.gate.contamination", "tracerl.gate.status", "rolled_back"
CANARY_DECISION_TAG, CANARY_REASONS_TAG = "tracerl.canary.decision", "tracerl.canary.reasons"  # pipelines/canary/run.py


@dataclass(frozen=True)
class BranchPoint:
    """What the next candidate trains from, and why."""

    parent: AdapterVersion | None   # adapter to load (the head, or the champion; None = fresh LoRA)
    base: int | None                # champion adapter version the branch descends from (None = base model)
    depth: int                      # the new candidate's depth (1 = trained from the champion)
    reset_reason: str | None        # why the head was not continued (None: continued, or no head)

    @property
    def continues(self) -> bool:
        """True when training from the branch head: its AdamW state and baselines carry over."""
        return self.depth > 1

    @property
    def parent_version(self) -> int | None:
        return self.parent.version if self.parent is not None else None

    @property
    def optimizer_state(self) -> Path | None:
        """The head's saved AdamW state, when continuing and the head has one."""
        if not self.continues:
            return None
        path = self.parent.path / OPTIMIZER_FILE
        return path if path.is_file() else None

    @property
    def task_baselines(self) -> dict[str, float]:
        return dict(self.parent.meta.get("task_baselines") or {}) if self.continues else {}

    def meta(self) -> dict[str, Any]:
        return {"base": self.base, "depth": self.depth, "parent": self.parent_version,
                "reset_reason": self.reset_reason}

    def tags(self) -> dict[str, str]:
        """MLflow tags (learner run and registry version): strings, 'base'/'none' for None."""
        return {"tracerl.branch.base": "base" if self.base is None else str(self.base),
                "tracerl.branch.depth": str(self.depth),
                "tracerl.branch.parent": "base" if self.parent is None else str(self.parent.version),
                "tracerl.branch.reset_reason": self.reset_reason or "none"}


def branch_head(store: AdapterStore, tenant: str, task: str, champion: int | None) -> AdapterVersion | None:
    """The newest adapter version whose meta says it descends from ``champion``."""
    for av in reversed(store.list(tenant, task)):
        b = av.meta.get("branch")
        if isinstance(b, dict) and b.get("base") == champion and av.version != champion:
            return av
    return None


def reset_reason(head: AdapterVersion, registry_tags: dict[str, str], *, max_kl: float, max_depth: int) -> str | None:
    """Why ``head`` must not be continued, or None. ``registry_tags``: its registry version's tags."""
    if registry_tags.get(CONTAMINATION_TAG):
        return f"contamination: v{head.version} was rejected for training on eval items"
    if registry_tags.get(STATUS_TAG) == ROLLED_BACK:
        return f"rolled_back: v{head.version} was promoted, then rolled back"
    if registry_tags.get(CANARY_DECISION_TAG) == "rollback":
        return f"canary: v{head.version} was rolled back on live traffic ({registry_tags.get(CANARY_REASONS_TAG, '')})"
    kl = (head.meta.get("metrics") or {}).get("kl")
    if kl is not None and float(kl) > max_kl:
        return f"kl: v{head.version} last-step KL {float(kl):.4g} > learner.branch_max_kl={max_kl}"
    depth = int(head.meta["branch"].get("depth", 1))
    if depth >= max_depth:
        return f"depth: v{head.version} is candidate {depth} of its branch, learner.branch_max_depth={max_depth}"
    return None


def forgotten(av: AdapterVersion | None) -> str | None:
    """The forget request ids (comma-separated) whose ``retrain`` policy bars training from ``av``; None: none."""
    if av is None:
        return None
    marks = (av.meta.get("marks") or {}).get(FORGOTTEN) or {}
    ids = sorted(k for k, v in marks.items() if isinstance(v, dict) and v.get("policy") == "retrain")
    return ",".join(ids) or None


def clean_ancestor(store: AdapterStore, tenant: str, task: str, version: int) -> AdapterVersion | None:
    """The newest version of ``version``'s lineage (itself first) not barred by `forgotten`; None: the base model."""
    return next((av for av in store.lineage(tenant, task, version) if forgotten(av) is None), None)


def choose_parent(store: AdapterStore, tenant: str, task: str, champion: int | None, *, enabled: bool,
                  max_kl: float, max_depth: int,
                  registry_tags: Callable[[int], dict[str, str]]) -> BranchPoint:
    """Continue the branch head, or start (again) at the champion; ``registry_tags(adapter_version)``
    returns the tags of that adapter's registry version ({} if unregistered)."""
    champ = store.get(tenant, task, champion) if champion is not None else None
    if forgotten(champ):
        clean = clean_ancestor(store, tenant, task, champion)
        return BranchPoint(clean, champion, 1, f"forgotten: champion v{champion} trained on a forgotten user "
                                               f"(forget {forgotten(champ)}); from "
                                               f"{'v%d' % clean.version if clean else 'the base model'}")
    head = branch_head(store, tenant, task, champion)
    if head is not None and forgotten(head):
        return BranchPoint(champ, champion, 1, f"forgotten: v{head.version} trained on a forgotten user "
                                               f"(forget {forgotten(head)})")
    if head is None:
        return BranchPoint(champ, champion, 1, None)
    if not enabled:
        return BranchPoint(champ, champion, 1, "learner.branch = false")
    why = reset_reason(head, registry_tags(head.version), max_kl=max_kl, max_depth=max_depth)
    if why is not None:
        return BranchPoint(champ, champion, 1, why)
    return BranchPoint(head, champion, int(head.meta["branch"].get("depth", 1)) + 1, None)
