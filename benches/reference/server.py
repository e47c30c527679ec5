"""The benchmark's stand-in for agent_sandbox.server (Python reference server).

It implements only the benchmarked routes (health, file_ops, /shell, named commands,
/system/metrics, /ports, /git/status), the
way the contract describes the original: standard library only, ThreadingHTTPServer +
BaseHTTPRequestHandler, json, base64, shlex + subprocess.run(shell=False), plain open().
No policy engine, capabilities document or SSE routes.

    python3 server.py --port 0 --base-dir /tmp/base   # prints: listening on 127.0.0.1:PORT
"""

import argparse
import base64
import fnmatch
import hmac
import inspect
import io
import json
import os
import shlex
import shutil
import socket
import stat
import subprocess
import tarfile
import time
import zipfile
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

MAX_BODY = 10 * 1024 * 1024
MAX_UPLOAD = int(os.environ.get("ABX_MAX_UPLOAD_SIZE") or 100 * 1024 * 1024)
MAX_ARCHIVE_FILES = 10000
MAX_ARCHIVE_BYTES = 100 * 1024 * 1024
LIST_DEPTH = 3
CHUNK = 64 * 1024
JSON_TYPE = "application/json; charset=utf-8"


class ApiError(Exception):
    """An error answered as {"error", "type", **extra} with an HTTP status."""

    def __init__(self, status, message, kind="ValueError", **extra):
        super().__init__(message)
        self.status, self.message, self.kind, self.extra = status, message, kind, extra


# --- named commands -------------------------------------------------------------------

COMMANDS = {}
TYPE_NAMES = {int: "integer", float: "float", bool: "boolean"}


def command(name=None, description="", hidden=False):
    """Registers a function as a named command (GET /commands, POST /commands/{name})."""

    def register(func):
        args = []
        for param in inspect.signature(func).parameters.values():
            required = param.default is inspect.Parameter.empty
            args.append({"name": param.name, "type": TYPE_NAMES.get(param.annotation, "string"),
                         "required": required, "default": None if required else param.default,
                         "description": ""})
        COMMANDS[name or func.__name__] = {"func": func, "description": description,
                                           "args": args, "hidden": hidden}
        return func

    return register


@command("hello", description="Say hello.")
def hello(name: str = "World") -> str:
    return f"Hello, {name}!"


def coerce(value, kind):
    if kind == "boolean":
        text = str(value).lower()
        if text not in ("true", "yes", "1", "false", "no", "0"):
            raise ValueError(f"Invalid boolean: {value!r}")
        return text in ("true", "yes", "1")
    return {"integer": int, "float": float}.get(kind, str)(value)


# --- helpers --------------------------------------------------------------------------

def iso(timestamp):
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat()


def decode_base64(text):
    if not isinstance(text, str):
        raise ApiError(400, "content_base64 must be a base64 string")
    try:
        data = base64.b64decode(text, validate=True)
    except ValueError as e:
        raise ApiError(400, f"Invalid base64: {e}")
    if len(data) > MAX_UPLOAD:
        raise ApiError(413, f"Upload too large: {len(data)} bytes (limit {MAX_UPLOAD})",
                       code="payload_too_large")
    return data


def read_limited(path):
    if not os.path.isfile(path):
        raise ApiError(404, f"File not found: {path}", "FileNotFoundError")
    size = os.path.getsize(path)
    if size > MAX_UPLOAD:
        raise ApiError(413, f"File too large: {size} bytes (limit {MAX_UPLOAD})",
                       code="payload_too_large")
    with open(path, "rb") as f:
        return f.read()


