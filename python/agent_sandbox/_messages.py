"""What a custom route receives and answers: kept apart from ``server`` so that the
bridge (``_bridge``), which ``server`` starts, can use them without importing ``server``
back (no import cycle). ``agent_sandbox.server`` re-exports all three."""

import json


class ServerResponse:
    """A custom route's answer: a status and a JSON body."""

    def __init__(self, status=200, body=None):
        self.status = int(status)
        if not 100 <= self.status <= 599:
            raise ValueError(f"an HTTP status is 100-599, not {status}")
        self.body = {} if body is None else body

    @classmethod
    def ok(cls, body=None):
        return cls(200, body)

    @classmethod
    def error(cls, status, message, type="ValueError"):
        return cls(status, {"error": message, "type": type})


class SSEResponse:
    """A streaming route's answer: an iterator of ``event: <name>\\ndata: <json>\\n\\n`` strings."""

    def __init__(self, event_iterator):
        self.event_iterator = event_iterator

    @staticmethod
    def event(name, data):
        """Formats one event the way the server's own streams do."""
        return f"event: {name}\ndata: {json.dumps(data, default=str)}\n\n"


class Request:
    """What a custom route's handler receives."""

    def __init__(self, fields):
        self.method = fields.get("method", "GET")
        self.path = fields.get("path", "/")
        self.path_params = fields.get("path_params") or {}
        self.query = fields.get("query") or {}
        self.headers = fields.get("headers") or {}
        self.body = fields.get("body") or {}
        self.identity = fields.get("identity") or {"id": "anonymous", "scopes": ["*"]}

    @property
    def json(self):
        return self.body

    def __repr__(self):
        return f"Request({self.method} {self.path})"
