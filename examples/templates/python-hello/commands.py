"""The sandbox template's main process: named commands for callers of the HTTP API.

`python3 commands.py` starts the agent-sandbox server on port 9000 (and the PTY
WebSocket on 9001 when the terminal group is on); these functions stay the
implementations of the commands.
"""

from agent_sandbox.server import command, start


@command("hello", description="Say hello.")
def hello(name: str = "World") -> str:
    return f"Hello, {name}!"


@command(hidden=True)
def _debug_info() -> dict:
    return {"ok": True}


start(9000)
