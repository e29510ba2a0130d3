"""Drives specd's Anthropic Messages API with the official `anthropic` client: a message, a
streamed message, a tool conversation, token counting and an error. Prints one JSON line with
what the Rust test compares against specd's OpenAI chat path. The client sends no sampling
fields (the API has none now): the server runs greedy (`--temp 0`)."""

import json
import os

import anthropic

URL = os.environ["SPECD_URL"]
client = anthropic.Anthropic(base_url=URL, api_key="unused")
MESSAGES = [{"role": "user", "content": "Write a loop"}]
SYSTEM = "You write Python."
report = {}

# A whole message.
m = client.messages.create(
    model="specd", max_tokens=12, system=SYSTEM, messages=MESSAGES
)
assert m.type == "message" and m.role == "assistant", m
assert m.id.startswith("msg_"), m.id
assert m.stop_reason in ("end_turn", "max_tokens"), m.stop_reason
assert [b.type for b in m.content] == ["text"], m.content
assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0, m.usage
report["text"] = m.content[0].text
report["usage"] = m.usage.model_dump()
report["stop_reason"] = m.stop_reason

# The same message streamed: the helper's text stream and its final message, and the raw
# event sequence.
with client.messages.stream(
    model="specd", max_tokens=12, system=SYSTEM, messages=MESSAGES
) as stream:
    pieces = list(stream.text_stream)
    final = stream.get_final_message()
assert "".join(pieces) == final.content[0].text, (pieces, final)
report["stream_text"] = "".join(pieces)
report["stream_stop_reason"] = final.stop_reason
report["stream_usage"] = final.usage.model_dump()

raw = client.messages.create(
    model="specd", max_tokens=12, system=SYSTEM, messages=MESSAGES, stream=True
)
report["events"] = [e.type for e in raw]

# A tool conversation: tools offered, an earlier tool_use and its tool_result in the history.
tools = [
    {
        "name": "get_weather",
        "description": "Weather of a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]
history = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
        ],
    },
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 25 C"}],
    },
]
t = client.messages.create(
    model="specd", max_tokens=12, tools=tools, tool_choice={"type": "auto"},
    messages=history,
)
assert t.type == "message", t
report["tool_text"] = "".join(b.text for b in t.content if b.type == "text")
report["tool_count"] = client.messages.count_tokens(
    model="specd", tools=tools, messages=history
).input_tokens

# Token counting.
report["count"] = client.messages.count_tokens(
    model="specd", system=SYSTEM, messages=MESSAGES
).input_tokens

# A bad request comes back as the client's typed error with Anthropic's error body.
try:
    client.messages.create(
        model="specd", max_tokens=4, messages=[{"role": "tool", "content": "x"}]
    )
    raise AssertionError("a tool-role message was accepted")
except anthropic.BadRequestError as e:
    assert e.status_code == 400, e
    assert e.body["type"] == "error", e.body
    assert e.body["error"]["type"] == "invalid_request_error", e.body
    report["error_type"] = e.body["error"]["type"]

print(json.dumps(report))