def int_field(body, name, default):
    try:
        return int(body.get(name, default))
    except (TypeError, ValueError):
        raise ApiError(400, f"{name} must be an integer")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # header and body are two writes; avoid the 40 ms stall
    base_dir = "/home/user"
    token = ""

    def log_message(self, format, *args):  # one line per request would dominate the bench
        pass

    def send_json(self, status, body):
        data = json.dumps(body, default=str).encode()
        self.send_response(status)
        self.send_header("Content-Type", JSON_TYPE)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def dispatch(self):
        self.endpoint = None
        try:
            status, body = 200, self.handle_request(self.command)
        except ApiError as e:
            status, body = e.status, {"error": e.message, "type": e.kind, **e.extra}
        except Exception as e:  # an uncaught handler exception is 500 with its type
            status, body = 500, {"error": str(e), "type": type(e).__name__}
        self.send_json(status, body)

    do_GET = do_POST = do_DELETE = dispatch

    def handle_request(self, method):
        url = urlsplit(self.path)
        path = url.path.rstrip("/") or "/"
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True
            raise ApiError(400, "Invalid Content-Length")
        if length > MAX_BODY:
            self.close_connection = True  # the body stays unread
            raise ApiError(413, f"Request body too large: the limit is {MAX_BODY} bytes",
                           code="payload_too_large")
        raw = self.rfile.read(length) if length > 0 else b""

        self.endpoint = ROUTES.get((method, path))
        if self.endpoint is None and method == "POST" and path.startswith("/commands/"):
            self.endpoint = "commands_run"
        if self.endpoint is None:
            raise ApiError(404, f"Not found: {path}")
        if self.endpoint != "health":
            self.check_auth()

        self.query = {}
        for key, values in parse_qs(url.query, keep_blank_values=True).items():
            if len(values) > 1:
                raise ApiError(400, f"Duplicate query parameter: {key}",
                               code="duplicate_parameter")
            self.query[key] = values[0]
        self.body = {}
        if method != "GET" and raw.strip():
            try:
                self.body = json.loads(raw)
            except ValueError as e:
                raise ApiError(400, f"Invalid JSON body: {e}")
            if not isinstance(self.body, dict):
                raise ApiError(400, "Request body must be a JSON object")
        return getattr(self, self.endpoint)(path)

    def check_auth(self):
        if not self.token:
            return
        tokens = set(self.headers.get_all("X-Access-Token") or [])
        if len(tokens) > 1:
            raise ApiError(400, "Conflicting X-Access-Token headers",
                           code="ambiguous_credentials")
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            tokens.add(auth[len("Bearer "):].strip())
        if not any(hmac.compare_digest(t.encode(), self.token.encode()) for t in tokens):
            raise ApiError(401, "unauthorized", "AuthError")

    def resolve(self, raw, name="path", follow=True):
        """The real path of a caller path, confined to the base directory (403 otherwise).

        follow=False resolves the parent only, so a symlink itself is stat'ed or removed."""
        if not isinstance(raw, str) or not raw:
            raise ApiError(400, f"{name} is required")
        if "\0" in raw:
            raise ApiError(400, f"{name} contains a NUL byte")
        joined = os.path.abspath(os.path.join(self.base_dir, raw))
        real = os.path.realpath(joined)
        if not follow:
            parent, leaf = os.path.split(joined)
            real = os.path.join(os.path.realpath(parent), leaf) if leaf else real
        if not self.inside(real, follow=False):
            raise self.not_allowed(raw)
        return real

    def inside(self, path, follow=True):
        real = os.path.realpath(path) if follow else path
        return real == self.base_dir or real.startswith(self.base_dir + os.sep)

    def not_allowed(self, raw):
        return ApiError(403, f"Path '{raw}' is outside the allowed directories "
                        f"({self.base_dir}); use a path beneath it", "PolicyDenied",
                        code="path_not_allowed", endpoint=self.endpoint)

    # --- core and commands ------------------------------------------------------------

    def health(self, path):
        return {"status": "ok"}

    def commands_list(self, path):
        return {"commands": [{"name": name, "description": c["description"], "args": c["args"]}
                             for name, c in COMMANDS.items() if not c["hidden"]]}

    def commands_run(self, path):
        name = path[len("/commands/"):]
        cmd = COMMANDS.get(name)
        if cmd is None:
            raise ApiError(404, f"Unknown command: {name}")
        kwargs = {}
        for arg in cmd["args"]:
            if arg["name"] in self.body:
                try:
                    kwargs[arg["name"]] = coerce(self.body[arg["name"]], arg["type"])
                except (TypeError, ValueError) as e:
                    raise ApiError(400, f"Invalid value for {arg['name']}: {e}")
            elif arg["required"]:
                raise ApiError(400, f"Missing required argument: {arg['name']}")
            elif arg["default"] is not None:
                kwargs[arg["name"]] = arg["default"]
        return {"result": cmd["func"](**kwargs)}

    # --- file_ops ---------------------------------------------------------------------

    def upload(self, path):  # also POST /files/upload-stream, which writes 64 KiB chunks
        target = self.resolve(self.body.get("path"))
        data = decode_base64(self.body.get("content_base64"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            if path == "/files/upload-stream":
                view = memoryview(data)
                for start in range(0, len(data), CHUNK):
                    f.write(view[start:start + CHUNK])
            else:
                f.write(data)
        return {"path": target, "bytes": len(data)}

    files_upload_stream = upload

    def download(self, path):  # also GET /files/download-stream, which adds bytes
        target = self.resolve(self.query.get("path"))
        data = read_limited(target)
        result = {"path": target, "content_base64": base64.b64encode(data).decode()}
        if path == "/files/download-stream":
            result["bytes"] = len(data)
        return result

    files_download_stream = download

    def files_list(self, path):
        target = self.resolve(self.query.get("path"))
        if not os.path.isdir(target):
            raise ApiError(404, f"Directory not found: {target}", "FileNotFoundError")
        recursive = self.query.get("recursive", "").lower() in ("1", "true", "yes")
        entries = []

        def walk(directory, prefix, depth):
            with os.scandir(directory) as it:
                items = sorted(it, key=lambda e: e.name)
            for entry in items:
                is_dir = entry.is_dir(follow_symlinks=False)
                st = entry.stat(follow_symlinks=False)
                entries.append({"name": prefix + entry.name,
                                "type": "directory" if is_dir else "file",
                                "size": st.st_size, "modified": iso(st.st_mtime)})
                if recursive and is_dir and depth < LIST_DEPTH:
                    walk(entry.path, prefix + entry.name + "/", depth + 1)

        walk(target, "", 1)
        return {"entries": entries}

    def files_stat(self, path):
        target = self.resolve(self.query.get("path"), follow=False)
        result = {"name": os.path.basename(target), "path": target}
        try:
            st = os.lstat(target)
        except FileNotFoundError:
            return {**result, "type": "unknown", "size": 0, "permissions": "",
                    "modified": "", "accessed": "", "created": "", "exists": False}
        kind = ("symlink" if stat.S_ISLNK(st.st_mode) else
                "directory" if stat.S_ISDIR(st.st_mode) else "file")
        return {**result, "type": kind, "size": st.st_size,
                "permissions": oct(st.st_mode)[-3:], "modified": iso(st.st_mtime),
                "accessed": iso(st.st_atime), "created": iso(st.st_ctime), "exists": True}

    def files_mkdir(self, path):
        target = self.resolve(self.body.get("path"))
        os.makedirs(target, exist_ok=True)
        return {"path": target, "created": True}

    def files_delete(self, path):
        target = self.resolve(self.query.get("path"), follow=False)
        if not os.path.lexists(target):
            raise ApiError(404, f"Path not found: {target}", "FileNotFoundError")
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)
        else:
            os.remove(target)
        return {"path": target, "deleted": True}

    def files_move(self, path):
        resolved = []
        for field in ("source", "destination"):
            try:
                resolved.append(self.resolve(self.body.get(field), follow=False))
            except ApiError as e:
                e.message = f"{field}: {e.message}"
                raise
        source, destination = resolved
        if not os.path.lexists(source):
            raise ApiError(404, f"Source not found: {source}", "FileNotFoundError")
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        destination = shutil.move(source, destination)
        return {"source": source, "destination": destination}

    def files_search(self, path):
        root = self.resolve(self.body.get("path", self.base_dir))
        pattern = self.body.get("pattern", "*")
        if not isinstance(pattern, str):
            raise ApiError(400, "pattern must be a string")
        max_depth = int_field(self.body, "max_depth", 5)
        max_results = int_field(self.body, "max_results", 100)
        if not os.path.isdir(root):
            raise ApiError(404, f"Directory not found: {root}", "FileNotFoundError")
        deadline = time.monotonic() + 10
        results, timed_out = [], False
        for directory, dirnames, filenames in os.walk(root):
            if time.monotonic() > deadline:
                timed_out = True
                break
            depth = 0 if directory == root else os.path.relpath(directory, root).count(os.sep) + 1
            dirnames.sort()
            if depth >= max_depth:
                dirnames.clear()
            for name in sorted(filenames):
                if fnmatch.fnmatch(name, pattern):
                    results.append({"name": name, "path": os.path.join(directory, name)})
                    if len(results) >= max_results:
                        return {"results": results, "timed_out": False}
        return {"results": results, "timed_out": timed_out}

    def files_archive(self, path):
        paths = self.body.get("paths")
        fmt = self.body.get("format", "tar.gz")
        if not isinstance(paths, list) or not paths:
            raise ApiError(400, "paths must be a non-empty list of paths")
        if fmt not in ("tar.gz", "zip"):
            raise ApiError(400, f"Unsupported format: {fmt!r} (use tar.gz or zip)")
        members = []  # (absolute path, name in the archive)
        for raw in paths:
            target = self.resolve(raw, follow=False)
            if not os.path.lexists(target):
                raise ApiError(404, f"Path not found: {target}", "FileNotFoundError")
            parent = os.path.dirname(target)
            if os.path.isdir(target) and not os.path.islink(target):
                for directory, dirnames, filenames in os.walk(target):
                    dirnames.sort()
                    for name in sorted(filenames):
                        full = os.path.join(directory, name)
                        if self.inside(full):  # skip symlinks that leave the base dir
                            members.append((full, os.path.relpath(full, parent)))
            elif self.inside(target):
                members.append((target, os.path.basename(target)))
            if len(members) > MAX_ARCHIVE_FILES:
                raise ApiError(400, f"Too many files: more than {MAX_ARCHIVE_FILES}")
        buffer = io.BytesIO()
        if fmt == "zip":
            with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
                for full, arcname in members:
                    archive.write(full, arcname)
        else:
            with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
                for full, arcname in members:
                    archive.add(full, arcname, recursive=False)
        data = buffer.getvalue()
        if len(data) > MAX_ARCHIVE_BYTES:
            raise ApiError(413, f"Archive too large: {len(data)} bytes "
                           f"(limit {MAX_ARCHIVE_BYTES})", code="payload_too_large")
        return {"content_base64": base64.b64encode(data).decode(), "format": fmt,
                "bytes": len(data)}

    # --- process ----------------------------------------------------------------------

    def shell(self, path):
        cmd = self.body.get("command")
        if not isinstance(cmd, str) or not cmd.strip():
            raise ApiError(400, "command is required")
        cwd = self.body.get("cwd", self.base_dir)
        if not isinstance(cwd, str):
            raise ApiError(400, "cwd must be a string")
        cwd = self.resolve(cwd, "cwd")
        if not os.path.isdir(cwd):
            raise self.not_allowed(cwd)
        env = self.body.get("env")
        if env is not None and (not isinstance(env, dict) or
                                not all(isinstance(v, str) for v in env.values())):
            raise ApiError(400, "env must be an object of strings")
        timeout = self.body.get("timeout", 300)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            timeout = 300
        args = shlex.split(cmd)  # a ValueError here is the contract's 500
        try:
            proc = subprocess.run(args, cwd=cwd, env={**os.environ, **env} if env else None,
                                  stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=timeout, shell=False)
        except subprocess.TimeoutExpired:
            raise ApiError(500, f"Command timed out after {timeout}s", "TimeoutError")
        return {"stdout": proc.stdout.decode(errors="replace"),
                "stderr": proc.stderr.decode(errors="replace"), "exit_code": proc.returncode}


    # --- system and dev_tools -----------------------------------------------------------

    def system_metrics(self, path):
        load = os.getloadavg()
        mem = {}
        with open("/proc/meminfo") as f:
            for line in f:
                name, _, rest = line.partition(":")
                mem[name] = int(rest.split()[0])
        total, available = mem["MemTotal"] // 1024, mem.get("MemAvailable", mem["MemFree"]) // 1024
        disk = shutil.disk_usage("/")
        return {"cpu_load_1m": load[0], "cpu_load_5m": load[1], "cpu_load_15m": load[2],
                "memory_used_mb": total - available, "memory_total_mb": total,
                "memory_percent": round((total - available) / total * 100, 1),
                "disk_used_gb": round(disk.used / 2**30, 2), "disk_total_gb": round(disk.total / 2**30, 2),
                "disk_percent": round(disk.used / disk.total * 100, 1),
                "uptime_seconds": round(time.time() - STARTED, 2)}

    def ports(self, path):
        listening = []
        for name, protocol in (("/proc/net/tcp", "tcp"), ("/proc/net/tcp6", "tcp6")):
            try:
                with open(name) as f:
                    rows = f.readlines()[1:]
            except OSError:
                continue
            for row in rows:
                fields = row.split()
                if fields[3] != "0A":
                    continue
                address, port = fields[1].split(":")
                raw = bytes.fromhex(address)
                if len(raw) == 4:
                    text = socket.inet_ntop(socket.AF_INET, raw[::-1])
                else:
                    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                    text = socket.inet_ntop(socket.AF_INET6, words)
                listening.append({"port": int(port, 16), "protocol": protocol, "address": text, "pid": None})
        return {"listening": listening}

    def git_status(self, path):
        cwd = self.resolve(self.query.get("path") or ".")
        try:
            proc = subprocess.run(["git", "status", "--porcelain"], cwd=cwd, capture_output=True,
                                  timeout=30)
        except FileNotFoundError:
            raise ApiError(500, "git is not installed", "FileNotFoundError")
        except subprocess.TimeoutExpired:
            raise ApiError(408, "git timed out after 30s", "TimeoutError")
        if proc.returncode != 0:
            raise ApiError(400, proc.stderr.decode(errors="replace").strip(), "GitError")
        names = {"M": "modified", "A": "added", "D": "deleted", "R": "renamed", "C": "copied",
                 "U": "unmerged", "?": "untracked"}
        files = []
        for line in proc.stdout.decode(errors="replace").splitlines():
            code, name = line[:2], line[3:]
            status = next((names[c] for c in code if c in names), "modified")
            files.append({"path": name.split(" -> ")[-1], "status": status})
        branch = subprocess.run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=cwd,
                                capture_output=True, timeout=30).stdout.decode().strip()
        return {"branch": branch, "clean": not files, "files": files}


