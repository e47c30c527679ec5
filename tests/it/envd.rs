//! The `envd` group driven by E2B's own Python SDK (`e2b`, pinned in src/pins.env) in
//! debug mode, which talks straight to an envd at `E2B_SANDBOX_URL`: files, commands
//! and terminals through the sync and the async clients, and the SDK's Connect client
//! in its protobuf codec.

use std::process::Command;

use serde_json::Value;

use crate::on_both_drivers;
use crate::support::{tools, Launch, Server, TempDir};

/// The account envd's calls run as when they name none: `user` for a server running as
/// root (the account is made where it is missing, as E2B's templates have it), else the
/// server's own. Call it before a test's first envd call: the server looks the account
/// up for each call, and one made while it does not exist yet runs as root.
fn default_user() -> String {
    static USER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    USER.get_or_init(|| {
        if !rustix::process::geteuid().is_root() {
            let out = Command::new("id").arg("-un").output().unwrap();
            return String::from_utf8_lossy(&out.stdout).trim().to_string();
        }
        let known = Command::new("getent")
            .args(["passwd", "user"])
            .output()
            .unwrap();
        if !known.status.success() {
            let home = if std::path::Path::new("/home/user").exists() {
                "-M"
            } else {
                "-m"
            };
            let made = Command::new("useradd")
                .args([home, "-d", "/home/user", "-s", "/bin/bash", "user"])
                .status()
                .expect("run useradd");
            assert!(made.success(), "useradd user failed");
        }
        "user".to_string()
    })
    .clone()
}

fn envd_server(driver: &'static str, home: &TempDir) -> Server {
    default_user();
    Launch::new(driver)
        .env("ABX_SERVER_ENABLED_GROUPS", "envd")
        // `bash -l` reads the home's profile: an empty one, not the machine's.
        .env("HOME", home.path().to_str().unwrap())
        .start()
}

/// Runs `body` (Python, with `sb`, `base` and `out` in scope) with the SDK pointed at
/// the server; answers what it put in `out`.
fn sdk(server: &Server, base: &str, prelude: &str, body: &str) -> Value {
    let addr = server
        .envd_addr
        .unwrap_or_else(|| panic!("no envd listener: {:?}", server.startup));
    let dir = TempDir::new("e2bscript");
    let script = dir.path().join("client.py");
    let program = format!(
        "import asyncio, json, os, sys\n\
         os.environ['E2B_DEBUG'] = 'true'\n\
         os.environ['E2B_SANDBOX_URL'] = sys.argv[1]\n\
         base = sys.argv[2]\n\
         out = {{}}\n\
         {prelude}\n\
         {body}\n\
         print(json.dumps(out, default=str))\n"
    );
    std::fs::write(&script, program).unwrap();
    let output = Command::new(&tools().e2b_python)
        .arg(&script)
        .arg(format!("http://{addr}"))
        .arg(base)
        .output()
        .expect("run the e2b client");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the e2b client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("the client printed no JSON ({e}): {stdout}"))
}

