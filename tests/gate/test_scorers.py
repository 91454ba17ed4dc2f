"""Scorers, table-driven: each kind on outputs that pass, fail and half-pass."""

import json

import pytest

from pipelines.evals.scorers import parse_scorer, score, token_f1
from pipelines.evals.suites import Item

WEATHER = [{"name": "get_weather", "parameters": {"type": "object", "required": ["city"],
                                                  "properties": {"city": {"type": "string"}},
                                                  "additionalProperties": False}}]


def item(reference=None, **extra):
    return Item([{"role": "user", "content": "q"}], reference, extra)


CASES = [
    ({"kind": "exact"}, "  The answer is  42 ", item("the answer is 42"), 1.0),
    ({"kind": "exact"}, "43", item("42"), 0.0),
    ({"kind": "exact", "normalize": False}, "the answer is 42", item("The answer is 42"), 0.0),
    ({"kind": "regex", "pattern": r"\b42\b"}, "it is 42.", item(), 1.0),
    ({"kind": "regex"}, "it is 41.", item(pattern=r"\b42\b"), 0.0),
    ({"kind": "regex", "pattern": r"yes|no", "fullmatch": True, "ignore_case": True}, " YES ", item(), 1.0),
    ({"kind": "json_schema", "schema": {"type": "object", "required": ["a"]}}, 'Sure: {"a": 1}', item(), 1.0),
    ({"kind": "json_schema"}, '{"b": 1}', item(schema={"type": "object", "required": ["a"]}), 0.0),
    ({"kind": "json_schema", "schema": {"type": "object"}}, "not json", item(), 0.0),
    ({"kind": "tool_call", "tools": WEATHER}, json.dumps({"name": "get_weather", "arguments": {"city": "Oslo"}}), item(), 1.0),
    ({"kind": "tool_call", "tools": WEATHER},
     '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}</tool_call>', item(), 1.0),
    ({"kind": "tool_call", "tools": WEATHER}, json.dumps({"name": "get_weather", "arguments": {}}), item(), 0.0),
    ({"kind": "tool_call", "tools": WEATHER}, json.dumps({"name": "rm_rf", "arguments": {"city": "x"}}), item(), 0.0),
    ({"kind": "tool_call"}, json.dumps({"name": "get_weather", "arguments": {"city": "Oslo"}}),
     item(tools=WEATHER, expected_tool="other"), 0.0),
    ({"kind": "tool_call", "tools": WEATHER}, '{"name": "get_weather", "arguments": {"city": 1', item(), 0.0),
    # a list in one block (SmolLM2's format): every call must be valid; OpenAI-style tools work too
    ({"kind": "tool_call", "tools": [{"type": "function", "function": WEATHER[0]}]},
     '<tool_call>[{"name": "get_weather", "arguments": {"city": "Oslo"}}]</tool_call>', item(), 1.0),
    ({"kind": "tool_call", "tools": WEATHER},
     '<tool_call>[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "rm_rf", "arguments": {}}]'
     '</tool_call>', item(), 0.0),
    ({"kind": "similarity"}, "Paris is the capital of France", item("The capital of France is Paris."), 1.0),
    ({"kind": "similarity"}, "Berlin", item("Paris"), 0.0),
    ({"kind": "similarity", "metric": "char_ratio"}, "paris", item("Paris"), 1.0),
    ({"kind": "rubric", "criteria": [{"weight": 1, "check": {"kind": "regex", "pattern": r"\.$"}},
                                     {"weight": 3, "check": {"kind": "regex", "pattern": "Paris"}}]},
     "Paris!", item(), 0.75),
]


@pytest.mark.parametrize("spec,output,it,expected", CASES)
def test_scorer(spec, output, it, expected):
    assert score(parse_scorer(spec), output, it) == pytest.approx(expected)


def test_token_f1_partial_overlap():
    assert token_f1("the cat sat", "the cat ran away") == pytest.approx(2 * (2 / 3) * (2 / 4) / (2 / 3 + 2 / 4))


@pytest.mark.parametrize("spec,words", [
    ({"kind": "bleu"}, "kind='bleu'"),
    ({"kind": "regex", "pattern": "("}, "does not compile"),
    ({"kind": "exact", "reference": "x"}, r"unknown fields \['reference'\]"),
    ({"kind": "similarity", "metric": "bleu"}, "metric='bleu'"),
    ({"kind": "rubric"}, "at least one"),
    ({"kind": "rubric", "criteria": [{"weight": 0, "check": {"kind": "exact"}}]}, "weight > 0"),
])
def test_bad_scorer_configs_quote_the_value(spec, words):
    with pytest.raises(ValueError, match=words):
        parse_scorer(spec)


def test_llm_judge_without_endpoint_is_a_clear_error():
    s = parse_scorer({"kind": "rubric", "criteria": [{"weight": 1, "check": {"kind": "llm_judge"}}]})
    with pytest.raises(ValueError, match="judge_url"):
        score(s, "x", item())


def test_llm_judge_against_an_openai_compatible_endpoint():
    """A stub OpenAI-compatible server on loopback answers '7': the criterion scores 0.7."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from pipelines.evals.scorers import Judge

    seen = []

    class H(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, body["model"], self.headers.get("Authorization")))
            out = json.dumps({"choices": [{"message": {"content": "Score: 7"}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        s = parse_scorer({"kind": "rubric", "criteria": [{"weight": 1, "check": {"kind": "llm_judge"}},
                                                         {"weight": 1, "check": {"kind": "regex", "pattern": "ok"}}]})
        judge = Judge(f"http://127.0.0.1:{srv.server_port}", "j", "k")
        assert score(s, "ok", item("ref"), judge) == pytest.approx(0.85)
        assert seen == [("/v1/chat/completions", "j", "Bearer k")]
    finally:
        srv.shutdown()
