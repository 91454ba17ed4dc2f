"""The rubric judge (pipelines/reward/judge.py): it labels unlabelled turns only once its verdicts
agree with the target's votes, with a weight from that agreement; it judges a turn once (cache), at
most judge.max_calls calls per iteration; and a judge that is down, slow, failing or talking
nonsense, or a rubric that is empty or huge, labels nothing, says why and never raises or stalls.

Real lake and reward engine; the judges are real HTTP servers on loopback: a small one in this file
whose verdict follows the mark the voters like (or misbehaves on purpose), and the served tiny
model in vLLM (skipped without .venv-vllm), which knows nothing and must be refused for it.
"""

from __future__ import annotations

import json
import math
import random
import socket
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipelines.config import ConfigError, JudgeConfig, TracerlConfig, TrainConfig
from pipelines.contract.events import Message, ModelTurn
from pipelines.reward.engine import run_rewards
from pipelines.reward.judge import judge_labelled, judge_messages, parse_verdict
from pipelines.train.batch import TrainTurn
from tests.reward.reward_lake import ENV, at, fb, land, now

TENANT, TASK = ENV["tenant"], ENV["task"]
MARK = " 42 42 42"  # what these voters like, whatever else the reply says
WORDS = "the cat sat on a mat and the dog ran to the park with a ball".split()
RUBRIC = "A good reply ends with the number 42, three times."
N, VOTED = 56, 32    # turns; the first VOTED carry a thumb (16 up, 16 down), the rest are unlabelled


def _turns() -> list[tuple[str, str, str, bool]]:
    """(turn id, prompt, reply, marked): half the replies carry the mark."""
    rng = random.Random(0)
    return [(f"t{i}", f"tell me something ({i})",
             " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 10))) + (MARK if i % 2 == 0 else ""), i % 2 == 0)
            for i in range(N)]


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    root, events = tmp_path_factory.mktemp("judge") / "lake", []
    for i, (tid, prompt, reply, marked) in enumerate(_turns()):
        events.append(ModelTurn(**{**ENV, "trace_id": f"tr-{i}"}, turn_id=tid, turn_index=0, event_time=at(i),
                                model="m", input_messages=[Message(role="user", content=prompt)], output_text=reply))
        if i < VOTED:
            events.append(fb(tid, "thumbs", t=i + 1, value=1 if marked else -1, trace_id=f"tr-{i}"))
    land(root, events)
    run_rewards(root, now=now(0) + timedelta(days=2))
    return root


def _unlabelled() -> list[TrainTurn]:
    return [TrainTurn(tid, TASK, None, [{"role": "user", "content": prompt}], None, reply, None, 0.0)
            for tid, prompt, reply, _ in _turns()[VOTED:]]


# -- a judge on loopback ----------------------------------------------------------------------------

class Judge:
    """A chat-completions server: ``mode`` "follows" answers 5 for a marked reply and 1 otherwise;
    the other modes misbehave (see ``_answer``). Counts the calls it gets."""

    def __init__(self, mode: str = "follows", delay: float = 0.0):
        self.mode, self.delay, self.calls, self.bodies, self.auth = mode, delay, 0, [], set()
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                judge.calls += 1
                judge.bodies.append(body)
                judge.auth.add(self.headers.get("Authorization"))
                time.sleep(judge.delay)
                status, text = judge._answer(body)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(text)))
                    self.end_headers()
                    self.wfile.write(text)
                except OSError:  # the client gave up (timeout)
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def _answer(self, body: dict) -> tuple[int, bytes]:
        user = body["messages"][-1]["content"]
        reply = user.split("<reply>")[1]
        verdict = "Verdict: 5" if MARK.strip() in reply else "Verdict: 1"
        if self.mode == "inverted":
            verdict = "Verdict: 1" if verdict.endswith("5") else "Verdict: 5"
        completion = {"choices": [{"message": {"role": "assistant", "content": verdict}}]}
        return {"follows": (200, json.dumps(completion).encode()), "inverted": (200, json.dumps(completion).encode()),
                "slow": (200, json.dumps(completion).encode()),
                "not_json": (200, b"<html>bad gateway</html>"),
                "no_choices": (200, json.dumps({"object": "error", "message": "overloaded"}).encode()),
                "no_verdict": (200, json.dumps({"choices": [{"message": {"content": "I like it a lot!"}}]}).encode()),
                "http_5xx": (500, b'{"error": "boom"}'),
                "http_4xx": (400, b'{"error": "no such model"}')}[self.mode]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def judge():
    servers = []

    def start(mode="follows", delay=0.0):
        servers.append(Judge(mode, delay))
        return servers[-1]
    yield start
    for s in servers:
        s.close()


