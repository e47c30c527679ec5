//! The agents group against the real binary and the real CLIs (`codex` and `qwen` from
//! npm, on `PATH`), which talk to the scripted stub of the upstream model API
//! ([`crate::upstream`], whose module docs list the scripts: `SAY <text>`,
//! `SHELL <command>`, `SLOW`, `FAIL`, …) served by this test process on 127.0.0.1: no
//! test reaches a model provider.

use std::io::{BufRead, BufReader, Write};
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{
    masked_text_frame, pin, read_event, status_kib, tools, Launch, Server, TempDir,
};
use crate::upstream::{codex_config, serve_upstream, Upstream};

/// A server with the agents group on, whose CLIs talk to `upstream`.
pub(crate) fn agents_server(upstream: &Upstream, home: &TempDir, extra: &[(&str, &str)]) -> Server {
    let codex_home = home.path().join("codex");
    std::fs::create_dir_all(&codex_home).unwrap();
    std::fs::write(codex_home.join("config.toml"), codex_config(upstream)).unwrap();
    let mut launch = Launch::new("uring")
        .env("ABX_SERVER_ENABLED_GROUPS", "agents")
        .env("CODEX_HOME", codex_home.to_str().unwrap())
        .env("STUB_API_KEY", "stub")
        .env("OPENAI_BASE_URL", &format!("http://{}/v1", upstream.addr))
        .env("OPENAI_API_KEY", "stub")
        .env("OPENAI_MODEL", "stub-model")
        .env("HOME", home.path().to_str().unwrap())
        .env("PATH", &tools().path)
        .env("QWEN_CODE_SUPPRESS_YOLO_WARNING", "1");
    for (name, value) in extra {
        launch = launch.env(name, value);
    }
    launch.start()
}

pub(crate) fn output_text(response: &Value) -> String {
    response["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap().iter())
        .filter_map(|c| c["text"].as_str())
        .collect()
}

#[test]
fn runtimes_models_and_refusals() {
    let upstream = serve_upstream();
    let home = TempDir::new("agents-home");
    let server = agents_server(&upstream, &home, &[]);
    let (status, runtimes) = server.v1_get("/v1/agents/runtimes");
    assert_eq!(status, 200, "{runtimes}");
    let by_id = |id: &str| {
        runtimes["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .unwrap()
            .clone()
    };
    let codex = by_id("codex");
    assert_eq!(
        (codex["implemented"].clone(), codex["installed"].clone()),
        (json!(true), json!(true)),
        "{codex}"
    );
    assert_eq!(
        codex["version"],
        pin("CODEX_VERSION").as_str(),
        "the tests run the pinned version"
    );
    assert_eq!(codex["default"], true);
    let qwen = by_id("qwen-code");
    assert_eq!(qwen["aliases"], json!(["qwen", "qwen_code", "qwencode"]));
    // The reference's descriptive fields.
    assert_eq!(codex["object"], "agent.runtime");
    assert_eq!(codex["binary"], "codex");
    assert_eq!(codex["path"], codex["program"]);
    assert_eq!(
        codex["install_steps"],
        json!([[
            "npm",
            "install",
            "-g",
            format!("@openai/codex@{}", pin("CODEX_VERSION"))
        ]])
    );
    assert_eq!(
        by_id("cursor")["aliases"],
        json!(["cursor-agent", "cursor_agent"])
    );
    assert_eq!(qwen["version"], pin("QWEN_CODE_VERSION").as_str());
    assert_eq!(by_id("claude-code")["implemented"], true);
    for declared in ["cursor", "command"] {
        assert_eq!(by_id(declared)["implemented"], false);
    }
    assert_eq!(codex["x_agent_sandbox"]["local"], true);

    let (_, models) = server.v1_get("/v1/models");
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["codex", "qwen-code", "claude-code"]);
    let (status, model) = server.v1_get("/v1/models/qwen");
    assert_eq!(
        (status, model["id"].clone(), model["object"].clone()),
        (200, json!("qwen-code"), json!("model"))
    );
    let reply = server.get("/v1/models/cursor");
    assert_eq!(reply.status, 404);
    assert_eq!(reply.header("x-should-retry"), Some("false"));
    let body = reply.json();
    assert_eq!(body["error"]["code"], "agents.not_implemented_locally");
    assert_eq!(body["error"]["type"], "not_found_error");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("GET /v1/agents/runtimes"));
    let (status, body) = server.v1_get("/v1/models/gpt-99");
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (404, json!("model_not_found"))
    );

    // The refusals, each with the reference's code and its pointer to the runtimes;
    // the route's id says which capability is absent.
    for (method, path) in [
        ("POST", "/v1/responses/input_tokens"),
        ("DELETE", "/v1/models/codex"),
        ("POST", "/v1/agents/executors"),
        ("GET", "/v1/agents/executors/ex_1/channel"),
        ("POST", "/v1/agents/environments/env_1/register"),
        ("GET", "/v1/agents/environments/env_1/connect"),
    ] {
        let reply = server.request(
            method,
            path,
            &[],
            (method == "POST").then_some(b"{}".as_slice()),
        );
        assert_eq!(reply.status, 404, "{path}");
        assert_eq!(reply.header("x-should-retry"), Some("false"), "{path}");
        assert_eq!(reply.header("x-agent-sandbox-local"), Some("1"), "{path}");
        let body = reply.json();
        assert_eq!(
            body["error"]["code"], "agents.not_implemented_locally",
            "{body}"
        );
        assert_eq!(body["error"]["type"], "not_found_error");
        assert_eq!(
            body["error"]["x_agent_sandbox"]["runtimes"], "/v1/agents/runtimes",
            "{body}"
        );
        assert!(body["error"].as_object().unwrap().contains_key("param"));
    }

    let caps = server.get("/capabilities").json();
    assert_eq!(
        caps["group_summary"]["agents"],
        // Phase 1's 20, the Agents API's 25 CRUD operations and its 22 of sessions, the
        // executor refusals at the reference's paths too, its webhook endpoints (8) and
        // POST /v1/files, responses.connect and compact: the reference's whole table;
        // and the MCP relay's three, the 10 automations operations and the model relay
        // (extensions).
        json!({"enabled": 94, "total": 94})
    );
    assert_eq!(
        caps["endpoints"]["agents_responses_create"]["scopes"],
        json!(["agents:use"])
    );
    let off = Server::start("uring");
    let reply = off.post("/v1/responses", r#"{"input": "hi"}"#);
    assert_eq!(reply.status, 404);
    let body = reply.json();
    assert_eq!(body["error"]["code"], "endpoint_disabled", "{body}");
    assert_eq!(
        body["error"]["type"], "not_found_error",
        "the dispatcher speaks OpenAI under /v1"
    );
}