/// Files and commands through the synchronous `Sandbox`, as the SDK's users write them.
fn the_sync_sdk_drives_files_and_commands(driver: &'static str) {
    let user = default_user();
    let home = TempDir::new("envdhome");
    let base = TempDir::new("envdbase");
    let server = Launch::new(driver)
        .env("ABX_SERVER_ENABLED_GROUPS", "envd")
        .env("HOME", home.path().to_str().unwrap())
        .base_dir(base.path())
        .start();
    let base_path = base.path().to_str().unwrap();
    let out = sdk(
        &server,
        base_path,
        "import time\nfrom e2b import Sandbox, CommandExitException, NotFoundException, FileType\nsb = Sandbox.create()",
        r#"
sb.files.write(base + '/zipped.txt', 'compressed on the wire ' * 100, gzip=True)
out['gzip'] = sb.files.read(base + '/zipped.txt') == 'compressed on the wire ' * 100
sb.files.remove(base + '/zipped.txt')
info = sb.files.write(base + '/a.txt', 'hello world')
out['write'] = [info.name, info.path, info.type.value]
out['read'] = sb.files.read(base + '/a.txt')
out['read_bytes'] = list(sb.files.read(base + '/a.txt', format='bytes')[:5])
sb.files.write_files([{'path': base + '/m/one.txt', 'data': 'one'}, {'path': base + '/m/two.bin', 'data': b'\x00\x01\xff'}])
out['two'] = list(sb.files.read(base + '/m/two.bin', format='bytes'))
out['list'] = sorted((e.name, e.type.value, e.size) for e in sb.files.list(base))
out['deep'] = sorted(e.path for e in sb.files.list(base, depth=2))
out['exists'] = [sb.files.exists(base + '/a.txt'), sb.files.exists(base + '/nope')]
stat = sb.files.get_info(base + '/a.txt')
out['stat'] = [stat.name, stat.type.value, stat.size, stat.permissions, stat.mode & 0o777]
out['owner'] = stat.owner
out['whoami'] = sb.commands.run('whoami; echo $HOME').stdout
# root's own profile may run anything (this machine's runs a pyenv rehash that can
# hang); an empty HOME keeps its login shell quick.
out['as_root'] = sb.commands.run('whoami', user='root', envs={'HOME': base}).stdout if os.geteuid() == 0 else 'root\n'
try:
    sb.commands.run('true', user='no-such-account-here')
except Exception as e:
    out['unknown_user'] = [type(e).__name__, str(e)]
out['mkdir'] = [sb.files.make_dir(base + '/d/e'), sb.files.make_dir(base + '/d/e')]
out['rename'] = sb.files.rename(base + '/a.txt', base + '/d/b.txt').path
try:
    sb.files.read(base + '/a.txt')
    out['missing'] = 'read'
except NotFoundException as e:
    out['missing'] = type(e).__name__
try:
    sb.files.list('/etc')
    out['outside'] = 'listed'
except Exception as e:
    out['outside'] = str(e)
r = sb.commands.run('echo out; echo err >&2; pwd; echo $GREETING', envs={'GREETING': 'hi'}, cwd=base + '/d')
out['run'] = [r.stdout, r.stderr, r.exit_code]
try:
    sb.commands.run('echo partial; exit 3')
except CommandExitException as e:
    out['exit'] = [e.exit_code, e.stdout]
h = sb.commands.run('cat', background=True, stdin=True)
sb.commands.send_stdin(h.pid, 'piped\n')
out['listed'] = h.pid in [p.pid for p in sb.commands.list()]
sb.commands.close_stdin(h.pid)
out['stdin'] = h.wait().stdout
h = sb.commands.run('sleep 30', background=True)
out['kill'] = sb.commands.kill(h.pid)
try:
    h.wait()
except CommandExitException as e:
    out['killed'] = e.exit_code
out['kill_gone'] = sb.commands.kill(h.pid)
big = sb.commands.run("head -c 3000000 /dev/zero | tr '\\0' x")
out['big'] = len(big.stdout)
sb.files.remove(base + '/d')
out['removed'] = sb.files.exists(base + '/d')
import httpx
compose_url = os.environ['E2B_SANDBOX_URL'] + '/files/compose'
sb.files.write(base + '/part1', 'one-')
sb.files.write(base + '/part2', 'two')
r = httpx.post(compose_url, json={'source_paths': [base + '/part1', base + '/part2'], 'destination': base + '/whole.txt'})
out['compose'] = [r.status_code, r.json(), sb.files.read(base + '/whole.txt'), sb.files.exists(base + '/part1'), sb.files.get_info(base + '/whole.txt').owner]
missing = httpx.post(compose_url, json={'source_paths': [base + '/whole.txt', base + '/nope'], 'destination': base + '/never.txt'})
out['compose_missing'] = [missing.status_code, missing.json()['code'], sb.files.exists(base + '/never.txt'), sb.files.exists(base + '/whole.txt')]
sb.files.remove(base + '/whole.txt')
sb.files.make_dir(base + '/w')
watcher = sb.files.watch_dir(base + '/w', recursive=True)
sb.files.write(base + '/w/new.txt', 'x')
seen = []
for _ in range(100):
    seen += [(e.name, e.type.value) for e in watcher.get_new_events()]
    if ('new.txt', 'create') in seen:
        break
    time.sleep(0.05)
out['watched'] = ('new.txt', 'create') in seen
watcher.stop()
try:
    watcher.get_new_events()
except Exception as e:
    out['stopped'] = type(e).__name__
"#,
    );
    assert_eq!(
        out["write"],
        serde_json::json!(["a.txt", format!("{base_path}/a.txt"), "file"])
    );
    assert_eq!(out["read"], "hello world");
    assert_eq!(out["gzip"], true);
    assert_eq!(
        out["read_bytes"],
        serde_json::json!([104, 101, 108, 108, 111])
    );
    assert_eq!(out["two"], serde_json::json!([0, 1, 255]));
    let names: Vec<&str> = out["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e[0].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a.txt", "m"]);
    assert_eq!(out["list"][0], serde_json::json!(["a.txt", "file", 11]));
    assert_eq!(out["list"][1][1], "dir");
    assert_eq!(
        out["deep"],
        serde_json::json!([
            format!("{base_path}/a.txt"),
            format!("{base_path}/m"),
            format!("{base_path}/m/one.txt"),
            format!("{base_path}/m/two.bin"),
        ])
    );
    assert_eq!(out["exists"], serde_json::json!([true, false]));
    assert_eq!(
        out["stat"],
        serde_json::json!(["a.txt", "file", 11, "-rw-r--r--", 0o644])
    );
    assert_eq!(out["mkdir"], serde_json::json!([true, false]));
    assert_eq!(out["owner"], user.as_str());
    assert!(
        out["whoami"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{user}\n")),
        "{}",
        out["whoami"]
    );
    assert_eq!(out["as_root"], "root\n");
    assert_eq!(out["unknown_user"][0], "InvalidArgumentException");
    assert!(
        out["unknown_user"][1]
            .as_str()
            .unwrap()
            .contains("user 'no-such-account-here' does not exist"),
        "{}",
        out["unknown_user"]
    );
    assert_eq!(out["rename"], format!("{base_path}/d/b.txt"));
    assert_eq!(out["missing"], "FileNotFoundException");
    assert!(
        out["outside"]
            .as_str()
            .unwrap()
            .contains("outside the allowed directories"),
        "{}",
        out["outside"]
    );
    assert_eq!(
        out["run"],
        serde_json::json!(["out\n".to_string() + base_path + "/d\nhi\n", "err\n", 0])
    );
    assert_eq!(out["exit"], serde_json::json!([3, "partial\n"]));
    assert_eq!(out["listed"], true);
    assert_eq!(out["stdin"], "piped\n");
    assert_eq!(out["kill"], true);
    assert_eq!(out["killed"], -1);
    assert_eq!(out["kill_gone"], false);
    assert_eq!(out["big"], 3_000_000);
    assert_eq!(out["removed"], false);
    assert_eq!(
        out["compose"],
        serde_json::json!([
            200,
            {"name": "whole.txt", "type": "file", "path": format!("{base_path}/whole.txt")},
            "one-two",
            false,
            user
        ])
    );
    // A missing source: 404, nothing written, the other source kept.
    assert_eq!(
        out["compose_missing"],
        serde_json::json!([404, 404, false, true])
    );
    assert_eq!(out["watched"], true);
    assert_eq!(out["stopped"], "SandboxException");
}

