"""Calls a running template server: health, the command list, and the hello command.

    python3 call_api.py                        # http://127.0.0.1:9000
    ABX_TEMPLATE_URL=https://9000-... ABX_SERVER_TOKEN=... python3 call_api.py

Standard library only. Exits 1 if any call fails.
"""

import json
import os
import sys
import urllib.error
import urllib.request

BASE = os.environ.get("ABX_TEMPLATE_URL", "http://127.0.0.1:9000").rstrip("/")
TOKEN = os.environ.get("ABX_SERVER_TOKEN", "")


def call(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(BASE + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if TOKEN:
        request.add_header("X-Access-Token", TOKEN)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def main():
    status, health = call("GET", "/health")
    print("health:", status, health)
    status, listed = call("GET", "/commands")
    print("commands:", status, [c["name"] for c in listed.get("commands", [])])
    status, hello = call("POST", "/commands/hello", {"name": "Ada"})
    print("hello:", status, hello)
    ok = health == {"status": "ok"} and hello == {"result": "Hello, Ada!"}
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
