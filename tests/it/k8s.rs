//! The k8s_runtime group, driven by kubernetes-sigs/agent-sandbox's own Python client
//! (`k8s-agent-sandbox`, pinned in src/pins.env) over a direct connection (no cluster:
//! its K8sHelper is a stand-in that knows no sandbox), and the example manifests.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::on_both_drivers;
use crate::support::{pin, tools, Launch, Server, TempDir};

/// Runs `body` (Python, with `sb` a connected client Sandbox and `status(fn)` the HTTP
/// status an operation ends in) against `url` and returns the JSON it prints last.
fn client(url: &str, token: Option<&str>, body: &str) -> Value {
    let dir = TempDir::new("k8s-client");
    let script = dir.path().join("drive.py");
    let program = format!(
        r#"
import json, sys
from importlib.metadata import version
from k8s_agent_sandbox.sandbox import Sandbox
from k8s_agent_sandbox.models import SandboxDirectConnectionConfig
from k8s_agent_sandbox.exceptions import SandboxRequestError

assert version("k8s-agent-sandbox") == sys.argv[3], version("k8s-agent-sandbox")

class NoCluster:
    """Stands in for K8sHelper: the direct connection needs no cluster."""
    injected_api_client = None
    def get_sandbox(self, name, namespace):
        return {{}}

headers = {{"X-Access-Token": sys.argv[2]}} if sys.argv[2] else {{}}
sb = Sandbox("claim-1", "sandbox-1", "default",
             connection_config=SandboxDirectConnectionConfig(api_url=sys.argv[1], extra_headers=headers),
             k8s_helper=NoCluster())

def status(fn):
    try:
        fn()
        return 200
    except SandboxRequestError as e:
        return e.status_code

out = {{}}
{body}
print(json.dumps(out))
"#
    );
    std::fs::write(&script, program).unwrap();
    let output = Command::new(&tools().python)
        .arg(&script)
        .arg(url)
        .arg(token.unwrap_or(""))
        .arg(pin("K8S_AGENT_SANDBOX_VERSION"))
        .output()
        .expect("run the client");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "client script failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("client printed no JSON ({e}): {stdout}"))
}

fn k8s_server(driver: &'static str, extra: &[(&str, &str)]) -> Server {
    let mut launch = Launch::new(driver).env("ABX_SERVER_ENABLED_GROUPS", "k8s_runtime");
    for (name, value) in extra {
        launch = launch.env(name, value);
    }
    launch.start()
}

fn url(server: &Server) -> String {
    let addr = server
        .k8s_addr
        .unwrap_or_else(|| panic!("no k8s_runtime listener: {:?}", server.startup));
    format!("http://{addr}")
}

