"""agent_sandbox: the template server API (``agent_sandbox.server``) on the agent-sandbox
binary. See ``agent_sandbox.server``."""

from .server import (
    CapabilityGroup,
    CommandArg,
    CommandRegistry,
    Request,
    RouteTable,
    SandboxServer,
    ServerResponse,
    SSEResponse,
    command,
    default_registry,
    default_table,
    start,
)

__all__ = [
    "CapabilityGroup",
    "CommandArg",
    "CommandRegistry",
    "Request",
    "RouteTable",
    "SSEResponse",
    "SandboxServer",
    "ServerResponse",
    "command",
    "default_registry",
    "default_table",
    "start",
]