/// The asynchronous client, a terminal through it, and the SDK's Connect client in the
/// protobuf codec (what other Connect clients send).
fn the_async_sdk_drives_a_terminal_and_protobuf_works(driver: &'static str) {
    let home = TempDir::new("envdhome");
    let server = envd_server(driver, &home);
    let base = server.base_dir().to_str().unwrap().to_string();
    let out = sdk(
        &server,
        &base,
        "from e2b import AsyncSandbox\nfrom e2b.sandbox.commands.command_handle import PtySize",
        r#"
async def main():
    sb = await AsyncSandbox.create()
    await sb.files.write(base + '/async.txt', 'from async')
    out['read'] = await sb.files.read(base + '/async.txt')
    r = await sb.commands.run('echo async-$((6*7))')
    out['run'] = r.stdout
    seen = bytearray()
    done = asyncio.Event()
    def on_data(data):
        seen.extend(data)
        if b'pty-42' in seen:
            done.set()
    term = await sb.pty.create(PtySize(rows=24, cols=80), on_data=on_data)
    await sb.pty.resize(term.pid, PtySize(rows=30, cols=100))
    await sb.pty.send_stdin(term.pid, b'stty size; echo pty-$((6*7))\n')
    await asyncio.wait_for(done.wait(), 20)
    out['pty_size'] = '30 100' in seen.decode(errors='replace')
    out['pty_output'] = seen.decode(errors='replace')
    out['pty_kill'] = await sb.pty.kill(term.pid)
    await sb.files.make_dir(base + '/watched/sub')
    events = []
    created = asyncio.Event()
    def on_event(event):
        events.append(event)
        if event.name == 'sub/f.txt' and event.type.value == 'create':
            created.set()
    handle = await sb.files.watch_dir(base + '/watched', on_event, recursive=True, include_entry=True)
    await sb.files.write(base + '/watched/sub/f.txt', 'watched!')
    await asyncio.wait_for(created.wait(), 20)
    event = [e for e in events if e.name == 'sub/f.txt'][0]
    out['watch_entry'] = [event.entry.name, event.entry.path.endswith('/watched/sub/f.txt')] if event.entry else None
    await handle.stop()
    # StreamInput, the client stream the SDK does not offer: a start naming the
    # process, then data, sent as a chunked body.
    h = await sb.commands.run('cat', background=True, stdin=True)
    from e2b.envd.process import process_pb2
    from google.protobuf import json_format
    import httpx, struct
    def frame(message):
        data = json_format.MessageToJson(message).encode()
        return struct.pack('>BI', 0, len(data)) + data
    async def body():
        yield frame(process_pb2.StreamInputRequest(start=process_pb2.StreamInputRequest.StartEvent(process=process_pb2.ProcessSelector(pid=h.pid))))
        for word in [b'streamed ', b'input\n']:
            yield frame(process_pb2.StreamInputRequest(data=process_pb2.StreamInputRequest.DataEvent(input=process_pb2.ProcessInput(stdin=word))))
            await asyncio.sleep(0.05)
        yield struct.pack('>BI', 2, 2) + b'{}'
    async with httpx.AsyncClient() as client:
        r = await client.post(os.environ['E2B_SANDBOX_URL'] + '/process.Process/StreamInput', content=body(),
                              headers={'Content-Type': 'application/connect+json', 'Connect-Protocol-Version': '1'})
    out['stream_input'] = [r.status_code, list(r.content[-7:])]
    await sb.commands.close_stdin(h.pid)
    out['streamed'] = (await h.wait()).stdout
asyncio.run(main())

import httpcore
from e2b_connect.client import Client
from e2b.envd.filesystem import filesystem_pb2
pool = httpcore.ConnectionPool()
stat = Client(pool=pool, url=os.environ['E2B_SANDBOX_URL'] + '/filesystem.Filesystem/Stat',
              response_type=filesystem_pb2.StatResponse, json=False)
entry = stat.call_unary(filesystem_pb2.StatRequest(path=base + '/async.txt')).entry
out['proto_stat'] = [entry.name, entry.size, entry.type == filesystem_pb2.FILE_TYPE_FILE]
try:
    stat.call_unary(filesystem_pb2.StatRequest(path=base + '/nope'))
except Exception as e:
    out['proto_missing'] = [str(e.status), e.message]
"#,
    );
    assert_eq!(out["read"], "from async");
    assert_eq!(out["run"], "async-42\n");
    assert_eq!(
        out["pty_size"], true,
        "the terminal's output: {:?}",
        out["pty_output"]
    );
    assert_eq!(out["pty_kill"], true);
    assert_eq!(out["watch_entry"], serde_json::json!(["f.txt", true]));
    // The answer ends with the end-of-stream envelope `{}`.
    assert_eq!(
        out["stream_input"],
        serde_json::json!([200, [2, 0, 0, 0, 2, 123, 125]])
    );
    assert_eq!(out["streamed"], "streamed input\n");
    assert_eq!(
        out["proto_stat"],
        serde_json::json!(["async.txt", 10, true])
    );
    assert_eq!(out["proto_missing"][0], "Code.not_found");
}