#[test]
fn codex_answers_whole_and_as_openai_events() {
    let upstream = serve_upstream();
    let home = TempDir::new("agents-home");
    let server = agents_server(&upstream, &home, &[]);
    let (status, response) = server.v1_post(
        "/v1/responses",
        json!({"model": "codex", "input": "SAY hello there", "metadata": {"k": "v"}}),
    );
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["object"], "response");
    assert_eq!(response["status"], "completed");
    assert_eq!(output_text(&response), "hello there");
    assert_eq!(response["usage"]["input_tokens"], 10);
    assert_eq!(response["usage"]["total_tokens"], 13);
    assert_eq!(response["metadata"], json!({"k": "v"}));
    assert_eq!(response["x_agent_sandbox"]["compute"], "codex");
    let id = response["id"].as_str().unwrap().to_string();
    let (_, stored) = server.v1_get(&format!("/v1/responses/{id}"));
    assert_eq!(stored, response);
    let (_, inputs) = server.v1_get(&format!("/v1/responses/{id}/input_items"));
    assert_eq!(inputs["data"][0]["content"][0]["text"], "SAY hello there");

    // A saved agent's id as the model runs its model and instructions (the stub says
    // the instructions' script: the input has none), and the agent is listed as a model.
    let (status, saved) = server.v1_post(
        "/v1/agents",
        json!({"model": "codex", "instructions": "SAY the saved agent speaks"}),
    );
    assert_eq!(status, 200, "{saved}");
    let agent_id = saved["id"].as_str().unwrap();
    let (status, response) = server.v1_post(
        "/v1/responses",
        json!({"model": agent_id, "input": "who is there?"}),
    );
    assert_eq!(status, 200, "{response}");
    assert_eq!(output_text(&response), "the saved agent speaks");
    let (_, models) = server.v1_get("/v1/models");
    assert_eq!(models["data"][0]["id"], agent_id, "{models}");
    assert_eq!(
        models["data"][0]["x_agent_sandbox"]["kind"],
        "agent_definition"
    );
    assert_eq!(models["data"][0]["owned_by"], "agent-sandbox-local");
    let (status, model) = server.v1_get(&format!("/v1/models/{agent_id}"));
    assert_eq!((status, model["id"].as_str()), (200, Some(agent_id)));
    // What one CLI turn cannot honour is refused, not dropped; an unknown agent is 404.
    let (_, reasoned) = server.v1_post(
        "/v1/agents",
        json!({"model": "codex", "reasoning": {"effort": "low"}}),
    );
    let (status, error) = server.v1_post(
        "/v1/responses",
        json!({"model": reasoned["id"], "input": "SAY x"}),
    );
    assert_eq!(status, 400, "{error}");
    assert_eq!(error["error"]["param"], "model");
    assert_eq!(error["error"]["code"], "unsupported_parameter");
    let (status, error) = server.v1_post(
        "/v1/responses",
        json!({"model": "agent_0123456789abcdef", "input": "SAY x"}),
    );
    assert_eq!(
        (status, error["error"]["param"].as_str()),
        (404, Some("model"))
    );
    assert_eq!(error["error"]["code"], "resource_not_found");

    // Streamed: OpenAI's event names, in order, numbered from 0.
    let mut stream = server.connect();
    let body = json!({"input": "SAY streamed words", "stream": true}).to_string();
    write!(stream, "POST /v1/responses HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line.trim().is_empty() {
            break;
        }
        head.push_str(&line);
    }
    assert!(head.contains("text/event-stream"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("x-agent-sandbox-local: 1"),
        "{head}"
    );
    let mut names = Vec::new();
    loop {
        let (name, data) = read_event(&mut reader);
        assert_eq!(data["type"], name.as_str());
        assert_eq!(data["sequence_number"], names.len(), "{name}");
        if name == "response.output_text.delta" {
            assert_eq!(data["delta"], "streamed words");
        }
        let last = name == "response.completed";
        names.push(name);
        if last {
            assert_eq!(output_text(&data["response"]), "streamed words");
            break;
        }
    }
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );

    for (body, param) in [
        (json!({"input": "SAY x", "temperature": 0.2}), "temperature"),
        (
            json!({"input": "SAY x", "tools": [{"type": "web_search"}]}),
            "tools",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]}),
            "input[0].content[0].type",
        ),
        (json!({"input": "SAY x", "runtime": "nonesuch"}), "runtime"),
        (
            json!({"input": [{"role": "user", "content": "x", "name": "me"}]}),
            "input[0].name",
        ),
        (json!({"model": "codex"}), "input"),
    ] {
        let (status, error) = server.v1_post("/v1/responses", body.clone());
        assert_eq!(status, 400, "{body}: {error}");
        assert_eq!(error["error"]["type"], "invalid_request_error");
        assert_eq!(error["error"]["param"], param, "{error}");
    }
    let reply = server.post(
        "/v1/responses",
        r#"{"input": "SAY x", "runtime": "cursor"}"#,
    );
    assert_eq!(
        (reply.status, reply.header("x-should-retry")),
        (404, Some("false"))
    );
    assert_eq!(
        reply.json()["error"]["code"],
        "agents.not_implemented_locally"
    );
    let (status, _) = server.v1_get("/v1/responses/resp_nonesuch");
    assert_eq!(status, 404);
}

#[test]
fn codex_runs_a_shell_command_the_model_asked_for() {
    let upstream = serve_upstream();
    let home = TempDir::new("agents-home");
    let server = agents_server(&upstream, &home, &[]);
    let (status, response) = server.v1_post(
        "/v1/responses",
        json!({"input": "SHELL echo made-by-codex > made.txt"}),
    );
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["status"], "completed", "{response}");
    assert_eq!(output_text(&response), "done");
    let made = std::fs::read_to_string(server.base_dir().join("made.txt"))
        .expect("the command ran in the base directory");
    assert_eq!(made.trim(), "made-by-codex");
    let shell = response["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "local_shell_call")
        .expect("the command is an output item");
    assert!(
        shell["action"]["command"][2]
            .as_str()
            .unwrap()
            .contains("made.txt"),
        "{shell}"
    );
    assert_eq!(shell["x_agent_sandbox"]["exit_code"], 0);
}

