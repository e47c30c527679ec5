"""Unit tests of the agent_sandbox package's registration API (no server needed).

    PYTHONPATH=python python3 -m unittest discover -s python/tests
"""

import json
import os
import stat
import tempfile
import unittest
from unittest import mock

from agent_sandbox import server
from agent_sandbox.server import (CapabilityGroup, CommandArg, CommandRegistry, RouteTable,
                                  SandboxServer, ServerResponse, SSEResponse)


class CommandRegistration(unittest.TestCase):
    def test_annotations_become_types_and_defaults(self):
        registry = CommandRegistry()

        @registry.command("f", description="d")
        def f(a: int, b: float = 1.5, c: bool = False, d: str = "x", e=None, f: list = None, *rest, **extra):
            return a

        manifest = registry.to_manifest()[0]
        self.assertEqual(manifest["name"], "f")
        self.assertEqual(manifest["description"], "d")
        self.assertEqual(manifest["args"], [
            {"name": "a", "type": "integer", "required": True, "default": None, "description": ""},
            {"name": "b", "type": "float", "required": False, "default": 1.5, "description": ""},
            {"name": "c", "type": "boolean", "required": False, "default": False, "description": ""},
            {"name": "d", "type": "string", "required": False, "default": "x", "description": ""},
            {"name": "e", "type": "string", "required": False, "default": None, "description": ""},
            {"name": "f", "type": "string", "required": False, "default": None, "description": ""},
        ])

    def test_string_annotations_are_understood(self):
        namespace = {}
        exec("from __future__ import annotations\ndef g(n: int, ok: bool = True): pass", namespace)
        registry = CommandRegistry()
        registry.register(namespace["g"])
        types = [a["type"] for a in registry.to_manifest()[0]["args"]]
        self.assertEqual(types, ["integer", "boolean"])

    def test_name_defaults_to_the_function_and_bare_decorator_works(self):
        registry = CommandRegistry()

        @registry.command
        def plain():
            return 1

        @registry.command(hidden=True, scopes=("a:b",))
        def _hidden():
            return 2

        self.assertEqual(registry.names(), ["plain"])
        self.assertEqual(registry.names(include_hidden=True), ["plain", "_hidden"])
        self.assertEqual(registry.get("_hidden").scopes, ("a:b",))
        self.assertEqual(plain(), 1, "the decorator returns the function itself")

    def test_explicit_args_carry_descriptions(self):
        registry = CommandRegistry()
        registry.register(lambda who: who, name="greet",
                          args=[CommandArg("who", "string", required=True, default="ignored", description="Whom.")])
        self.assertEqual(registry.to_manifest()[0]["args"],
                         [{"name": "who", "type": "string", "required": True, "default": None, "description": "Whom."}])
        with self.assertRaises(ValueError):
            CommandArg("x", "number")

    def test_registry_freezes(self):
        registry = CommandRegistry()
        registry.freeze()
        with self.assertRaises(RuntimeError):
            registry.register(lambda: None, name="late")


    def test_defaults_json_cannot_hold_are_listed_as_str(self):
        import pathlib
        registry = CommandRegistry()

        @registry.command
        def f(p=pathlib.Path("/x"), t=(1, 2), inf=float("inf"), ok=[1, {"a": None}]):
            pass

        defaults = [a["default"] for a in registry.to_manifest()[0]["args"]]
        self.assertEqual(defaults, ["/x", "(1, 2)", "inf", [1, {"a": None}]])
        json.dumps(registry.to_manifest(), allow_nan=False)


class RouteRegistration(unittest.TestCase):
    def test_routes_and_group_switches(self):
        table = RouteTable()

        @table.route("get", "/a/{x}", group=CapabilityGroup.SYSTEM, streaming=True, auth_required=False)
        def a(request):
            """Summary from the docstring."""

        table.enable_group(CapabilityGroup.AGENTS)
        table.disable_group("process")
        routes, groups = table.to_manifest()
        self.assertEqual(routes, [{"method": "GET", "path": "/a/{x}", "name": "GET /a/{x}", "group": "system",
                                   "auth_required": False, "streaming": True, "scopes": [],
                                   "summary": "Summary from the docstring."}])
        self.assertEqual(groups, [["agents", True], ["process", False]])
        with self.assertRaises(ValueError):
            table.disable_group(CapabilityGroup.CORE)
        with self.assertRaises(ValueError):
            table.route("PUT", "/x")
        with self.assertRaises(ValueError):
            table.route("GET", "no-slash")

    def test_responses(self):
        self.assertEqual(vars(ServerResponse.ok({"a": 1})), {"status": 200, "body": {"a": 1}})
        with self.assertRaises(ValueError):
            ServerResponse(1000)
        error = ServerResponse.error(409, "taken")
        self.assertEqual((error.status, error.body), (409, {"error": "taken", "type": "ValueError"}))
        self.assertEqual(SSEResponse.event("tick", {"n": 1}), 'event: tick\ndata: {"n": 1}\n\n')