/// The port is bound only while the group is on, and the group is off by default.
#[test]
fn the_envd_port_is_bound_only_with_the_group() {
    let server = Launch::new("uring").start();
    assert!(server.envd_addr.is_none(), "{:?}", server.startup);
    let home = TempDir::new("envdhome");
    let server = envd_server("uring", &home);
    let addr = server.envd_addr.expect("the envd port is bound");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    use std::io::{Read, Write};
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 204"), "{answer}");
    // /capabilities lists the group's endpoints with the port they are served on.
    let capabilities = server.get("/capabilities").json();
    assert_eq!(capabilities["groups"]["envd"], true);
    let start = &capabilities["endpoints"]["envd_process_start"];
    assert_eq!(start["port"], addr.port());
    assert_eq!(start["group"], "envd");
    // The port's own OpenAPI document names its RPCs and REST routes.
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .write_all(b"GET /openapi.json HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let body = if answer.contains("chunked") {
        body.lines().nth(1).unwrap_or_default()
    } else {
        body
    };
    let document: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert_eq!(
        document["paths"]["/process.Process/Start"]["post"]["operationId"],
        "envd_process_start"
    );
    assert!(document["paths"]["/files"]["get"].is_object());
    // A route of E2B's envd this server does not serve is refused in envd's words.
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .write_all(
            b"POST /freeze HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    assert!(
        answer.contains(r#""code":404"#) && answer.contains("VM-level routes are not served"),
        "{answer}"
    );
}

/// Identities on the envd port: `X-Access-Token` (envd's header) selects the caller, a
/// narrow one is refused what its scopes do not hold (in Connect's error shape, naming
/// the scope), processes and watchers of another identity are not found, and the
/// policy's command rules apply to `Start`.
fn identities_stay_apart_on_the_envd_port(driver: &'static str) {
    default_user();
    let home = TempDir::new("envdhome");
    let dir = TempDir::new("envdpolicy");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "identities:\n  - {id: alice, scopes: [\"*\"], token_env: ALICE_TOKEN}\n  - {id: bob, scopes: [\"*\"], token_env: BOB_TOKEN}\n  - {id: reader, scopes: [\"files:read\"], token_env: READER_TOKEN}\nendpoints:\n  envd_process_start: {commands: {deny: [nc]}}\n",
    )
    .unwrap();
    let server = Launch::new(driver)
        .env("ABX_SERVER_ENABLED_GROUPS", "envd")
        .env("HOME", home.path().to_str().unwrap())
        .env("ABX_SERVER_POLICY", policy.to_str().unwrap())
        .env("ALICE_TOKEN", "alice-secret")
        .env("BOB_TOKEN", "bob-secret")
        .env("READER_TOKEN", "reader-secret")
        .start();
    let base = server.base_dir().to_str().unwrap().to_string();
    let out = sdk(
        &server,
        &base,
        r#"
from e2b import Sandbox, AuthenticationException, SandboxException, CommandExitException
def as_(token):
    sb = Sandbox.create()
    # What Sandbox.connect sets from the sandbox's envd access token outside debug mode.
    if token:
        sb.connection_config._ConnectionConfig__extra_sandbox_headers['X-Access-Token'] = token
    return sb
def outcome(fn):
    try:
        return ['ok', fn()]
    except Exception as e:
        return [type(e).__name__, str(e)]
"#,
        r#"
alice, bob, reader, nobody = as_('alice-secret'), as_('bob-secret'), as_('reader-secret'), as_(None)
out['nobody'] = outcome(lambda: nobody.files.list(base))[0]
alice.files.write(base + '/shared.txt', 'for all')
out['reader_reads'] = outcome(lambda: reader.files.read(base + '/shared.txt'))
out['reader_runs'] = outcome(lambda: reader.commands.run('true').exit_code)
out['reader_writes'] = outcome(lambda: reader.files.write(base + '/x.txt', 'no'))[0]
h = alice.commands.run('sleep 30', background=True)
out['alice_lists'] = h.pid in [p.pid for p in alice.commands.list()]
out['bob_lists'] = h.pid in [p.pid for p in bob.commands.list()]
out['bob_kills'] = bob.commands.kill(h.pid)
out['bob_stdin'] = outcome(lambda: bob.commands.send_stdin(h.pid, 'x'))[0]
w = alice.files.watch_dir(base)
out['bob_watcher'] = outcome(lambda: bob.files._rpc.get_watcher_events(__import__('e2b.envd.filesystem.filesystem_pb2', fromlist=['x']).GetWatcherEventsRequest(watcher_id=w._watcher_id)))[0]
w.stop()
out['denied_command'] = outcome(lambda: alice.commands.run('nc -h'))
out['alice_kills'] = alice.commands.kill(h.pid)
"#,
    );
    assert_eq!(out["nobody"], "AuthenticationException");
    assert_eq!(out["reader_reads"], serde_json::json!(["ok", "for all"]));
    assert_eq!(out["reader_runs"][0], "SandboxException");
    assert!(
        out["reader_runs"][1]
            .as_str()
            .unwrap()
            .contains("process:run"),
        "{}",
        out["reader_runs"]
    );
    assert_eq!(out["reader_writes"], "SandboxException");
    assert_eq!(out["alice_lists"], true);
    assert_eq!(out["bob_lists"], false);
    assert_eq!(out["bob_kills"], false);
    assert_eq!(out["bob_stdin"], "NotFoundException");
    assert_eq!(out["bob_watcher"], "ConnectException");
    assert_eq!(out["denied_command"][0], "SandboxException");
    assert!(
        out["denied_command"][1]
            .as_str()
            .unwrap()
            .contains("endpoints.envd_process_start.commands"),
        "{}",
        out["denied_command"]
    );
    assert_eq!(out["alice_kills"], true);
}