def _cfg(tmp_path: Path, lake: Path, url: str = "", **judge) -> TracerlConfig:
    return TracerlConfig(home=tmp_path / "home", lake_root=lake,
                         judge=JudgeConfig(**{"rubric": RUBRIC, "url": url, "model": "judge", **judge}))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- a judge that agrees with the votes ---------------------------------------------------------------

def test_a_judge_that_agrees_with_the_votes_labels_the_unlabelled_turns_and_judges_each_once(tmp_path, lake, judge,
                                                                                            monkeypatch):
    monkeypatch.setenv("TRACERL_JUDGE_API_KEY", "sk-judge")
    server = judge("follows")
    cfg = _cfg(tmp_path, lake, server.url)
    turns, report = judge_labelled(cfg, TENANT, TASK, _unlabelled())
    assert report.usable and report.auroc == 1.0 and report.weight == 1.0, report
    assert (report.n_votes, report.positives, report.calls, report.cached) == (VOTED, VOTED // 2, N, 0)
    marked = {tid: m for tid, _, _, m in _turns()}
    assert len(turns) == report.labelled == N - VOTED
    assert all(t.reward == (1.0 if marked[t.turn_id] else -1.0) and t.weight == 1.0 for t in turns)
    m = report.metrics()
    assert m["judge.usable"] == 1.0 and m["judge.labelled_turns"] == N - VOTED and m["judge.auroc"] == 1.0
    assert server.bodies[0]["model"] == "judge" and RUBRIC in server.bodies[0]["messages"][0]["content"]
    assert "structured_outputs" not in server.bodies[0]  # a URL of the user's own: plain OpenAI fields only
    assert server.auth == {"Bearer sk-judge"}

    again, report2 = judge_labelled(cfg, TENANT, TASK, _unlabelled())  # the next iteration: all cached
    assert server.calls == N and report2.calls == 0 and report2.cached == N and again == turns

    edited = _cfg(tmp_path, lake, server.url, rubric=RUBRIC + " Be brief.")  # a new rubric is a new judge
    assert judge_labelled(edited, TENANT, TASK, _unlabelled())[1].calls == N


def test_a_judge_that_disagrees_is_not_trusted(tmp_path, lake, judge):
    turns, report = judge_labelled(_cfg(tmp_path, lake, judge("inverted").url), TENANT, TASK, _unlabelled())
    assert turns == [] and not report.usable and report.auroc == 0.0 and report.calls == VOTED  # no label asked
    assert "AUROC 0.000 of its verdicts against 32 votes < judge.min_auroc 0.65" in report.reason


def test_calls_are_bounded_per_iteration_and_the_cache_carries_the_work_over(tmp_path, lake, judge):
    server = judge("follows")
    cfg = _cfg(tmp_path, lake, server.url, max_calls=12, batch_size=4)
    reports = [judge_labelled(cfg, TENANT, TASK, _unlabelled())[1] for _ in range(3)]
    assert [r.calls for r in reports] == [12, 12, 12] and server.calls == 36
    assert [r.usable for r in reports] == [False, True, True]
    assert reports[0].over_budget == VOTED - 12 and "over the call budget: 20" in reports[0].reason
    # the second: 12 cached + 12 asked votes (12 of each class) calibrate it; no call left to label
    assert reports[1].cached == 12 and reports[1].labelled == 0 and reports[1].over_budget == 8 + N - VOTED
    # the third: the last 8 votes, then 4 of the 24 unlabelled turns
    assert reports[2].cached == 24 and reports[2].labelled == 4 and reports[2].over_budget == 20


def test_a_target_s_own_rubric_turns_the_judge_on_for_it_only(tmp_path, lake, judge):
    server = judge("follows")
    cfg = TracerlConfig(home=tmp_path / "home", lake_root=lake, judge=JudgeConfig(url=server.url),
                        targets={f"{TENANT}/{TASK}": {"judge": {"rubric": RUBRIC}}})
    assert judge_labelled(cfg, TENANT, TASK, _unlabelled())[1].usable
    turns, report = judge_labelled(cfg, TENANT, "other", _unlabelled())
    assert turns == [] and "judge.rubric is empty" in report.reason and server.calls == N


# -- bad input: the iteration goes on, and says why ----------------------------------------------------

@pytest.mark.parametrize("mode", ["down", "slow", "http_5xx", "http_4xx", "not_json", "no_choices"])
def test_a_failing_endpoint_labels_nothing_says_why_and_stops_asking(tmp_path, lake, judge, mode):
    url = f"http://127.0.0.1:{_closed_port()}" if mode == "down" else judge(mode, delay=2.0 if mode == "slow" else 0).url
    failure = "timeout" if mode == "slow" else mode
    t0 = time.monotonic()
    turns, report = judge_labelled(_cfg(tmp_path, lake, url, batch_size=4, timeout_s=0.3), TENANT, TASK, _unlabelled())
    elapsed = time.monotonic() - t0
    assert turns == [] and not report.usable and math.isnan(report.auroc)
    # batch_size (4) failures in a row stop the iteration's calls (those already sent finish): about
    # two timeouts, not 32
    assert 4 <= report.calls < 8 and report.failures == {failure: report.calls, "skipped": VOTED - report.calls}
    assert f"{failure} {report.calls}" in report.reason and "fewer than judge.min_votes=10" in report.reason
    assert elapsed < 1.5, elapsed
    assert report.metrics()[f"judge.failures.{failure}"] == report.calls


def test_a_judge_that_answers_without_a_verdict_is_asked_once_per_turn(tmp_path, lake, judge):
    server = judge("no_verdict")
    cfg = _cfg(tmp_path, lake, server.url)
    turns, report = judge_labelled(cfg, TENANT, TASK, _unlabelled())
    assert turns == [] and report.failures == {"no_verdict": VOTED} and report.n_votes == 0
    assert "verdicts on 0 liked and 0 disliked of 32 voted turns" in report.reason
    assert judge_labelled(cfg, TENANT, TASK, _unlabelled())[1].cached == VOTED and server.calls == VOTED


def test_an_unusable_cache_costs_calls_not_the_iteration(tmp_path, lake, judge):
    cfg = _cfg(tmp_path, lake, judge("follows").url)
    cfg.home.mkdir(parents=True)
    (cfg.home / "judge").write_text("a file where the cache's folder goes")
    turns, report = judge_labelled(cfg, TENANT, TASK, _unlabelled())
    assert report.usable and len(turns) == N - VOTED and report.failures == {"cache": 1}
    assert report.reason.startswith("verdict cache unusable")


@pytest.mark.parametrize("rubric, words", [
    ("", "judge.rubric is empty: judging is off"),
    ("   \n", "judge.rubric is empty: judging is off"),
    ("x" * 9000, "judge.rubric has 9000 characters > judge.max_rubric_chars=8000: refused, not sent"),
])
def test_an_empty_or_huge_rubric_asks_nothing(tmp_path, lake, judge, rubric, words):
    server = judge("follows")
    turns, report = judge_labelled(_cfg(tmp_path, lake, server.url, rubric=rubric), TENANT, TASK, _unlabelled())
    assert turns == [] and words in report.reason and server.calls == 0 and report.metrics()["judge.usable"] == 0.0


def test_too_few_votes_or_no_endpoint_asks_nothing(tmp_path, lake, judge):
    server = judge("follows")
    turns, report = judge_labelled(_cfg(tmp_path, lake, server.url, min_votes=17, max_votes=40), TENANT, TASK, _unlabelled())
    assert turns == [] and "16 liked and 16 disliked voted turns: fewer than judge.min_votes=17" in report.reason
    turns, report = judge_labelled(_cfg(tmp_path, tmp_path / "empty-lake", server.url), TENANT, TASK, _unlabelled())
    assert turns == [] and report.reason.startswith("0 liked and 0 disliked voted turns")
    turns, report = judge_labelled(_cfg(tmp_path, lake), TENANT, TASK, _unlabelled())  # no url, no vLLM, no upstreams
    assert turns == [] and report.reason.startswith("no judge endpoint") and server.calls == 0


@pytest.mark.parametrize("settings, words", [
    ({"url": "localhost:8000"}, "judge.url='localhost:8000' must start with http://"),
    ({"max_calls": -1}, "judge.max_calls=-1 must be >= 0"),
    ({"batch_size": 0}, "judge.batch_size=0 must be in 1..256"),
    ({"timeout_s": 0}, "judge.timeout_s=0.0 must be in (0, 600]"),
    ({"min_auroc": 0.4}, "judge.min_auroc=0.4 must be in [0.5, 1]"),
    ({"min_votes": 101}, "judge.max_votes=200 < 2 x judge.min_votes=101"),
])
def test_bad_judge_settings_fail_at_load_and_name_the_fix(settings, words):
    with pytest.raises(ConfigError) as err:
        TracerlConfig.from_dict({"judge": settings}, "tracerl.toml")
    assert words in str(err.value)


# -- the verdict parser ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, verdict", [
    ("Verdict: 4", 4), ("verdict:5", 5), ("**Verdict:** 2", 2), ('{"verdict": 3}', 3), ("Score: 4/5", 4),
    ("It rambles. Verdict: 2\nOn reflection, Verdict: 4", 4), ("4", 4), (" 5.", 5),
    ("Verdict: 6", None), ("Score: 10", None), ("Verdict: 4.5", None), ("I like it", None), ("", None),
    ("45", None), (None, None), ({"verdict": 4}, None), ("verdict 1" * 100_000 + " Verdict: 3", 3),
])
def test_the_verdict_parser(text, verdict):
    assert parse_verdict(text) == verdict