#[test]
fn cancel_and_upstream_failure() {
    let upstream = serve_upstream();
    let home = TempDir::new("agents-home");
    let server = agents_server(&upstream, &home, &[]);
    let (status, failed) = server.v1_post("/v1/responses", json!({"input": "FAIL"}));
    assert_eq!(status, 200, "{failed}");
    assert_eq!(failed["status"], "failed", "{failed}");
    assert!(!failed["error"]["message"].as_str().unwrap().is_empty());

    let mut stream = server.connect();
    let body = json!({"input": "SLOW", "stream": true}).to_string();
    write!(stream, "POST /v1/responses HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line.trim().is_empty() {
            break;
        }
    }
    let (name, created) = read_event(&mut reader);
    assert_eq!(name, "response.created");
    let id = created["response"]["id"].as_str().unwrap().to_string();
    let (_, running) = server.v1_get(&format!("/v1/responses/{id}"));
    assert_eq!(running["status"], "in_progress");
    let (status, cancelled) = server.v1_post(&format!("/v1/responses/{id}/cancel"), json!({}));
    assert_eq!(
        (status, cancelled["status"].clone()),
        (200, json!("cancelled")),
        "{cancelled}"
    );
    let last = loop {
        let (name, data) = read_event(&mut reader);
        if name != "response.in_progress" {
            break (name, data);
        }
    };
    assert_eq!(last.0, "response.incomplete", "{}", last.1);
    assert_eq!(last.1["response"]["status"], "cancelled");
    let (_, stored) = server.v1_get(&format!("/v1/responses/{id}"));
    assert_eq!(stored["status"], "cancelled");
    let (status, again) = server.v1_post(&format!("/v1/responses/{id}/cancel"), json!({}));
    assert_eq!(status, 400, "{again}");
    let (status, deleted) = server.delete_json(&format!("/v1/responses/{id}"));
    assert_eq!((status, deleted["deleted"].clone()), (200, json!(true)));
    assert_eq!(server.v1_get(&format!("/v1/responses/{id}")).0, 404);
}

/// A turn whose CLI goes quiet still sends a byte every 15 s: the OpenAI SDK's reader
/// gives up on a stream after 600 s of silence (its default read timeout). The comment
/// comes between events, which an SSE reader skips.
#[test]
fn a_quiet_streamed_turn_sends_keep_alive_comments() {
    let upstream = serve_upstream();
    let home = TempDir::new("agents-home");
    let server = agents_server(&upstream, &home, &[]);
    let mut stream = server.connect();
    stream
        .set_read_timeout(Some(Duration::from_secs(40)))
        .unwrap();
    let body = json!({"input": "SLOW thinking", "stream": true}).to_string();
    write!(stream, "POST /v1/responses HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let (seen, waited) = crate::support::lines_until_keep_alive(&mut BufReader::new(stream));
    assert!(
        seen.iter()
            .any(|l| l.starts_with("event: response.created")),
        "the comment came before the turn's first event: {seen:?}"
    );
    assert!(
        waited >= Duration::from_secs(14),
        "a comment after {waited:?}, not after 15 s of quiet"
    );
}

#[test]
fn conversations_continue_the_cli_session_and_belong_to_their_caller() {
    let upstream = serve_upstream();
    let home = TempDir::new("agents-home");
    let policy = home.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "groups: {agents: true}\nidentities:\n  - {id: alice, scopes: [\"*\"], token_env: ALICE_TOKEN}\n  - {id: bob, scopes: [\"*\"], token_env: BOB_TOKEN}\n",
    )
    .unwrap();
    let server = agents_server(
        &upstream,
        &home,
        &[
            ("ABX_SERVER_POLICY", policy.to_str().unwrap()),
            ("ALICE_TOKEN", "alice-secret"),
            ("BOB_TOKEN", "bob-secret"),
        ],
    );
    let as_user = |token: &str, method: &str, path: &str, body: Option<Value>| {
        let auth = format!("Bearer {token}");
        let bytes = body.map(|b| b.to_string().into_bytes());
        let reply = server.request(method, path, &[("Authorization", &auth)], bytes.as_deref());
        (reply.status, reply.json())
    };
    let (status, conversation) = as_user(
        "alice-secret",
        "POST",
        "/v1/conversations",
        Some(
            json!({"metadata": {"topic": "t"}, "items": [{"role": "user", "content": "The code word is PLUM."}]}),
        ),
    );
    assert_eq!(status, 200, "{conversation}");
    assert_eq!(conversation["object"], "conversation");
    let conv = conversation["id"].as_str().unwrap().to_string();

    let (status, first) = as_user(
        "alice-secret",
        "POST",
        "/v1/responses",
        Some(json!({"input": "SAY first answer", "conversation": conv})),
    );
    assert_eq!(
        (status, first["status"].clone()),
        (200, json!("completed")),
        "{first}"
    );
    // The item added before the turn reached the CLI with the prompt.
    let first_request = upstream.seen.lock().unwrap().last().unwrap().to_string();
    assert!(
        first_request.contains("PLUM"),
        "the conversation's items were handed to the CLI"
    );
    let (status, second) = as_user(
        "alice-secret",
        "POST",
        "/v1/responses",
        Some(json!({"input": "SAY second answer", "conversation": conv})),
    );
    assert_eq!(
        (status, output_text(&second)),
        (200, "second answer".to_string()),
        "{second}"
    );
    // codex resumed its own thread: the second upstream request carries the first turn.
    let second_request = upstream.seen.lock().unwrap().last().unwrap().to_string();
    assert!(
        second_request.contains("first answer"),
        "the second turn resumed the first"
    );

    let (_, items) = as_user(
        "alice-secret",
        "GET",
        &format!("/v1/conversations/{conv}/items?order=asc"),
        None,
    );
    let texts: Vec<String> = items["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["content"][0]["text"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(
        texts,
        [
            "The code word is PLUM.",
            "SAY first answer",
            "first answer",
            "SAY second answer",
            "second answer"
        ]
    );
    let item_id = items["data"][0]["id"].as_str().unwrap().to_string();
    let (status, item) = as_user(
        "alice-secret",
        "GET",
        &format!("/v1/conversations/{conv}/items/{item_id}"),
        None,
    );
    assert_eq!((status, item["id"].clone()), (200, json!(item_id)));

    // previous_response_id continues the same thread.
    let first_id = first["id"].as_str().unwrap();
    let (status, third) = as_user(
        "alice-secret",
        "POST",
        "/v1/responses",
        Some(json!({"input": "SAY third", "previous_response_id": first_id})),
    );
    assert_eq!(
        (status, third["previous_response_id"].clone()),
        (200, json!(first_id)),
        "{third}"
    );

    // While a turn runs in the conversation, it takes no other turn and no items.
    let mut slow = server.connect();
    let body = json!({"input": "SLOW", "conversation": conv, "stream": true}).to_string();
    write!(
        slow,
        "POST /v1/responses HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer alice-secret\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(slow);
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line.trim().is_empty() {
            break;
        }
    }
    let (_, created) = read_event(&mut reader);
    let slow_id = created["response"]["id"].as_str().unwrap().to_string();
    let (status, locked) = as_user(
        "alice-secret",
        "POST",
        "/v1/responses",
        Some(json!({"input": "SAY x", "conversation": conv})),
    );
    assert_eq!(
        (status, locked["error"]["code"].clone()),
        (409, json!("conversation_locked")),
        "{locked}"
    );
    let (status, locked) = as_user(
        "alice-secret",
        "POST",
        &format!("/v1/conversations/{conv}/items"),
        Some(json!({"items": [{"role": "user", "content": "x"}]})),
    );
    assert_eq!(status, 409, "{locked}");
    let (status, _) = as_user(
        "alice-secret",
        "POST",
        &format!("/v1/responses/{slow_id}/cancel"),
        Some(json!({})),
    );
    assert_eq!(status, 200);
    loop {
        let (name, _) = read_event(&mut reader);
        if name == "response.incomplete" {
            break;
        }
    }
    drop(reader);
    let (status, added) = as_user(
        "alice-secret",
        "POST",
        &format!("/v1/conversations/{conv}/items"),
        Some(json!({"items": [{"role": "user", "content": "after the cancel"}]})),
    );
    assert_eq!(status, 200, "the conversation is free again: {added}");

    // Bob sees none of it: a foreign id answers like an unknown one.
    for path in [
        format!("/v1/conversations/{conv}"),
        format!("/v1/responses/{first_id}"),
        format!("/v1/conversations/{conv}/items"),
    ] {
        let (status, body) = as_user("bob-secret", "GET", &path, None);
        assert_eq!(status, 404, "{path}: {body}");
        assert_eq!(body["error"]["type"], "not_found_error");
    }
    let (status, _) = as_user(
        "bob-secret",
        "POST",
        "/v1/responses",
        Some(json!({"input": "SAY x", "conversation": conv})),
    );
    assert_eq!(status, 404);

    let (status, updated) = as_user(
        "alice-secret",
        "POST",
        &format!("/v1/conversations/{conv}"),
        Some(json!({"metadata": {"topic": "u"}})),
    );
    assert_eq!(
        (status, updated["metadata"]["topic"].clone()),
        (200, json!("u"))
    );
    let (status, deleted) = as_user(
        "alice-secret",
        "DELETE",
        &format!("/v1/conversations/{conv}/items/{item_id}"),
        None,
    );
    assert_eq!((status, deleted["id"].clone()), (200, json!(conv)));
    let (status, deleted) = as_user(
        "alice-secret",
        "DELETE",
        &format!("/v1/conversations/{conv}"),
        None,
    );
    assert_eq!(
        (status, deleted["object"].clone()),
        (200, json!("conversation.deleted"))
    );
    let (status, _) = as_user(
        "alice-secret",
        "GET",
        &format!("/v1/conversations/{conv}"),
        None,
    );
    assert_eq!(status, 404);
}