/// As on E2B, a relative path is the user's home's, and commands start there: with the
/// base directory `/home`, `rel.txt` is `/home/user/rel.txt`, written as `user`.
fn relative_paths_and_commands_start_in_the_users_home(driver: &'static str) {
    if default_user() != "user" {
        println!("skipped: needs the server to run as root (to run as `user`)");
        return;
    }
    let home = TempDir::new("envdhome");
    let server = Launch::new(driver)
        .env("ABX_SERVER_ENABLED_GROUPS", "envd")
        .env("HOME", home.path().to_str().unwrap())
        .base_dir(std::path::Path::new("/home"))
        .start();
    let name = format!("abx-envd-{driver}-{}.txt", std::process::id());
    let out = sdk(
        &server,
        "/home",
        "from e2b import Sandbox\nsb = Sandbox.create()",
        &format!(
            r#"
info = sb.files.write('{name}', 'relative')
out['path'] = info.path
out['owner'] = sb.files.get_info('{name}').owner
out['pwd'] = sb.commands.run('pwd; cat {name}').stdout
sb.files.remove('{name}')
"#
        ),
    );
    assert_eq!(out["path"], format!("/home/user/{name}"));
    assert_eq!(out["owner"], "user");
    assert_eq!(out["pwd"], "/home/user\nrelative");
}

/// envd's signed file URLs (`download_url`, `upload_url` of the SDK, as it makes them
/// for a sandbox with an access token): a URL signed with the caller's token works
/// without the token, for that path, operation and user only, until it expires.
fn signed_urls_open_one_file_for_one_operation(driver: &'static str) {
    default_user();
    let home = TempDir::new("envdhome");
    let server = Launch::new(driver)
        .env("ABX_SERVER_ENABLED_GROUPS", "envd")
        .env("HOME", home.path().to_str().unwrap())
        .env("ABX_SERVER_TOKEN", "envd-secret")
        .start();
    let base = server.base_dir().to_str().unwrap().to_string();
    let out = sdk(
        &server,
        &base,
        "import httpx\nfrom e2b import Sandbox\nsb = Sandbox.create()\nsb.connection_config._ConnectionConfig__extra_sandbox_headers['X-Access-Token'] = 'envd-secret'\n# What Sandbox.connect keeps outside debug mode, and signs URLs with.\nsb._SandboxBase__envd_access_token = 'envd-secret'",
        r#"
path = base + '/signed.txt'
sb.files.write(path, 'signed content')
url = sb.download_url(path, use_signature_expiration=120)
out['read'] = [httpx.get(url).status_code, httpx.get(url).text]
out['no_signature'] = httpx.get(url.split('&signature=')[0]).status_code
out['other_path'] = httpx.get(url.replace('signed.txt', 'other.txt')).status_code
up = sb.upload_url(base + '/uploaded.txt')
out['write'] = httpx.post(up, files={'file': ('uploaded.txt', b'via signed url')}).status_code
out['written'] = sb.files.read(base + '/uploaded.txt')
out['read_as_write'] = httpx.post(url, files={'file': ('x', b'no')}).status_code
# /init, as E2B's orchestrator sends it, changes no credential here.
init = httpx.post(os.environ['E2B_SANDBOX_URL'] + '/init', json={'accessToken': 'planted', 'envVars': {'A': 'b'}},
                  headers={'X-Access-Token': 'envd-secret'})
planted = httpx.get(os.environ['E2B_SANDBOX_URL'] + '/files', params={'path': path}, headers={'X-Access-Token': 'planted'})
out['init'] = [init.status_code, planted.status_code]
expired = sb.download_url(path, use_signature_expiration=-5)
out['expired'] = [httpx.get(expired).status_code, httpx.get(expired).json()['message']]
"#,
    );
    assert_eq!(out["read"], serde_json::json!([200, "signed content"]));
    assert_eq!(out["no_signature"], 401);
    assert_eq!(out["other_path"], 401);
    assert_eq!(out["write"], 200);
    assert_eq!(out["written"], "via signed url");
    assert_eq!(out["read_as_write"], 401);
    assert_eq!(out["init"], serde_json::json!([204, 401]));
    assert_eq!(out["expired"][0], 401);
    assert!(
        out["expired"][1].as_str().unwrap().contains("expired"),
        "{}",
        out["expired"]
    );
}

