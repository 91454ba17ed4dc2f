"""The gate's contamination check reads what the lineage actually trained on: the lake's
trained_turns ledger joined to the turns' input messages."""

from pipelines.config import TracerlConfig
from pipelines.contract.events import Message, ModelTurn
from pipelines.evals.contamination import find_contamination, hashes_of, trained_prompts
from pipelines.evals.suites import Item, Suite
from pipelines.evals.scorers import Exact
from pipelines.lake.ledger import record_ledger
from tests.reward.reward_lake import ENV, at, land


def test_trained_prompts_follow_the_ledger_of_the_given_versions(tmp_path):
    cfg = TracerlConfig(home=tmp_path / "home", lake_root=tmp_path / "lake")
    assert trained_prompts(cfg, "acme", "support", [1]) == []  # no lake, no ledger: nothing trained
    prompts = {"t1": "How many days are in a week?", "t2": "Unrelated question", "t3": "HOW many days are in a WEEK?"}
    land(cfg.lake, [ModelTurn(**ENV, turn_id=tid, turn_index=i, event_time=at(i), model="m", output_text="ok",
                              input_messages=[Message(role="user", content=text)])
                    for i, (tid, text) in enumerate(prompts.items())])
    record_ledger(cfg.table_store, "acme", "support", ["t1", "t2"], 1)
    record_ledger(cfg.table_store, "acme", "support", ["t3"], 2)
    suite = Suite("s", "primary", Exact(), [Item([{"role": "user", "content": "how many days are in a week?"}], "7")])
    v1 = trained_prompts(cfg, "acme", "support", [1])
    assert sorted(p[0]["content"] for p in v1) == ["How many days are in a week?", "Unrelated question"]
    assert len(find_contamination(v1, hashes_of([suite]))) == 1
    assert len(trained_prompts(cfg, "acme", "support", [1, 2])) == 3
    assert trained_prompts(cfg, "acme", "support", [3]) == [] and trained_prompts(cfg, "acme", "support", []) == []