#[test]
fn qwen_code_answers_and_resumes() {
    let upstream = serve_upstream();
    let home = TempDir::new("agents-home");
    let server = agents_server(&upstream, &home, &[("ABX_AGENTS_DEFAULT", "qwen")]);
    let (status, first) = server.v1_post("/v1/responses", json!({"input": "SAY hello from qwen"}));
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["status"], "completed", "{first}");
    assert_eq!(first["model"], "qwen-code");
    assert_eq!(output_text(&first), "hello from qwen");
    let (status, second) = server.v1_post(
        "/v1/responses",
        json!({"input": "SAY again", "previous_response_id": first["id"]}),
    );
    assert_eq!(
        (status, output_text(&second)),
        (200, "again".to_string()),
        "{second}"
    );
    let last = upstream.seen.lock().unwrap().last().unwrap().to_string();
    assert!(last.contains("hello from qwen"), "qwen resumed its session");
    let (status, failed) = server.v1_post("/v1/responses", json!({"input": "FAIL400"}));
    assert_eq!(
        (status, failed["status"].clone()),
        (200, json!("failed")),
        "{failed}"
    );

    // A shell command the model asks for runs in the base directory.
    let (status, shell) = server.v1_post(
        "/v1/responses",
        json!({"input": "SHELL echo made-by-qwen > qwen.txt"}),
    );
    assert_eq!(
        (status, shell["status"].clone()),
        (200, json!("completed")),
        "{shell}"
    );
    assert_eq!(output_text(&shell), "done");
    let made =
        std::fs::read_to_string(server.base_dir().join("qwen.txt")).expect("qwen ran the command");
    assert_eq!(made.trim(), "made-by-qwen");
    let call = shell["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "function_call")
        .expect("the tool call is an output item");
    assert_eq!(call["name"], "run_shell_command");
}

#[test]
fn the_official_openai_client_drives_the_surface() {
    let upstream = serve_upstream();
    let home = TempDir::new("agents-home");
    let server = agents_server(&upstream, &home, &[]);
    let script = r#"
import sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1], api_key="local")
r = client.responses.create(model="codex", input="SAY from the client")
assert r.status == "completed", r
assert r.output_text == "from the client", r.output_text
events = [e.type for e in client.responses.create(model="codex", input="SAY streamed", stream=True)]
assert events[0] == "response.created" and events[-1] == "response.completed", events
assert "response.output_text.delta" in events, events
conv = client.conversations.create(metadata={"k": "v"})
r2 = client.responses.create(model="codex", input="SAY in conversation", conversation=conv.id)
items = client.conversations.items.list(conv.id, order="asc")
assert [i.role for i in items.data] == ["user", "assistant"], items
assert client.responses.retrieve(r2.id).id == r2.id
models = [m.id for m in client.models.list()]
assert models == ["codex", "qwen-code", "claude-code"], models
print("ok")
"#;
    run_sdk_script(script, &server);
}