/// The OpenAI Agents SDK's `SandboxAgent` on its `E2BSandboxClient` (openai-agents,
/// pinned), its model a stub on 127.0.0.1 that asks for a shell command and then a patch:
/// both really change the workspace, as the `user` account. The SDK makes its workspace
/// root with `cwd="/"`, so this server's base directory is `/`, as E2B gives the SDK the
/// whole machine.
fn an_openai_agents_sandbox_agent_changes_the_workspace(driver: &'static str) {
    let user = default_user();
    // The SDK installs its helpers under /tmp/openai-agents as the sandbox's user; a
    // directory another account made there (an earlier run as root) would refuse them.
    if let Ok(meta) = std::fs::metadata("/tmp/openai-agents") {
        use std::os::unix::fs::MetadataExt;
        let uid = Command::new("id").args(["-u", &user]).output().unwrap();
        if String::from_utf8_lossy(&uid.stdout).trim() != meta.uid().to_string() {
            let _ = std::fs::remove_dir_all("/tmp/openai-agents");
        }
    }
    let home = TempDir::new("envdhome");
    let workspace = TempDir::new("envdworkspace");
    let server = Launch::new(driver)
        .env("ABX_SERVER_ENABLED_GROUPS", "envd")
        .env("HOME", home.path().to_str().unwrap())
        .base_dir(std::path::Path::new("/"))
        .start();
    let root = workspace.path().join("ws");
    let out = sdk(
        &server,
        root.to_str().unwrap(),
        r#"
import threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
requests = []
class Stub(BaseHTTPRequestHandler):
    """OpenAI's Responses API as the agent's model: a shell command, then a patch, then
    a final message, each answer chosen by the tool outputs the request carries."""
    def log_message(self, *args):
        pass
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers['content-length'])))
        outputs = [i.get('output') for i in body.get('input', []) if isinstance(i, dict)
                   and i.get('type') in ('function_call_output', 'custom_tool_call_output')]
        requests.append({'path': self.path, 'outputs': outputs, 'tools': sorted(t.get('name', t.get('type')) for t in body.get('tools', []))})
        if not outputs:
            item = {'type': 'function_call', 'id': 'fc_1', 'call_id': 'call_1', 'name': 'exec_command', 'status': 'completed',
                    'arguments': json.dumps({'cmd': 'echo made-by-shell > shell.txt && whoami'})}
        elif len(outputs) == 1:
            item = {'type': 'custom_tool_call', 'id': 'ctc_1', 'call_id': 'call_2', 'name': 'apply_patch',
                    'input': '*** Begin Patch\n*** Add File: patched.txt\n+made by a patch\n*** End Patch\n'}
        else:
            item = {'type': 'message', 'id': 'msg_1', 'role': 'assistant', 'status': 'completed',
                    'content': [{'type': 'output_text', 'text': 'done', 'annotations': []}]}
        answer = json.dumps({'id': 'resp_%d' % len(requests), 'object': 'response', 'created_at': int(time.time()),
                             'model': 'stub', 'status': 'completed', 'output': [item], 'parallel_tool_calls': False,
                             'tool_choice': 'auto', 'tools': [],
                             'usage': {'input_tokens': 1, 'output_tokens': 1, 'total_tokens': 2,
                                       'input_tokens_details': {'cached_tokens': 0},
                                       'output_tokens_details': {'reasoning_tokens': 0}}}).encode()
        self.send_response(200)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)
stub = ThreadingHTTPServer(('127.0.0.1', 0), Stub)
threading.Thread(target=stub.serve_forever, daemon=True).start()
stub_url = 'http://127.0.0.1:%d/v1' % stub.server_address[1]
os.environ['OPENAI_API_KEY'] = 'stub'
os.environ['OPENAI_BASE_URL'] = stub_url
from openai import AsyncOpenAI
from agents import Runner, RunConfig, OpenAIResponsesModel, set_tracing_disabled
from agents.run_config import SandboxRunConfig
from agents.sandbox import SandboxAgent, Manifest
from agents.extensions.sandbox.e2b import E2BSandboxClient, E2BSandboxClientOptions
set_tracing_disabled(True)
"#,
        r#"