class Startup(unittest.TestCase):
    def test_binary_lookup_order(self):
        with tempfile.TemporaryDirectory() as bindir:
            found = os.path.join(bindir, "agent-sandbox")
            with open(found, "w") as f:
                f.write("#!/bin/sh\n")
            os.chmod(found, stat.S_IRWXU)
            with mock.patch.dict(os.environ, {"ABX_SERVER_BIN": "/explicit/agent-sandbox"}):
                self.assertEqual(server.server_binary(), "/explicit/agent-sandbox")
            with mock.patch.dict(os.environ, {"ABX_SERVER_BIN": "", "PATH": bindir}), \
                    mock.patch.object(server.sysconfig, "get_path", return_value="/nonexistent"), \
                    mock.patch.object(server.sys, "executable", "/nonexistent/python3"):
                self.assertEqual(server.server_binary(), found)
            with mock.patch.dict(os.environ, {"ABX_SERVER_BIN": "", "PATH": "/nonexistent"}), \
                    mock.patch.object(server.sysconfig, "get_path", return_value="/nonexistent"), \
                    mock.patch.object(server.sys, "executable", "/nonexistent/python3"):
                with self.assertRaises(FileNotFoundError):
                    server.server_binary()

    def test_exec_passes_the_script_and_lets_the_environment_choose_the_port(self):
        calls = []
        env = {k: v for k, v in os.environ.items() if not k.startswith("ABX_")}
        env.update({"ABX_SERVER_BIN": "/bin/agent-sandbox", "ABX_SERVER_PORT": "7000"})
        with mock.patch.dict(os.environ, env, clear=True), \
                mock.patch.object(server.os, "execve", lambda *a: calls.append(a)):
            SandboxServer(registry=CommandRegistry(), table=RouteTable(), base_dir="/srv").serve(port=9000)
        binary, argv, child_env = calls[0]
        self.assertEqual(binary, "/bin/agent-sandbox")
        self.assertEqual(argv, ["/bin/agent-sandbox", "--host", "0.0.0.0", "--base-dir", "/srv"])
        app = json.loads(child_env["ABX_PYTHON_APP"])
        self.assertEqual(app["cwd"], os.getcwd())
        self.assertEqual(app["argv"][0], server.sys.executable)

    def test_the_worker_command_names_the_script_absolutely(self):
        main = mock.Mock(__file__="/abs/app/commands.py")
        with mock.patch.dict(server.sys.modules, {"__main__": main}), \
                mock.patch.object(server.sys, "orig_argv", ["python3", "-X", "dev", "commands.py", "--flag"], create=True), \
                mock.patch.object(server.sys, "argv", ["commands.py", "--flag"]):
            self.assertEqual(server._worker_argv(), [server.sys.executable, "-X", "dev", "/abs/app/commands.py", "--flag"])
        with mock.patch.dict(server.sys.modules, {"__main__": main}), \
                mock.patch.object(server.sys, "orig_argv", ["python3", "-m", "app.commands"], create=True), \
                mock.patch.object(server.sys, "argv", ["/abs/app/commands.py"]):
            self.assertEqual(server._worker_argv(), [server.sys.executable, "-m", "app.commands"])




class BridgeEnvironment(unittest.TestCase):
    """POST /env's variables reach the worker over several sockets, each read by its own
    thread: a set read late must not undo a newer one."""

    def test_only_a_newer_set_is_applied(self):
        from agent_sandbox._bridge import _Environment
        environment = _Environment()
        with mock.patch.dict(os.environ, {}, clear=False):
            environment.apply({"env_version": 2, "env": {"ABX_TEST_VAR": "two"}})
            environment.apply({"env_version": 1, "env": {"ABX_TEST_VAR": "one"}})
            self.assertEqual(os.environ["ABX_TEST_VAR"], "two")
            environment.apply({"env_version": 2, "env": {"ABX_TEST_VAR": "again"}})
            self.assertEqual(os.environ["ABX_TEST_VAR"], "two")
            environment.apply({"env_version": 3, "env": {"ABX_TEST_VAR": "three"}})
            self.assertEqual(os.environ["ABX_TEST_VAR"], "three")
            # A server that sends no version (an older release): always applied.
            environment.apply({"env": {"ABX_TEST_VAR": "unversioned"}})
            self.assertEqual(os.environ["ABX_TEST_VAR"], "unversioned")

if __name__ == "__main__":
    unittest.main()