/// Runs a Python `script` of the tools venv (the pinned SDK) with the server's `/v1`
/// base URL; it must print exactly `ok`.
fn run_sdk_script(script: &str, server: &Server) {
    let output = std::process::Command::new(&tools().python)
        .args(["-c", script, &format!("http://{}/v1", server.addr)])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.trim() == "ok",
        "stdout: {stdout}\nstderr: {stderr}"
    );
}

/// `responses.connect`: the official SDK's WebSocket on the API port. Each
/// `response.create` is a turn whose events come one message each, parsed by the SDK's
/// own event models; a continuation, a steer (the next turn), refusals as `error`
/// events, and a plain GET told to upgrade.
#[test]
fn the_official_client_connects_over_a_websocket() {
    let upstream = serve_upstream();
    let home = TempDir::new("agents-home");
    let server = agents_server(&upstream, &home, &[]);
    let script = r#"
import json, sys
import httpx2 as httpx
from openai import OpenAI
base = sys.argv[1]
client = OpenAI(base_url=base, api_key="local")

def turn(conn):
    events = []
    for event in conn:
        events.append(event)
        if event.type in ("response.completed", "response.failed", "error"):
            return events
    raise AssertionError("the socket closed mid-turn")

with client.responses.connect() as conn:
    conn.response.create(model="codex", input="SAY over the socket")
    first = turn(conn)
    kinds = [e.type for e in first]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
    assert "response.output_text.delta" in kinds, kinds
    done = first[-1].response
    assert done.output_text == "over the socket" and done.status == "completed", done
    assert [e.sequence_number for e in first] == list(range(len(first))), first

    conn.response.create(model="codex", input="SAY continued", previous_response_id=done.id)
    second = turn(conn)[-1].response
    assert second.output_text == "continued" and second.previous_response_id == done.id, second

    conn.response.steer(input="SAY steered", previous_response_id=second.id)
    third = turn(conn)[-1].response
    assert third.output_text == "steered", third

    # Refusals are error events; the socket stays usable.
    conn.send({"type": "response.nope"})
    refused = json.loads(conn.recv_bytes())
    assert refused["type"] == "error" and refused["error"]["param"] == "type", refused
    conn.send({"type": "response.create", "model": "codex", "input": "SAY x", "bogus": 1})
    refused = json.loads(conn.recv_bytes())
    assert refused["type"] == "error" and refused["error"]["param"] == "bogus", refused
    conn.response.create(model="codex", input="SAY still here")
    assert turn(conn)[-1].response.output_text == "still here"

# The stored responses are the same as POST /v1/responses keeps.
assert client.responses.retrieve(done.id).output_text == "over the socket"
plain = httpx.get(base + "/responses")
assert plain.status_code == 400, plain.text
assert plain.json()["error"]["code"] == "agents.websocket_upgrade_required", plain.text
print("ok")
"#;
    run_sdk_script(script, &server);
}