fn runs_writes_reads_lists_and_checks_existence(driver: &'static str) {
    let server = k8s_server(driver, &[]);
    let base = server.base_dir().to_path_buf();
    std::fs::create_dir_all(base.join("sub")).unwrap();
    std::fs::write(base.join("sub/old.txt"), b"12345").unwrap();
    let out = client(
        &url(&server),
        None,
        r#"
r = sb.commands.run("echo hello 'two words'")
out["run"] = [r.stdout, r.stderr, r.exit_code, r.timed_out]
r = sb.commands.run("sh -c 'echo oops >&2; exit 3'")
out["fail"] = [r.stdout, r.stderr, r.exit_code]
r = sb.commands.run("pwd")
out["pwd"] = r.stdout.strip()
r = sb.commands.run("no-such-program-xyz")
out["missing"] = [r.exit_code, r.stderr]
r = sb.commands.run("sleep 5", command_timeout=0.5)
out["timeout"] = [r.exit_code, r.timed_out]
payload = bytes(range(256)) * 1000
sb.files.write("data/deep/blob.bin", payload)
out["roundtrip"] = sb.files.read("data/deep/blob.bin") == payload
sb.files.write("notes/a b%20c.txt", "spaced")
out["spaced"] = sb.files.read("notes/a b%20c.txt").decode()
sb.files.write("data/deep/blob.bin", b"replaced")
out["replaced"] = sb.files.read("data/deep/blob.bin").decode()
out["exists"] = [sb.files.exists("sub/old.txt"), sb.files.exists("sub"), sb.files.exists("sub/nope")]
entries = sb.files.list("sub")
out["list"] = [[e.name, e.size, e.type, e.modified.year] for e in entries]
out["root"] = sorted(e.name + ":" + e.type for e in sb.files.list("."))
out["missing_read"] = status(lambda: sb.files.read("sub/nope"))
out["read_dir"] = status(lambda: sb.files.read("sub"))
out["list_file"] = status(lambda: sb.files.list("sub/old.txt"))
"#,
    );
    assert_eq!(
        out["run"],
        serde_json::json!(["hello two words\n", "", 0, false])
    );
    assert_eq!(out["fail"], serde_json::json!(["", "oops\n", 3]));
    assert_eq!(
        out["pwd"],
        std::fs::canonicalize(&base).unwrap().to_str().unwrap()
    );
    assert_eq!(out["missing"][0], 1);
    assert!(
        out["missing"][1]
            .as_str()
            .unwrap()
            .contains("No such file or directory"),
        "{out}"
    );
    assert_eq!(out["timeout"], serde_json::json!([124, true]));
    assert_eq!(out["roundtrip"], true);
    let blob = std::fs::read(base.join("data/deep/blob.bin")).unwrap();
    assert_eq!(
        blob, b"replaced",
        "the file is on disk where the client named it"
    );
    assert_eq!(out["spaced"], "spaced");
    assert!(base.join("notes/a b%20c.txt").is_file());
    assert_eq!(out["replaced"], "replaced");
    assert_eq!(out["exists"], serde_json::json!([true, true, false]));
    let year = out["list"][0][3].as_i64().unwrap();
    assert!(year >= 2024, "{out}");
    assert_eq!(
        out["list"],
        serde_json::json!([["old.txt", 5, "file", year]])
    );
    let root: Vec<&str> = out["root"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(root, ["data:directory", "notes:directory", "sub:directory"]);
    assert_eq!(out["missing_read"], 404);
    assert_eq!(out["read_dir"], 404);
    assert_eq!(out["list_file"], 404);
    // The other port keeps its own routes: the runtime's are not on the API port.
    assert_eq!(server.get("/exists/sub").status, 404);
}

fn escapes_are_refused(driver: &'static str) {
    let outside = TempDir::new("k8s-outside");
    std::fs::write(outside.path().join("secret.txt"), b"top secret").unwrap();
    let server = k8s_server(driver, &[]);
    let base = server.base_dir().to_path_buf();
    std::os::unix::fs::symlink(outside.path(), base.join("out")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret.txt"), base.join("leak.txt")).unwrap();
    let secret = outside.path().join("secret.txt");
    let out = client(
        &url(&server),
        None,
        &format!(
            r#"
secret = {secret:?}
outside = {outside:?}
out["read_dotdot"] = status(lambda: sb.files.read("../" + secret, allow_unsafe_paths=True))
out["read_abs"] = status(lambda: sb.files.read(secret, allow_unsafe_paths=True))
out["read_link"] = status(lambda: sb.files.read("leak.txt"))
out["read_via_dir_link"] = status(lambda: sb.files.read("out/secret.txt"))
out["write_dotdot"] = status(lambda: sb.files.write("../escaped.txt", b"x", allow_unsafe_paths=True))
out["write_abs"] = status(lambda: sb.files.write(outside + "/written.txt", b"x", allow_unsafe_paths=True))
out["write_via_link"] = status(lambda: sb.files.write("out/written.txt", b"x"))
out["list_dotdot"] = status(lambda: sb.files.list("../.."))
out["list_abs"] = status(lambda: sb.files.list(outside))
out["list_link"] = status(lambda: sb.files.list("out"))
out["exists_dotdot"] = status(lambda: sb.files.exists("../" + secret))
out["exists_link"] = status(lambda: sb.files.exists("leak.txt"))
out["listing"] = sorted(e.name + ":" + e.type + ":" + str(e.size) for e in sb.files.list(""))
"#,
            secret = secret.to_str().unwrap(),
            outside = outside.path().to_str().unwrap(),
        ),
    );
    for key in [
        "read_dotdot",
        "read_abs",
        "read_link",
        "read_via_dir_link",
        "write_dotdot",
        "write_abs",
        "write_via_link",
        "list_dotdot",
        "list_abs",
        "list_link",
        "exists_dotdot",
        "exists_link",
    ] {
        assert_eq!(out[key], 403, "{key}: {out}");
    }
    assert!(!outside.path().join("written.txt").exists());
    assert!(!base.parent().unwrap().join("escaped.txt").exists());
    // Links that lead out are listed as themselves, never as what is outside.
    let listing = out["listing"].as_array().unwrap();
    assert_eq!(listing.len(), 2, "{out}");
    assert!(
        listing
            .iter()
            .all(|e| e.as_str().unwrap().contains(":file:")),
        "{out}"
    );
}

fn a_token_is_required_in_x_access_token(driver: &'static str) {
    let server = k8s_server(driver, &[("ABX_SERVER_TOKEN", "k8s-s3cret")]);
    let probe = r#"
out["health"] = status(lambda: sb.connector.send_request("GET", ""))
out["run"] = status(lambda: sb.commands.run("true"))
out["write"] = status(lambda: sb.files.write("t.txt", b"x"))
out["exists"] = status(lambda: sb.files.exists("t.txt"))
"#;
    let with = client(&url(&server), Some("k8s-s3cret"), probe);
    assert_eq!(
        with,
        serde_json::json!({"health": 200, "run": 200, "write": 200, "exists": 200})
    );
    let without = client(&url(&server), None, probe);
    assert_eq!(
        without,
        serde_json::json!({"health": 200, "run": 401, "write": 401, "exists": 401}),
        "the probe stays open; everything else needs the token"
    );
    let wrong = client(&url(&server), Some("nope"), probe);
    assert_eq!(wrong["run"], 401);
}

fn a_token_file_written_after_start_closes_the_pod(driver: &'static str) {
    let secrets = TempDir::new("k8s-secret");
    let file = secrets.path().join("token");
    let server = k8s_server(driver, &[("ABX_TOKEN_FILE", file.to_str().unwrap())]);
    assert!(
        server.startup.iter().any(|l| l.contains("auth=pending")),
        "{:?}",
        server.startup
    );
    let probe = r#"
out["health"] = status(lambda: sb.connector.send_request("GET", ""))
out["run"] = status(lambda: sb.commands.run("true"))
"#;
    // A warm pod without its token is closed, not in local mode.
    let waiting = client(&url(&server), None, probe);
    assert_eq!(waiting, serde_json::json!({"health": 200, "run": 401}));
    assert_eq!(server.get("/files/list?path=.").status, 401);
    // The Secret lands the way a projected volume does: a new file renamed into place.
    std::fs::write(secrets.path().join(".tmp"), "claimed-token\n").unwrap();
    std::fs::rename(secrets.path().join(".tmp"), &file).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = client(&url(&server), Some("claimed-token"), probe);
        if now["run"] == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the token never applied: {now}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(client(&url(&server), None, probe)["run"], 401);
    assert_eq!(client(&url(&server), Some("other"), probe)["run"], 401);
    // A terminal's ws_url carries the token that arrived, as it would ABX_SERVER_TOKEN.
    let reply = server.request(
        "POST",
        "/pty/sessions",
        &[("X-Access-Token", "claimed-token")],
        Some(br#"{"shell": "/bin/bash"}"#),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
    let ws_url = reply.json()["ws_url"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(ws_url.ends_with("&token=claimed%2Dtoken"), "{ws_url}");
}

on_both_drivers!(
    runs_writes_reads_lists_and_checks_existence,
    escapes_are_refused,
    a_token_is_required_in_x_access_token,
    a_token_file_written_after_start_closes_the_pod,
);

#[test]
fn the_port_is_bound_only_with_the_group() {
    let server = Launch::new("epoll").start();
    assert!(server.k8s_addr.is_none(), "{:?}", server.startup);
    let (code, stderr) = Launch::new("epoll")
        .env("ABX_SERVER_TOKEN", "a")
        .env("ABX_TOKEN_FILE", "/nonexistent/token")
        .fail();
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("ABX_TOKEN_FILE"), "{stderr}");
}

/// The example manifests parse (the venv's PyYAML) and say what the README promises:
/// the kinds, the three ports, probes on the runtime's health route, a non-root
/// security context, resources, the warm pool and claim naming what exists.
#[test]
fn the_kubernetes_examples_parse_and_name_kinds_ports_and_probes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/kubernetes");
    let output = Command::new(&tools().python)
        .arg("-c")
        .arg(
            r#"
import glob, json, sys, yaml
docs = []
for path in sorted(glob.glob(sys.argv[1] + "/*.yaml")):
    with open(path) as f:
        docs += [d for d in yaml.safe_load_all(f) if d]
print(json.dumps(docs))
"#,
        )
        .arg(&dir)
        .output()
        .expect("run python");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let docs: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
    let find = |kind: &str| -> &Value {
        docs.iter()
            .find(|d| d["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} in examples/kubernetes"))
    };
    let template = find("SandboxTemplate");
    assert_eq!(template["apiVersion"], "extensions.agents.x-k8s.io/v1beta1");
    let pod = &template["spec"]["podTemplate"]["spec"];
    let container = &pod["containers"][0];
    let ports: Vec<i64> = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["containerPort"].as_i64().unwrap())
        .collect();
    assert_eq!(ports, [9000, 9001, 8888]);
    for probe in ["readinessProbe", "livenessProbe"] {
        let get = &container[probe]["httpGet"];
        assert!(get["path"].is_string() && !get["port"].is_null(), "{probe}");
    }
    assert_eq!(container["readinessProbe"]["httpGet"]["port"], 8888);
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/");
    assert!(container["resources"]["requests"].is_object());
    assert!(container["resources"]["limits"].is_object());
    let security = &pod["securityContext"];
    assert_eq!(security["runAsNonRoot"], true);
    assert!(security["runAsUser"].as_i64().unwrap() > 0);
    assert_eq!(
        container["securityContext"]["allowPrivilegeEscalation"],
        false
    );
    let env: Vec<&str> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(env.contains(&"ABX_SERVER_ENABLED_GROUPS"));
    assert!(env.contains(&"ABX_TOKEN_FILE"));
    let policy = find("NetworkPolicy");
    assert_eq!(policy["apiVersion"], "networking.k8s.io/v1");
    let pool = find("SandboxWarmPool");
    assert_eq!(pool["apiVersion"], "extensions.agents.x-k8s.io/v1beta1");
    assert_eq!(
        pool["spec"]["sandboxTemplateRef"]["name"],
        template["metadata"]["name"]
    );
    assert!(pool["spec"]["replicas"].as_i64().unwrap() >= 1);
    let claim = find("SandboxClaim");
    assert_eq!(claim["apiVersion"], "extensions.agents.x-k8s.io/v1beta1");
    assert_eq!(
        claim["spec"]["warmPoolRef"]["name"],
        pool["metadata"]["name"]
    );
    // Per-sandbox state is a volume claim template, mounted as the base directory.
    let claims = template["spec"]["volumeClaimTemplates"].as_array().unwrap();
    let volume = claims[0]["metadata"]["name"].as_str().unwrap();
    assert!(container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["name"] == volume));
}