STARTED = time.time()

# (method, path) -> endpoint id, which is also the Handler method serving it.
ROUTES = {
    ("GET", "/health"): "health", ("GET", "/commands"): "commands_list",
    ("POST", "/upload"): "upload", ("GET", "/download"): "download",
    ("GET", "/files/list"): "files_list", ("GET", "/files/stat"): "files_stat",
    ("POST", "/files/mkdir"): "files_mkdir", ("DELETE", "/files"): "files_delete",
    ("POST", "/files/move"): "files_move", ("POST", "/files/search"): "files_search",
    ("POST", "/files/upload-stream"): "files_upload_stream",
    ("GET", "/files/download-stream"): "files_download_stream",
    ("POST", "/files/archive"): "files_archive", ("POST", "/shell"): "shell",
    ("GET", "/system/metrics"): "system_metrics", ("GET", "/ports"): "ports",
    ("GET", "/git/status"): "git_status",
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--base-dir",
                        default=os.environ.get("ABX_SERVER_BASE_DIR") or "/home/user")
    args = parser.parse_args()
    Handler.base_dir = os.path.realpath(args.base_dir)
    Handler.token = os.environ.get("ABX_SERVER_TOKEN", "")
    ThreadingHTTPServer.request_queue_size = 128  # the stdlib default backlog is 5
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    host, port = server.server_address[:2]
    print(f"listening on {host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        server.server_close()


if __name__ == "__main__":
    main()
