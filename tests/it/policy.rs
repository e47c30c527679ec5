//! Policy documents against the real binary: YAML and JSON, a template's template.yaml,
//! presets, and `--check-policy`.

use std::process::Command;

use serde_json::json;

use crate::on_both_drivers;
use crate::support::{Launch, TempDir, MAIN_BIN};

fn check_policy(path: &std::path::Path) -> (i32, String, String) {
    let output = Command::new(MAIN_BIN)
        .arg("--check-policy")
        .arg(path)
        .env_remove("ABX_SERVER_POLICY")
        .env_remove("ABX_SERVER_ENABLED_GROUPS")
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The row of `--check-policy`'s table for endpoint `id`: (enabled, rule).
fn row(table: &str, id: &str) -> (String, String) {
    let line = table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(id))
        .unwrap_or_else(|| panic!("no row for {id} in\n{table}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    (fields[3].to_string(), fields[4].to_string())
}

#[test]
fn check_policy_prints_every_preset_and_refuses_bad_documents() {
    let dir = TempDir::new("checkpolicy");
    for (preset, on, off) in [
        (
            "default",
            vec!["upload", "shell", "pty_connect"],
            vec!["code_run"],
        ),
        (
            "locked-down",
            vec!["download", "files_list", "commands_run", "health"],
            vec!["upload", "shell", "pty_create", "env_set"],
        ),
        (
            "read-only",
            vec!["download", "files_search", "process_list", "env_get"],
            vec![
                "upload",
                "shell",
                "commands_run",
                "git_status",
                "pty_connect",
            ],
        ),
    ] {
        let path = dir.path().join(format!("{preset}.yaml"));
        std::fs::write(&path, format!("preset: {preset}\n")).unwrap();
        let (code, table, stderr) = check_policy(&path);
        assert_eq!(code, 0, "{stderr}");
        assert!(table.contains(&format!("preset={preset}")), "{table}");
        for id in on {
            assert_eq!(row(&table, id).0, "true", "{preset}: {id}\n{table}");
        }
        for id in off {
            assert_eq!(row(&table, id).0, "false", "{preset}: {id}\n{table}");
        }
        if preset != "default" {
            assert_eq!(row(&table, "upload").1, format!("preset:{preset}"));
        }
    }
    // Errors name the key and its line, and exit 2.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "preset: default\nendpoints:\n  shell:\n    enabled: sometimes\n",
    )
    .unwrap();
    let (code, _, stderr) = check_policy(&bad);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("line 4: endpoints.shell.enabled must be true or false"),
        "{stderr}"
    );
    std::fs::write(&bad, "groups: [process\n").unwrap();
    let (code, _, stderr) = check_policy(&bad);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("line 2") || stderr.contains("line 1"),
        "{stderr}"
    );
    std::fs::write(&bad, "preset: paranoid\n").unwrap();
    let (code, _, stderr) = check_policy(&bad);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("preset must be one of default, locked-down, read-only"),
        "{stderr}"
    );
}

fn yaml_policies_and_template_yaml_are_applied(driver: &'static str) {
    let dir = TempDir::new("yamlpolicy");
    let policy = dir.path().join("policy.yml");
    std::fs::write(
        &policy,
        "# YAML, with comments\npreset: read-only\ngroups:\n  dev_tools: true\nendpoints:\n  code_run: {enabled: false}\n",
    )
    .unwrap();
    let server = Launch::new(driver)
        .env("ABX_SERVER_POLICY", policy.to_str().unwrap())
        .start();
    let caps = server.get("/capabilities").json();
    assert_eq!(caps["policy"]["preset"], "read-only");
    assert_eq!(caps["endpoints"]["upload"]["rule"], "preset:read-only");
    assert_eq!(
        caps["endpoints"]["git_status"]["enabled"], true,
        "the document's group beats the preset"
    );
    assert_eq!(
        caps["endpoints"]["code_run"]["rule"],
        "policy:endpoints.code_run"
    );
    let reply = server.post("/upload", r#"{"path": "x.txt", "content_base64": ""}"#);
    assert_eq!(
        (reply.status, reply.json()["code"].clone()),
        (404, json!("endpoint_disabled"))
    );

    // A template directory: its template.yaml's server: section is the policy of a
    // server started there without ABX_SERVER_POLICY.
    let template = TempDir::new("templatedir");
    std::fs::write(
        template.path().join("template.yaml"),
        "name: t\nports: [9000, 9001]\nserver:\n  groups: [dev_tools]\n  endpoints:\n    shell: {enabled: false}\n",
    )
    .unwrap();
    let mut launch = Launch::new(driver);
    launch.current_dir = Some(template.path().to_path_buf());
    let server = launch.start();
    let caps = server.get("/capabilities").json();
    assert_eq!(caps["policy"]["configured"], true);
    assert_eq!(caps["endpoints"]["code_run"]["enabled"], true);
    assert_eq!(caps["endpoints"]["shell"]["rule"], "policy:endpoints.shell");
}

on_both_drivers!(yaml_policies_and_template_yaml_are_applied);
