"""The template-facing API of agent_sandbox.server, served by the agent-sandbox binary.

A template's commands.py keeps working unchanged::

    from agent_sandbox.server import command, start

    @command("hello", description="Say hello.")
    def hello(name: str = "World") -> str:
        return f"Hello, {name}!"

    start(9000)

``start`` replaces this Python process with the agent-sandbox server (same pid), which
runs this script again as its worker: the functions registered here stay the
implementations of the commands and custom routes, reached over local sockets
(see docs/python-bridge.md). Standard library only.
"""

import enum
import inspect
import json
import os
import shutil
import sys
import sysconfig
import typing

from ._messages import Request, ServerResponse, SSEResponse

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

BRIDGE_PROTOCOL = 1


class CapabilityGroup(str, enum.Enum):
    """The capability groups of the HTTP API."""

    CORE = "core"
    COMMANDS = "commands"
    FILE_OPS = "file_ops"
    PROCESS = "process"
    TERMINAL = "terminal"
    SYSTEM = "system"
    DEV_TOOLS = "dev_tools"
    BROWSER = "browser"
    AGENTS = "agents"
    K8S_RUNTIME = "k8s_runtime"

    def __str__(self):
        return self.value


_TYPE_NAMES = {int: "integer", float: "float", bool: "boolean"}
_TYPE_WORDS = {"int": "integer", "float": "float", "bool": "boolean"}
ARG_TYPES = ("string", "integer", "float", "boolean")


class CommandArg:
    """One argument of a command, as GET /commands lists it."""

    def __init__(self, name, type="string", required=False, default=None, description=""):
        if type not in ARG_TYPES:
            raise ValueError(f"CommandArg type must be one of {', '.join(ARG_TYPES)}, not {type!r}")
        self.name = name
        self.type = type
        self.required = bool(required)
        self.default = None if required else default
        self.description = description

    def to_dict(self):
        return {
            "name": self.name,
            "type": self.type,
            "required": self.required,
            "default": _listable(self.default),
            "description": self.description or "",
        }

    def __repr__(self):
        return f"CommandArg({self.to_dict()!r})"


