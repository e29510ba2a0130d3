#!/usr/bin/env python3
"""A logging HTTP proxy between a coding agent and `specd serve`, for scripts/agent-clients/run.sh.

Every exchange (method, path, request body, status, and the response body or SSE stream) is
appended to a JSON-lines log that run.sh checks. One change is made to requests, and only to
make a second turn happen: the test model is random, so it never decides to call a tool by
itself. The first model request of a conversation that has no tool result yet is sent with
`tool_choice` forcing the agent's shell tool and that tool's arguments pinned to one harmless
read-only command (`echo hi`) — specd's tool-call grammar then writes that call, the agent runs
it, and its next request carries the call and its result in the history. The answers after that
are pinned to one sentence (a grammar, with the tools not offered), and `max_tokens` is capped,
so that a random model's text ends. Everything else passes as the agent sent it.

  proxy.py LISTEN_PORT UPSTREAM_PORT LOG
"""
import http.client
import http.server
import json
import sys
import threading
import urllib.parse

LISTEN, UPSTREAM, LOG = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
MAX_TOKENS = 256
COMMAND = "echo hi"
# The answer after the tool result, pinned too (llama.cpp's `grammar` field, which specd takes on
# every API): a random model's text would run to the token limit and end as "incomplete",
# which Codex reports as an error.
ANSWER = 'root ::= "It printed hi."'

lock = threading.Lock()


def pin_shell_call(path, body):
    """Forces the shell tool with pinned arguments in a conversation without a tool result."""
    if path.endswith("/v1/messages"):
        # Anthropic Messages (Claude Code): the `Bash` tool, tool results in user messages.
        results = any(isinstance(m.get("content"), list) and
                      any(b.get("type") == "tool_result" for b in m["content"])
                      for m in body.get("messages", []))
        tools = {t.get("name"): t for t in body.get("tools", [])}
        if not results and "Bash" in tools:
            tools["Bash"]["input_schema"] = {
                "type": "object", "required": ["command"],
                "properties": {"command": {"type": "string", "enum": [COMMAND]}}}
            body["tool_choice"] = {"type": "tool", "name": "Bash", "disable_parallel_tool_use": True}
            return True
    elif path.endswith("/v1/responses"):
        # Responses (Codex CLI): the `exec_command` function, results as output items.
        items = body.get("input", [])
        results = isinstance(items, list) and any(
            i.get("type") == "function_call_output" for i in items)
        tools = {t.get("name"): t for t in body.get("tools", []) if t.get("type") == "function"}
        if not results and "exec_command" in tools:
            tools["exec_command"]["parameters"] = {
                "type": "object", "required": ["cmd"], "additionalProperties": False,
                "properties": {"cmd": {"type": "string", "enum": [COMMAND]}}}
            tools["exec_command"]["strict"] = True
            body["tool_choice"] = {"type": "function", "name": "exec_command"}
            body["parallel_tool_calls"] = False
            return True
    return False


class Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def forward(self):
        n = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(n) if n else b""
        entry = {"method": self.command, "path": self.path}
        body = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
        if isinstance(body, dict):
            path = urllib.parse.urlsplit(self.path).path
            entry["forced_call"] = pin_shell_call(path, body)
            # Claude Code's title request asks for a JSON schema of its own.
            wants_format = "format" in (body.get("output_config") or {})
            if not entry["forced_call"] and not wants_format:
                # A grammar replaces the tool-call grammar: the tools are not offered then.
                body["grammar"] = ANSWER
                body.pop("tools", None)
                body.pop("tool_choice", None)
                # A pinned answer has no thinking before it.
                if path.endswith("/v1/messages"):
                    body["thinking"] = {"type": "disabled"}
                else:
                    body["reasoning"] = {"effort": "none"}
            key = "max_output_tokens" if path.endswith("/v1/responses") else "max_tokens"
            body[key] = min(int(body.get(key) or MAX_TOKENS), MAX_TOKENS)
            entry["request"] = body
            raw = json.dumps(body).encode()
        headers = {k: v for k, v in self.headers.items()
                   if k.lower() not in ("host", "content-length", "connection",
                                        "accept-encoding")}
        conn = http.client.HTTPConnection("127.0.0.1", UPSTREAM, timeout=600)
        conn.request(self.command, self.path, body=raw if raw else None,
                     headers={**headers, "content-length": str(len(raw))})
        resp = conn.getresponse()
        entry["status"] = resp.status
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        got = b""
        if self.command == "HEAD":
            self.send_header("content-length", "0")
            self.end_headers()
        else:
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            while chunk := resp.read1(65536):
                got += chunk
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        entry["response"] = got.decode("utf-8", "replace")
        with lock, open(LOG, "a") as f:
            f.write(json.dumps(entry) + "\n")

    do_GET = do_POST = do_HEAD = do_DELETE = do_PUT = forward


http.server.ThreadingHTTPServer(("127.0.0.1", LISTEN), Proxy).serve_forever()
