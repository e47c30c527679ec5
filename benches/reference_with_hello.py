"""The published reference server (agent-sandbox-server, from .tools/reference-venv) with
the example template's `hello` command, as a template's commands.py runs it, on the port
given: the `python` column of scripts/bench.

    .tools/reference-venv/bin/python benches/reference_with_hello.py PORT

The base directory, the groups and the PTY port come from the environment
(ABX_SERVER_BASE_DIR, ABX_SERVER_ENABLED_GROUPS, ABX_PTY_PORT), as the reference reads them.
"""

import sys

from agent_sandbox.server import command, start


# The same function as examples/templates/python-hello/commands.py.
@command("hello", description="Say hello.")
def hello(name: str = "World") -> str:
    return f"Hello, {name}!"


start(int(sys.argv[1]), host="127.0.0.1")