/// Messages that reach the responses socket in one read are each answered: the second
/// one waits inside the WebSocket, not in the kernel, so waiting for readiness before
/// looking would leave it unanswered until the client sent something else.
#[test]
fn the_responses_socket_answers_messages_that_came_in_one_read() {
    let upstream = serve_upstream();
    let home = TempDir::new("agents-home");
    let server = agents_server(&upstream, &home, &[]);
    let stream = std::net::TcpStream::connect(server.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let url = format!("ws://{}/v1/responses", server.addr);
    let (mut ws, _) = tungstenite::client(url.as_str(), stream).unwrap();
    let mut both = Vec::new();
    for kind in ["response.nope", "response.nope.again"] {
        both.extend(masked_text_frame(&json!({"type": kind}).to_string()));
    }
    ws.get_mut().write_all(&both).unwrap();
    for _ in 0..2 {
        let message = ws.read().expect("an error event for each message");
        let event: Value = serde_json::from_str(message.to_text().unwrap()).unwrap();
        assert_eq!(event["type"], "error", "{event}");
        assert_eq!(event["error"]["param"], "type", "{event}");
    }
}

/// The Responses WebSocket answers a client's ping at once: between turns, and while a
/// turn is quiet. The OpenAI SDK's `websockets` pings every 20 s and closes the socket
/// when no pong comes within 20 s; a pong held back until the next event lost idle
/// sockets and long turns.
#[test]
fn the_responses_socket_answers_pings_between_and_during_turns() {
    use tungstenite::Message;
    let upstream = serve_upstream();
    let home = TempDir::new("agents-home");
    let server = agents_server(&upstream, &home, &[]);
    let stream = std::net::TcpStream::connect(server.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let url = format!("ws://{}/v1/responses", server.addr);
    let (mut ws, _) = tungstenite::client(url.as_str(), stream).unwrap();
    let pong_for = |ws: &mut tungstenite::WebSocket<std::net::TcpStream>, tag: &str| {
        ws.send(Message::Ping(tag.as_bytes().to_vec().into()))
            .unwrap();
        loop {
            match ws
                .read()
                .unwrap_or_else(|e| panic!("no pong for '{tag}': {e}"))
            {
                Message::Pong(payload) => {
                    assert_eq!(&payload[..], tag.as_bytes());
                    return;
                }
                Message::Text(_) => {}
                other => panic!("{other:?}"),
            }
        }
    };
    pong_for(&mut ws, "idle");
    let create = json!({"type": "response.create", "input": "SLOW thinking"});
    ws.send(Message::text(create.to_string())).unwrap();
    loop {
        let message = ws.read().unwrap();
        let event: Value = serde_json::from_str(message.to_text().unwrap()).unwrap();
        assert_ne!(event["type"], "error", "{event}");
        if event["type"] == "response.created" {
            break;
        }
    }
    // The stub holds the turn for a minute, without a word after its first.
    std::thread::sleep(Duration::from_secs(2));
    pong_for(&mut ws, "busy");
}

/// Every object and event of every phase-1 route, validated by the pinned `openai` SDK's
/// own pydantic models (`tests/fixtures/openai_phase1_models.py`): a field that SDK
/// requires and this server leaves out fails here.
#[test]
fn every_phase1_object_and_event_validates_against_the_pinned_sdk() {
    let upstream = serve_upstream();
    let home = TempDir::new("agents-home");
    let server = agents_server(&upstream, &home, &[]);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/openai_phase1_models.py");
    let output = std::process::Command::new(&tools().python)
        .arg(&script)
        .arg(format!("http://{}/v1", server.addr))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.trim_end().ends_with("ok"),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    let version = format!("openai {}", pin("OPENAI_PYTHON_VERSION"));
    assert!(
        stdout.contains(&version),
        "validated with another SDK: {stdout}"
    );
}

/// The real codex CLI, configured with this server's `/mcp` (`docs/mcp.md`), calls one
/// of the sandbox's tools when the (stub) model asks for it: the file appears in the
/// other sandbox, written through its policy with the token codex sent.
#[test]
fn codex_calls_a_sandbox_tool_through_mcp() {
    let target = Launch::new("uring")
        .env("ABX_SERVER_TOKEN", "mcp-target-token")
        .start();
    let upstream = serve_upstream();
    let home = TempDir::new("agents-home");
    let server = agents_server(
        &upstream,
        &home,
        &[("SANDBOX_MCP_TOKEN", "mcp-target-token")],
    );
    let config = home.path().join("codex/config.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "\n[mcp_servers.sandbox]\nurl = \"http://{}/mcp\"\nbearer_token_env_var = \"SANDBOX_MCP_TOKEN\"\ndefault_tools_approval_mode = \"approve\"\n",
        target.addr
    ));
    std::fs::write(&config, text).unwrap();
    let arguments =
        json!({"path": "from-codex.txt", "content": "written by codex over MCP"}).to_string();
    let (status, response) = server.v1_post(
        "/v1/responses",
        json!({"input": format!("MCP upload_text {arguments}")}),
    );
    assert_eq!(
        (status, response["status"].clone()),
        (200, json!("completed")),
        "{response}"
    );
    let offered = upstream.seen.lock().unwrap()[0]["tools"].to_string();
    assert!(
        offered.contains("\"mcp__sandbox\"") && offered.contains("\"upload_text\""),
        "codex offered no sandbox tool: {offered}"
    );
    let written = std::fs::read_to_string(target.base_dir().join("from-codex.txt"));
    assert_eq!(
        written.ok().as_deref(),
        Some("written by codex over MCP"),
        "{response}"
    );
    assert_eq!(output_text(&response), "done");
}

/// Conversations alone reach the store's caps (no turn runs): per identity, in bytes
/// (429) and per object (413), in OpenAI's envelope, and memory stays bounded by them
/// (40 requests of 9 MB reached 449 MB before; listings copied every item).
fn the_store_caps_each_identity(driver: &'static str) {
    let (server, _policy) = crate::support::alice_and_bob(driver, "groups: {agents: true}\n");
    let as_user = |token: &str, method: &str, path: &str, body: Option<&[u8]>| {
        let auth = format!("Bearer {token}");
        let reply = server.request(method, path, &[("Authorization", &auth)], body);
        assert_eq!(reply.header("x-agent-sandbox-local"), Some("1"), "{path}");
        (reply.status, reply.json())
    };
    // Twenty items of 450 KiB: a 9 MB body.
    let text = "t".repeat(450 * 1024);
    let items: Vec<Value> = (0..20)
        .map(|_| json!({"role": "user", "content": text}))
        .collect();
    let body = json!({ "items": items }).to_string().into_bytes();
    let pid = server.child.id();
    let before = status_kib(pid, "VmRSS");
    let mut kept = Vec::new();
    let mut refused = None;
    for _ in 0..40 {
        let (status, answer) = as_user("alice-secret", "POST", "/v1/conversations", Some(&body));
        match status {
            200 => kept.push(answer["id"].as_str().unwrap().to_string()),
            429 => refused = Some(answer),
            other => panic!("{other}: {answer}"),
        }
    }
    let refused = refused.expect("the 64 MiB share was never reached");
    assert_eq!(kept.len(), 7, "7 conversations of 9 MB fit in 64 MiB");
    assert_eq!(refused["error"]["type"], "rate_limit_error", "{refused}");
    assert_eq!(refused["error"]["code"], "agents_store_quota_exceeded");
    assert!(refused["error"]["message"]
        .as_str()
        .unwrap()
        .contains("64 MiB"));
    // Bob's share is his own.
    let (status, answer) = as_user("bob-secret", "POST", "/v1/conversations", Some(&body));
    assert_eq!(status, 200, "{answer}");
    // One conversation may not grow past 16 MiB.
    let more = json!({ "items": items }).to_string().into_bytes();
    let (status, answer) = as_user(
        "alice-secret",
        "POST",
        &format!("/v1/conversations/{}/items", kept[0]),
        Some(&more),
    );
    assert_eq!(status, 413, "{answer}");
    assert_eq!(answer["error"]["code"], "agents_object_too_large");
    assert_eq!(answer["error"]["type"], "invalid_request_error");
    let (_, listed) = as_user(
        "alice-secret",
        "GET",
        &format!("/v1/conversations/{}/items?limit=100", kept[0]),
        None,
    );
    assert_eq!(
        listed["data"].as_array().unwrap().len(),
        20,
        "nothing was added"
    );
    // Listings, eight at once, copy only their page.
    let lists: Vec<_> = (0..8)
        .map(|i| {
            let addr = server.addr;
            let path = format!("/v1/conversations/{}/items?limit=2", kept[i % kept.len()]);
            std::thread::spawn(move || {
                crate::support::request_at(
                    addr,
                    "GET",
                    &path,
                    &[("Authorization", "Bearer alice-secret")],
                    None,
                )
                .status
            })
        })
        .collect();
    for list in lists {
        assert_eq!(list.join().unwrap(), 200);
    }
    let peak = status_kib(pid, "VmHWM");
    let growth = peak.saturating_sub(before);
    eprintln!("agents store: RSS before {before} KiB, peak {peak} KiB, growth {growth} KiB");
    assert!(
        growth < 256 * 1024,
        "peak RSS grew by {growth} KiB with 128 MiB of shares in use"
    );
    // Deleting makes room again.
    let (status, _) = as_user(
        "alice-secret",
        "DELETE",
        &format!("/v1/conversations/{}", kept[1]),
        None,
    );
    assert_eq!(status, 200);
    let (status, answer) = as_user("alice-secret", "POST", "/v1/conversations", Some(&body));
    assert_eq!(status, 200, "{answer}");
}

crate::on_both_drivers!(the_store_caps_each_identity);

/// A directory holding a `codex` that reports another version than the pin: on `PATH`,
/// it must not be used (ABX_AGENTS_PATH_CLI defaults to `pinned`).
fn decoy_codex(home: &TempDir) -> String {
    let dir = home.path().join("decoy");
    std::fs::create_dir_all(&dir).unwrap();
    let codex = dir.join("codex");
    std::fs::write(
        &codex,
        "#!/bin/sh\necho 'codex-cli 0.1.0'\necho 'decoy ran' >&2\nexit 3\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&codex, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir.display().to_string()
}

/// A server whose children's `PATH` has the machine's npm and Node.js and the decoy,
/// but no pinned CLI; installs go to `<home>/state`, npm uses the machine's cache.
fn first_use_server(upstream: &Upstream, home: &TempDir, extra: &[(&str, &str)]) -> Server {
    let path = format!("{}:/usr/local/bin:/usr/bin:/bin", decoy_codex(home));
    let cache = std::env::var("HOME").map_or("/root/.npm".to_string(), |h| format!("{h}/.npm"));
    let state = home.path().join("state");
    let mut env: Vec<(&str, &str)> = vec![
        ("PATH", &path),
        ("ABX_STATE_DIR", state.to_str().unwrap()),
        ("npm_config_cache", &cache),
        ("npm_config_fetch_retries", "0"),
    ];
    env.extend_from_slice(extra);
    agents_server(upstream, home, &env)
}

fn runtime_entry(server: &Server, id: &str) -> Value {
    let (status, list) = server.v1_get("/v1/agents/runtimes");
    assert_eq!(status, 200, "{list}");
    list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == id)
        .cloned()
        .unwrap()
}

fn installs_started(server: &Server) -> usize {
    server
        .output
        .try_iter()
        .filter(|l| l.contains("agents: installing @openai/codex@"))
        .count()
}

/// The contract: the CLIs are not installed until a session uses them. Eight first
/// requests at once share one npm install of the pinned version (from the real
/// registry, into the server's own prefix), then every one of them runs its turn.
#[test]
fn the_cli_is_installed_once_on_first_use() {
    let upstream = serve_upstream();
    let home = TempDir::new("first-use");
    let server = first_use_server(&upstream, &home, &[]);
    let before = runtime_entry(&server, "codex");
    assert_eq!(before["installed"], false, "{before}");
    assert_eq!(before["ignored_on_path"]["version"], "0.1.0", "{before}");
    let addr = server.addr;
    let threads: Vec<_> = (0..8)
        .map(|i| {
            std::thread::spawn(move || {
                let body = json!({"model": "codex", "input": format!("SAY first {i}")});
                crate::support::request_within(
                    addr,
                    "POST",
                    "/v1/responses",
                    &[("Content-Type", "application/json")],
                    Some(body.to_string().as_bytes()),
                    Duration::from_secs(600),
                )
            })
        })
        .collect();
    for (i, thread) in threads.into_iter().enumerate() {
        let reply = thread.join().unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text());
        let response = reply.json();
        assert_eq!(response["status"], "completed", "{response}");
        assert_eq!(output_text(&response), format!("first {i}"));
    }
    assert_eq!(
        installs_started(&server),
        1,
        "one install for eight requests"
    );
    let after = runtime_entry(&server, "codex");
    assert_eq!(after["installed"], true, "{after}");
    assert_eq!(after["source"], "managed", "{after}");
    assert_eq!(after["version"], pin("CODEX_VERSION").as_str(), "{after}");
    let runtimes = home.path().join("state/runtimes");
    let names: Vec<String> = std::fs::read_dir(&runtimes)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [format!("codex-{}", pin("CODEX_VERSION"))],
        "{names:?}"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&runtimes).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    // A restarted server finds its install and starts no other.
    drop(server);
    let server = first_use_server(&upstream, &home, &[]);
    let (status, response) = server.v1_post(
        "/v1/responses",
        json!({"model": "codex", "input": "SAY again"}),
    );
    assert_eq!(status, 200, "{response}");
    assert_eq!(output_text(&response), "again");
    assert_eq!(installs_started(&server), 0);
}

