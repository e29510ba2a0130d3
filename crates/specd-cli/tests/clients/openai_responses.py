"""Drives specd's OpenAI Responses API with the official `openai` client: a response, a
streamed response, function-call items in the input, input token counting and an error.
Prints one JSON line with what the Rust test compares against specd's chat path."""

import json
import os

import openai

URL = os.environ["SPECD_URL"]
client = openai.OpenAI(base_url=URL + "/v1", api_key="unused")
INPUT = [{"role": "user", "content": "Write a loop"}]
INSTRUCTIONS = "You write Python."
report = {}

# A whole response.
r = client.responses.create(
    model="specd", instructions=INSTRUCTIONS, input=INPUT, max_output_tokens=12, temperature=0
)
assert r.id.startswith("resp_"), r.id
# Cut by max_output_tokens: OpenAI's "incomplete" with the reason.
assert r.object == "response" and r.status == "incomplete", r
assert r.incomplete_details.reason == "max_output_tokens", r
assert [o.type for o in r.output] == ["message"], r.output
assert r.output[0].id.startswith("msg_"), r.output[0].id
assert r.output[0].content[0].type == "output_text", r.output[0]
assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0, r.usage
report["text"] = r.output_text
report["usage"] = r.usage.model_dump()

# The same response streamed: the typed events in order, the text deltas and the final
# response.
stream = client.responses.create(
    model="specd", instructions=INSTRUCTIONS, input=INPUT, max_output_tokens=12,
    temperature=0, stream=True,
)
events, deltas, seqs, final, msg_id = [], [], [], None, None
for e in stream:
    events.append(e.type)
    seqs.append(e.sequence_number)
    if e.type == "response.output_item.added":
        msg_id = e.item.id
    if e.type == "response.output_text.delta":
        assert e.item_id == msg_id and e.output_index == 0 and e.content_index == 0, e
        deltas.append(e.delta)
    if e.type == "response.output_text.done":
        assert e.text == "".join(deltas), e
    if e.type in ("response.completed", "response.incomplete"):
        final = e.response
assert final is not None and final.output_text == "".join(deltas), final
assert seqs == list(range(len(seqs))), seqs
report["events"] = events
report["stream_text"] = "".join(deltas)

# The helper that accumulates a stream.
with client.responses.stream(
    model="specd", instructions=INSTRUCTIONS, input=INPUT, max_output_tokens=12, temperature=0
) as s:
    # A response cut by max_output_tokens ends with `response.incomplete` (as OpenAI's do);
    # the helper's get_final_response() waits for `response.completed` only.
    ended = [e.response for e in s if e.type in ("response.completed", "response.incomplete")]
    report["helper_text"] = ended[-1].output_text

# Function calls of an earlier turn and their outputs in the input.
tools = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]
history = [
    {"role": "user", "content": "Weather in Paris?"},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather",
     "arguments": "{\"city\": \"Paris\"}"},
    {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 25 C"},
]
t = client.responses.create(
    model="specd", input=history, tools=tools, max_output_tokens=12, temperature=0
)
assert t.status in ("completed", "incomplete"), t
report["tool_text"] = t.output_text
report["tool_count"] = client.responses.input_tokens.count(
    model="specd", input=history, tools=tools
).input_tokens
report["count"] = client.responses.input_tokens.count(
    model="specd", instructions=INSTRUCTIONS, input=INPUT
).input_tokens

# A bad request is the client's typed error.
try:
    client.responses.create(model="specd", input=INPUT, previous_response_id="resp_x")
    raise AssertionError("previous_response_id was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400, e
    report["error_type"] = e.body["type"] if "type" in e.body else e.body["error"]["type"]

print(json.dumps(report))