def _listable(value):
    """A default as GET /commands can show it: JSON values as they are, anything else
    (a Path, an Enum, a tuple, inf) as its str()."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else str(value)
    if isinstance(value, list):
        return [_listable(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _listable(v) for k, v in value.items()}
    return str(value)


class _Command:
    def __init__(self, func, name, description, hidden, scopes, args):
        self.func = func
        self.name = name
        self.description = description
        self.hidden = hidden
        self.scopes = tuple(scopes)
        self.args = args

    def to_manifest(self):
        return {
            "name": self.name,
            "description": self.description or "",
            "args": [arg.to_dict() for arg in self.args],
            "hidden": self.hidden,
            "scopes": list(self.scopes),
        }


def _arg_type(annotation):
    if annotation in _TYPE_NAMES:
        return _TYPE_NAMES[annotation]
    if isinstance(annotation, str):
        return _TYPE_WORDS.get(annotation.strip(), "string")
    return "string"


def _args_of(func):
    try:
        hints = typing.get_type_hints(func)
    except Exception:
        hints = {}
    args = []
    for param in inspect.signature(func).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        required = param.default is inspect.Parameter.empty
        annotation = hints.get(param.name, param.annotation)
        args.append(CommandArg(param.name, _arg_type(annotation), required,
                               None if required else param.default))
    return args


class CommandRegistry:
    """Named commands. Frozen when the server starts: register at import time."""

    def __init__(self):
        self._commands = {}
        self._frozen = False

    def register(self, func, name=None, description="", hidden=False, scopes=(), args=None):
        if self._frozen:
            raise RuntimeError("the command registry is frozen once the server starts; register commands at import time")
        name = name or func.__name__
        if args is None:
            args = _args_of(func)
        else:
            args = [a if isinstance(a, CommandArg) else CommandArg(**a) for a in args]
        self._commands[name] = _Command(func, name, description, bool(hidden), scopes, args)
        return func

    def command(self, name=None, description="", hidden=False, scopes=(), args=None):
        """Decorator: ``@registry.command("name", description=...)`` or bare ``@registry.command``."""
        if callable(name):
            return self.register(name)

        def decorate(func):
            return self.register(func, name, description, hidden, scopes, args)

        return decorate

    def get(self, name):
        return self._commands.get(name)

    def names(self, include_hidden=False):
        return [n for n, c in self._commands.items() if include_hidden or not c.hidden]

    def freeze(self):
        self._frozen = True

    def __contains__(self, name):
        return name in self._commands

    def __len__(self):
        return len(self._commands)

    def to_manifest(self):
        return [c.to_manifest() for c in self._commands.values()]


_default_registry = CommandRegistry()


def default_registry():
    """The registry @command writes to."""
    return _default_registry


def command(name=None, description="", hidden=False, scopes=(), args=None):
    """Registers a function as a named command (GET /commands, POST /commands/{name})."""
    return _default_registry.command(name, description, hidden, scopes, args)


class _Route:
    def __init__(self, func, method, path, group, name, auth_required, streaming, scopes, summary):
        self.func = func
        self.method = method
        self.path = path
        self.group = group
        self.name = name
        self.auth_required = auth_required
        self.streaming = streaming
        self.scopes = tuple(scopes)
        self.summary = summary

    def to_manifest(self):
        return {
            "method": self.method,
            "path": self.path,
            "name": self.name,
            "group": self.group,
            "auth_required": self.auth_required,
            "streaming": self.streaming,
            "scopes": list(self.scopes),
            "summary": self.summary,
        }


class RouteTable:
    """Custom routes and group switches, read when the server starts."""

    METHODS = ("GET", "POST", "DELETE")

    def __init__(self):
        self._routes = {}
        self._groups = []
        self._frozen = False

    def route(self, method, path, group=CapabilityGroup.COMMANDS, name=None, auth_required=True,
              streaming=False, scopes=(), summary=""):
        """Decorator registering ``handler(request) -> ServerResponse | SSEResponse``."""
        method = method.upper()
        if method not in self.METHODS:
            raise ValueError(f"the dispatcher calls {', '.join(self.METHODS)} only, not {method}")
        if not path.startswith("/"):
            raise ValueError(f"a route path starts with '/': {path!r}")
        group = CapabilityGroup(group).value
        name = name or f"{method} {path}"

        def decorate(func):
            if self._frozen:
                raise RuntimeError("the route table is frozen once the server starts")
            self._routes[name] = _Route(func, method, path, group, name, bool(auth_required),
                                        bool(streaming), scopes, summary or (func.__doc__ or "").strip())
            return func

        return decorate

    def enable_group(self, group):
        self._groups.append((CapabilityGroup(group).value, True))

    def disable_group(self, group):
        group = CapabilityGroup(group)
        if group is CapabilityGroup.CORE:
            raise ValueError("the core group cannot be disabled")
        self._groups.append((group.value, False))

    def get(self, name):
        return self._routes.get(name)

    def freeze(self):
        self._frozen = True

    def to_manifest(self):
        return [r.to_manifest() for r in self._routes.values()], [list(g) for g in self._groups]


_default_table = RouteTable()


def default_table():
    """The route table SandboxServer uses unless given another."""
    return _default_table


def server_binary():
    """The agent-sandbox binary: ABX_SERVER_BIN, else the one installed with this
    package, else agent-sandbox on PATH."""
    explicit = os.environ.get("ABX_SERVER_BIN")
    if explicit:
        return explicit
    for scheme_dir in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        candidate = os.path.join(scheme_dir or "", "agent-sandbox")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("agent-sandbox")
    if found:
        return found
    raise FileNotFoundError(
        "agent-sandbox binary not found: install the agent_sandbox package with pip "
        "(it ships the binary), put agent-sandbox on PATH, or set ABX_SERVER_BIN"
    )


class SandboxServer:
    """The server for this registry and route table. ``serve`` does not return."""

    def __init__(self, registry=None, table=None, host="0.0.0.0", port=9000, **options):
        self.registry = registry if registry is not None else _default_registry
        self.table = table if table is not None else _default_table
        self.host = host
        self.port = port
        self.options = options

    def manifest(self):
        routes, groups = self.table.to_manifest()
        return {
            "protocol": BRIDGE_PROTOCOL,
            "commands": self.registry.to_manifest(),
            "routes": routes,
            "groups": groups,
        }

    def serve(self, port=None, host=None):
        if port is not None:
            self.port = port
        if host is not None:
            self.host = host
        self.registry.freeze()
        self.table.freeze()
        if os.environ.get("ABX_BRIDGE_FDS"):
            from . import _bridge

            _bridge.run_worker(self)
        self._exec_server()

    def _exec_server(self):
        binary = server_binary()
        argv = [binary]
        # The environment outranks the script, so an operator can move the server
        # (ABX_SERVER_HOST, ABX_SERVER_PORT) without editing commands.py.
        if not os.environ.get("ABX_SERVER_HOST"):
            argv += ["--host", str(self.host)]
        if not os.environ.get("ABX_SERVER_PORT"):
            argv += ["--port", str(int(self.port))]
        for key, value in self.options.items():
            if value is None:
                continue
            argv += ["--" + key.replace("_", "-"), str(value)]
        env = dict(os.environ)
        env["ABX_PYTHON_APP"] = json.dumps({"argv": _worker_argv(), "cwd": os.getcwd()})
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(binary, argv, env)

    def serve_forever(self):
        self.serve()


def _worker_argv():
    """The command that runs this program again: the interpreter with its original
    arguments (``sys.orig_argv``, Python 3.10+), the script named by its absolute path
    so a ``chdir`` before ``start()`` does not lose it."""
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None)
    script = os.path.abspath(script) if script else None
    if hasattr(sys, "orig_argv"):
        argv = list(sys.orig_argv[1:])
        if script and sys.argv and sys.argv[0] and sys.argv[0] not in ("-c", "-m"):
            argv = [script if a == sys.argv[0] else a for a in argv]
        return [sys.executable] + argv
    # Python 3.8/3.9: the interpreter's own flags are not recorded.
    if script:
        return [sys.executable, script] + sys.argv[1:]
    return [sys.executable] + sys.argv


def start(port=9000, host="0.0.0.0", registry=None, table=None, **options):
    """Serves the registered commands and routes on ``host:port``. Does not return."""
    SandboxServer(registry=registry, table=table, host=host, port=port, **options).serve()