/// A streamed first request follows the install (`response.in_progress` events whose
/// `x_agent_sandbox.install` carries npm's lines), then the turn; a plain request that
/// waits longer than ABX_AGENTS_INSTALL_WAIT is 503 with `Retry-After`.
#[test]
fn a_stream_follows_the_install_and_a_plain_request_is_told_to_retry() {
    let upstream = serve_upstream();
    let home = TempDir::new("first-use-stream");
    let server = first_use_server(&upstream, &home, &[("ABX_AGENTS_INSTALL_WAIT", "0.2")]);
    let reply = server.post_value("/v1/responses", json!({"model": "codex", "input": "SAY x"}));
    assert_eq!(reply.status, 503, "{}", reply.text());
    assert_eq!(reply.json()["error"]["code"], "agents.runtime_installing");
    assert_eq!(reply.header("retry-after"), Some("10"));
    let body = json!({"model": "codex", "input": "SAY streamed", "stream": true}).to_string();
    let request = format!(
        "POST /v1/responses HTTP/1.0\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut reader = crate::support::open_event_stream(&server, request.as_bytes());
    reader
        .get_ref()
        .set_read_timeout(Some(Duration::from_secs(300)))
        .unwrap();
    let mut names = Vec::new();
    let mut notes = 0;
    let mut text = String::new();
    loop {
        let (name, data) = read_event(&mut reader);
        assert_eq!(data["sequence_number"], names.len(), "{name} {data}");
        if name == "response.in_progress"
            && data["response"]["x_agent_sandbox"]["install"].is_object()
        {
            let note = &data["response"]["x_agent_sandbox"]["install"];
            assert_eq!(note["phase"], "installing", "{note}");
            assert_eq!(note["version"], pin("CODEX_VERSION").as_str());
            notes += 1;
        }
        if name == "response.output_text.delta" {
            text.push_str(data["delta"].as_str().unwrap());
        }
        let done = name == "response.completed" || name == "error";
        names.push(name);
        if done {
            break;
        }
    }
    assert_eq!(names.first().map(String::as_str), Some("response.created"));
    assert_eq!(
        names.last().map(String::as_str),
        Some("response.completed"),
        "{names:?}"
    );
    assert!(notes >= 1, "{names:?}");
    assert_eq!(text, "streamed");
}

/// An install that cannot reach its registry is 503 with its cause's code and npm's
/// last lines, leaves nothing behind, and is answered from memory for a while; with
/// auto-install off the answer is the refusal naming the npm command.
#[test]
fn a_failed_install_leaves_nothing_and_auto_install_can_be_off() {
    let upstream = serve_upstream();
    let home = TempDir::new("first-use-fail");
    let closed = crate::support::unused_addr();
    let registry = format!("http://{closed}/");
    let server = first_use_server(&upstream, &home, &[("ABX_AGENTS_NPM_REGISTRY", &registry)]);
    let reply = crate::support::request_within(
        server.addr,
        "POST",
        "/v1/responses",
        &[("Content-Type", "application/json")],
        Some(
            json!({"model": "codex", "input": "SAY x"})
                .to_string()
                .as_bytes(),
        ),
        Duration::from_secs(300),
    );
    assert_eq!(reply.status, 503, "{}", reply.text());
    let error = reply.json()["error"].clone();
    assert_eq!(error["code"], "agents.install_failed.registry", "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("npm's last lines"),
        "{error}"
    );
    assert_eq!(error["x_agent_sandbox"]["runtime"], "codex", "{error}");
    assert!(reply.header("retry-after").is_some());
    let runtimes = home.path().join("state/runtimes");
    let left: Vec<String> = std::fs::read_dir(&runtimes)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    // Remembered: the next request is answered at once, with no second npm run.
    let started = std::time::Instant::now();
    let (status, again) =
        server.v1_post("/v1/responses", json!({"model": "codex", "input": "SAY y"}));
    assert_eq!(
        (status, again["error"]["code"].as_str()),
        (503, Some("agents.install_failed.registry"))
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(installs_started(&server), 1);
    let entry = runtime_entry(&server, "codex");
    assert_eq!(
        entry["last_install_error"]["code"],
        "agents.install_failed.registry"
    );
    drop(server);

    let off = first_use_server(&upstream, &home, &[("ABX_AGENTS_AUTO_INSTALL", "0")]);
    let (status, refused) =
        off.v1_post("/v1/responses", json!({"model": "codex", "input": "SAY z"}));
    assert_eq!(status, 503, "{refused}");
    assert_eq!(refused["error"]["code"], "agents.runtime_not_installed");
    assert_eq!(installs_started(&off), 0);
    assert_eq!(runtime_entry(&off, "codex")["auto_install"], false);
}

/// `POST /v1/responses/compact`: qwen-code's `/compress` of the CLI session a response
/// continues (the stub answers its summariser with a short summary, and counts a long
/// history as long); the session goes on from the summary. codex's sessions are
/// refused, and so are bad bodies.
#[test]
fn qwen_sessions_compact_and_codex_ones_are_refused() {
    let upstream = serve_upstream();
    let home = TempDir::new("agents-home");
    let server = agents_server(&upstream, &home, &[("ABX_AGENTS_DEFAULT", "qwen")]);
    let long = "word ".repeat(3000);
    let (status, first) = server.v1_post("/v1/responses", json!({"input": format!("SAY {long}")}));
    assert_eq!(status, 200, "{first}");
    let (status, compacted) = server.v1_post(
        "/v1/responses/compact",
        json!({"previous_response_id": first["id"]}),
    );
    assert_eq!(status, 200, "{compacted}");
    assert_eq!(compacted["object"], "response.compaction");
    assert!(compacted["id"].as_str().unwrap().starts_with("resp_cmp_"));
    assert!(compacted["created_at"].as_u64().is_some(), "{compacted}");
    let note = &compacted["x_agent_sandbox"];
    let before = note["original_token_count"].as_u64().expect("counts");
    let after = note["new_token_count"].as_u64().expect("counts");
    assert!(before > after, "{note}");
    assert_eq!(compacted["output"][0]["type"], "message", "{compacted}");
    let asked_for_a_summary = upstream
        .seen
        .lock()
        .unwrap()
        .iter()
        .any(|r| r.to_string().contains("summarizes a conversation"));
    assert!(asked_for_a_summary, "qwen asked its model for the summary");
    // The session goes on, from the summary.
    let (status, next) = server.v1_post(
        "/v1/responses",
        json!({"input": "SAY after", "previous_response_id": first["id"]}),
    );
    assert_eq!(
        (status, output_text(&next)),
        (200, "after".to_string()),
        "{next}"
    );

    // The pinned SDK's own call, its answer parsed by its CompactedResponse model.
    let (_, again) = server.v1_post("/v1/responses", json!({"input": format!("SAY {long}")}));
    let script = format!(
        r#"
import sys
from openai import OpenAI
from openai.types.responses import CompactedResponse
client = OpenAI(base_url=sys.argv[1], api_key="local")
r = client.responses.compact(model="qwen-code", previous_response_id="{}")
assert isinstance(r, CompactedResponse) and r.object == "response.compaction", r
CompactedResponse.model_validate(r.model_dump(), strict=True)
assert r.output and r.output[0].type == "message", r
print("ok")
"#,
        again["id"].as_str().unwrap()
    );
    run_sdk_script(&script, &server);

    let compact = |body: Value| server.v1_post("/v1/responses/compact", body);
    let (_, by_codex) = server.v1_post(
        "/v1/responses",
        json!({"model": "codex", "input": "SAY hi"}),
    );
    let (status, refused) = compact(json!({"previous_response_id": by_codex["id"]}));
    assert_eq!(
        (
            status,
            refused["error"]["code"].as_str(),
            refused["error"]["param"].as_str()
        ),
        (400, Some("agents.compact_unsupported"), Some("model")),
        "{refused}"
    );
    for (body, status, param) in [
        (json!({}), 400, "previous_response_id"),
        (
            json!({"previous_response_id": ""}),
            400,
            "previous_response_id",
        ),
        (
            json!({"previous_response_id": first["id"], "input": "x"}),
            400,
            "input",
        ),
        (
            json!({"previous_response_id": "resp_nope"}),
            404,
            "previous_response_id",
        ),
    ] {
        let (got, answer) = compact(body.clone());
        assert_eq!(
            (got, answer["error"]["param"].as_str()),
            (status, Some(param)),
            "{body}: {answer}"
        );
    }
}