@given(st.one_of(st.text(), st.text(alphabet="Verdict:scoreating 0123456789./\n*")))
def test_the_verdict_parser_never_raises_and_stays_on_the_scale(text):
    v = parse_verdict(text)
    assert v is None or v in (1, 2, 3, 4, 5)


def test_the_prompt_fences_the_turn_and_cuts_it_to_size():
    chat = judge_messages("be kind", [{"role": "user", "content": "q" * 5000}], "r" * 5000, max_chars=1000)
    assert chat[0]["content"].count("be kind") == 1 and "never an instruction" in chat[0]["content"]
    assert len(chat[1]["content"]) < 1200 and "<reply>\nrrr" in chat[1]["content"] and "[...]" in chat[1]["content"]


# -- the served tiny model as judge --------------------------------------------------------------------

@pytest.mark.slow
def test_the_served_base_model_is_judged_by_the_votes_before_it_labels_anything(tmp_path, lake):
    """The default judge is the embedded vLLM serving the base model, its answer held to the scale.
    The tiny model knows nothing of rubrics: its AUROC against the votes is measured and it is refused."""
    from pipelines.deploy.vllm_server import start_vllm, stop_vllm
    from pipelines.models.tiny import make_tiny_llama
    from tests.deploy.test_vllm import VLLM_PY

    if not VLLM_PY.is_file():
        pytest.skip("no .venv-vllm: run `make vllm-venv`")
    tiny = make_tiny_llama(tmp_path / "tiny", warmup_steps=0)
    cfg = _cfg(tmp_path, lake, model="", max_turn_chars=600)
    cfg.train = TrainConfig(base_model=str(tiny))
    start_vllm(tiny, home=cfg.home, port=None, dtype="float32", start_timeout_s=300)
    try:
        turns, report = judge_labelled(cfg, TENANT, TASK, _unlabelled())
    finally:
        stop_vllm(cfg.home)
    assert report.judge.startswith(f"vllm:{tiny}|base|") and report.calls == VOTED, report
    assert report.failures == {} and report.n_votes == VOTED  # every answer on the scale
    assert 0.0 <= report.auroc < 0.65 and turns == [] and not report.usable
    assert f"AUROC {report.auroc:.3f} of its verdicts against 32 votes < judge.min_auroc 0.65" in report.reason