model = OpenAIResponsesModel(model='stub', openai_client=AsyncOpenAI(base_url=stub_url, api_key='stub'))
agent = SandboxAgent(name='worker', instructions='work', model=model, default_manifest=Manifest(root=base))
async def main():
    config = RunConfig(sandbox=SandboxRunConfig(client=E2BSandboxClient(), options=E2BSandboxClientOptions(sandbox_type='e2b')))
    result = await Runner.run(agent, 'make two files', run_config=config)
    out['final'] = result.final_output
asyncio.run(main())
out['requests'] = requests
out['shell'] = open(base + '/shell.txt').read()
out['patched'] = open(base + '/patched.txt').read()
import pwd
out['owners'] = [pwd.getpwuid(os.stat(base + '/' + name).st_uid).pw_name for name in ('shell.txt', 'patched.txt')]
"#,
    );
    assert_eq!(out["final"], "done");
    let requests = out["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 3, "{requests:?}");
    assert!(
        requests[0]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t == "exec_command"),
        "{requests:?}"
    );
    let shell_output = requests[1]["outputs"][0].as_str().unwrap();
    assert!(
        shell_output.contains("exited with code 0") && shell_output.contains(&user),
        "{shell_output}"
    );
    assert_eq!(requests[2]["outputs"][1], "Created patched.txt");
    assert_eq!(out["shell"], "made-by-shell\n");
    // What the SDK's patch editor writes (it keeps no final newline).
    assert_eq!(out["patched"], "made by a patch");
    assert_eq!(out["owners"], serde_json::json!([user, user]));
}

/// The SDK's generated Connect clients in the protobuf codec, streaming: `Start` with a
/// tag and stdin, `Connect` by that tag, `SendInput` and `List` by tag, and keepalives on
/// a quiet stream (`Keepalive-Ping-Interval: 1`).
fn protobuf_streams_tags_and_keepalives(driver: &'static str) {
    let home = TempDir::new("envdhome");
    let server = envd_server(driver, &home);
    let base = server.base_dir().to_str().unwrap().to_string();
    let out = sdk(
        &server,
        &base,
        r#"
import httpcore
from e2b.envd.process import process_pb2
from e2b.envd.process.process_connect import ProcessClient
client = ProcessClient(os.environ['E2B_SANDBOX_URL'], pool=httpcore.ConnectionPool())
def kind(response):
    event = response.event
    for name in ('start', 'data', 'end', 'keepalive'):
        if event.HasField(name):
            if name == 'data':
                return 'data:' + (event.data.stdout or event.data.stderr).decode()
            if name == 'end':
                return 'end:%d:%s' % (event.end.exit_code, event.end.status)
            return name
"#,
        r#"
script = 'echo first; read line; echo got:$line; sleep 1.5; echo late'
started = client.start(process_pb2.StartRequest(
    process=process_pb2.ProcessConfig(cmd='/bin/sh', args=['-c', script]), tag='worker', stdin=True),
    headers={'Keepalive-Ping-Interval': '1'})
out['start'] = [kind(next(started)), kind(next(started))]
followed = client.connect(process_pb2.ConnectRequest(process=process_pb2.ProcessSelector(tag='worker')),
                          headers={'Keepalive-Ping-Interval': '1'})
out['connect_first'] = kind(next(followed))
listed = client.list(process_pb2.ListRequest())
out['listed'] = [(p.tag, p.config.cmd) for p in listed.processes]
client.send_input(process_pb2.SendInputRequest(process=process_pb2.ProcessSelector(tag='worker'),
                                               input=process_pb2.ProcessInput(stdin=b'hello\n')))
out['connect_rest'] = [kind(r) for r in followed]
out['start_rest'] = [kind(r) for r in started]
"#,
    );
    assert_eq!(out["start"][0], "start");
    assert_eq!(out["start"][1], "data:first\n");
    assert_eq!(out["connect_first"], "start");
    assert_eq!(out["listed"], serde_json::json!([["worker", "/bin/sh"]]));
    let rest: Vec<&str> = out["connect_rest"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    let got = rest
        .iter()
        .position(|k| *k == "data:got:hello\n")
        .expect("got:hello");
    let late = rest.iter().position(|k| *k == "data:late\n").expect("late");
    assert!(
        rest[got..late].contains(&"keepalive"),
        "no keepalive while the process slept: {rest:?}"
    );
    assert_eq!(rest.last(), Some(&"end:0:exit status 0"), "{rest:?}");
    let start_rest: Vec<&str> = out["start_rest"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .filter(|k| *k != "keepalive")
        .collect();
    assert_eq!(
        start_rest,
        ["data:got:hello\n", "data:late\n", "end:0:exit status 0"]
    );
}

/// 64 MiB through the SDK's streamed upload (a file object: `application/octet-stream`)
/// and its streamed read cost the server far less memory than the file.
fn large_files_stream_in_bounded_memory(driver: &'static str) {
    let home = TempDir::new("envdhome");
    let server = envd_server(driver, &home);
    let base = server.base_dir().to_str().unwrap().to_string();
    let pid = server.child.id();
    let before = crate::support::status_kib(pid, "VmRSS");
    let out = sdk(
        &server,
        &base,
        "import io, hashlib\nfrom e2b import Sandbox\nsb = Sandbox.create()",
        r#"
size = 64 * 1024 * 1024
data = bytes(range(256)) * (size // 256)
sb.files.write(base + '/big.bin', io.BytesIO(data), use_octet_stream=True)
digest, total = hashlib.sha256(), 0
with sb.files.read(base + '/big.bin', format='stream') as stream:
    for chunk in stream:
        digest.update(chunk)
        total += len(chunk)
out['read'] = [total, digest.hexdigest() == hashlib.sha256(data).hexdigest()]
"#,
    );
    assert_eq!(out["read"], serde_json::json!([64 * 1024 * 1024, true]));
    let peak = crate::support::status_kib(pid, "VmHWM");
    assert!(
        peak < before + 32 * 1024,
        "the server's peak resident set grew from {before} KiB to {peak} KiB for a 64 MiB file"
    );
}

/// `POST /files` holds a small body's files in memory and writes each in one step at
/// the end: a gzip body that inflates past what is held moves to a temporary file, a
/// multipart body whose second target cannot be written changes no file, and a small
/// body is refused as a large one is.
fn small_uploads_write_like_streamed_ones(driver: &'static str) {
    let home = TempDir::new("envdhome");
    let server = envd_server(driver, &home);
    let base = server.base_dir().to_str().unwrap().to_string();
    std::fs::create_dir(server.base_dir().join("adir")).unwrap();
    let out = sdk(
        &server,
        &base,
        "import gzip, httpx\nfrom e2b import Sandbox\nsb = Sandbox.create()",
        r#"
url = os.environ['E2B_SANDBOX_URL'] + '/files'
inflated = bytes(range(256)) * 800
r = httpx.post(url, params={'path': base + '/z.bin'}, content=gzip.compress(inflated),
               headers={'Content-Type': 'application/octet-stream', 'Content-Encoding': 'gzip'})
out['gzip'] = [r.status_code, len(gzip.compress(inflated)) < 65536, sb.files.read(base + '/z.bin', format='bytes') == inflated]
r = httpx.post(url, files=[('file', (base + '/first.txt', b'first')), ('file', (base + '/adir', b'x'))])
out['second_refused'] = [r.status_code, sb.files.exists(base + '/first.txt')]
small = httpx.post(url, files={'file': (base + '/adir', b'x')})
large = httpx.post(url, files={'file': (base + '/adir', b'x' * 300000)})
out['refusals'] = [small.status_code, small.text, large.status_code, large.text]
r = httpx.post(url, files={'file': (base + '/s.txt', b'small body')})
out['small'] = [r.status_code, r.json()[0]['name'], sb.files.read(base + '/s.txt')]
r = httpx.post(url, params={'path': base + '/r.txt'}, content=b'raw small', headers={'Content-Type': 'application/octet-stream'})
out['raw'] = [r.status_code, sb.files.read(base + '/r.txt')]
r = httpx.post(url, params={'path': base + '/g.txt'}, content=gzip.compress(b'gz' * 1000),
               headers={'Content-Type': 'application/octet-stream', 'Content-Encoding': 'gzip'})
out['small_gzip'] = [r.status_code, sb.files.read(base + '/g.txt') == 'gz' * 1000]
r = httpx.post(url, files=[('file', (base + '/m/one.txt', b'one')), ('file', (base + '/m/two.txt', b'two' * 30000))])
out['two'] = [r.status_code, [f['name'] for f in r.json()], sb.files.read(base + '/m/one.txt'), len(sb.files.read(base + '/m/two.txt'))]
"#,
    );
    assert_eq!(out["gzip"], serde_json::json!([200, true, true]));
    assert!(out["second_refused"][0].as_u64().unwrap() >= 400, "{out}");
    assert_eq!(out["second_refused"][1], false, "{out}");
    assert!(out["refusals"][0].as_u64().unwrap() >= 400, "{out}");
    assert_eq!(out["refusals"][0], out["refusals"][2], "{out}");
    assert_eq!(out["refusals"][1], out["refusals"][3], "{out}");
    assert_eq!(
        out["small"],
        serde_json::json!([200, "s.txt", "small body"])
    );
    assert_eq!(out["raw"], serde_json::json!([200, "raw small"]));
    assert_eq!(out["small_gzip"], serde_json::json!([200, true]));
    assert_eq!(
        out["two"],
        serde_json::json!([200, ["one.txt", "two.txt"], "one", 90000])
    );
    let mut names: Vec<String> = std::fs::read_dir(server.base_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["adir", "g.txt", "m", "r.txt", "s.txt", "z.bin"]);
    let mut names: Vec<String> = std::fs::read_dir(server.base_dir().join("m"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["one.txt", "two.txt"]);
}

on_both_drivers!(
    large_files_stream_in_bounded_memory,
    small_uploads_write_like_streamed_ones,
    protobuf_streams_tags_and_keepalives,
    an_openai_agents_sandbox_agent_changes_the_workspace,
    signed_urls_open_one_file_for_one_operation,
    relative_paths_and_commands_start_in_the_users_home,
    identities_stay_apart_on_the_envd_port,
    the_sync_sdk_drives_files_and_commands,
    the_async_sdk_drives_a_terminal_and_protobuf_works,
);
