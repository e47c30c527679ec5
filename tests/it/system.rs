//! The system and dev_tools groups against the real binary: `/proc` as the witness for
//! `/system/*` and `/ports`, real children for `/env`, `/packages` and `/code/run`, and
//! real git repositories made in temporary directories.

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

use crate::on_both_drivers;
use crate::support::{Launch, Server, TempDir};

fn meminfo_mib(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap();
    kib / 1024
}

fn system_info_and_metrics_read_the_kernel(driver: &'static str) {
    let server = Server::start(driver);
    let (status, info) = server.get_json("/system/info");
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["os"], "Linux");
    assert_eq!(info["arch"], std::env::consts::ARCH);
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    let cpus: u64 = online
        .trim()
        .split(',')
        .map(|range| match range.split_once('-') {
            Some((a, b)) => b.parse::<u64>().unwrap() - a.parse::<u64>().unwrap() + 1,
            None => 1,
        })
        .sum();
    assert_eq!(info["cpu_count"], cpus);
    assert_eq!(info["memory_total_mb"], meminfo_mib("MemTotal"));
    assert!(info["memory_available_mb"].as_u64().unwrap() <= meminfo_mib("MemTotal"));
    assert!(info["disk_total_gb"].as_f64().unwrap() >= info["disk_free_gb"].as_f64().unwrap());
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(info["hostname"], hostname.trim());
    let python = Command::new("python3").arg("--version").output().unwrap();
    let python = String::from_utf8_lossy(&python.stdout)
        .trim()
        .replace("Python ", "");
    assert_eq!(info["python_version"], python.as_str());

    let (status, first) = server.get_json("/system/metrics");
    assert_eq!(status, 200, "{first}");
    for key in [
        "cpu_load_1m",
        "cpu_load_5m",
        "cpu_load_15m",
        "memory_percent",
        "disk_used_gb",
        "disk_total_gb",
        "disk_percent",
        "uptime_seconds",
    ] {
        assert!(first[key].is_number(), "{key}: {first}");
    }
    assert_eq!(first["memory_total_mb"], meminfo_mib("MemTotal"));
    let percent = first["memory_percent"].as_f64().unwrap();
    assert!((0.0..=100.0).contains(&percent));
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (_, later) = server.get_json("/system/metrics");
    assert!(
        later["uptime_seconds"].as_f64().unwrap()
            >= first["uptime_seconds"].as_f64().unwrap() + 0.1,
        "uptime counts from the server's start: {first} then {later}"
    );
}

fn env_hides_secrets_and_sets_for_later_children(driver: &'static str) {
    let server = Launch::new(driver)
        .env("MY_API_TOKEN", "t0ps3cret")
        .env("aws_secret_thing", "x")
        .env("db_Password", "x")
        .env("SSH_KEY_PATH", "x")
        .env("GIT_CREDENTIALS", "x")
        .env("PLAIN_SETTING", "visible")
        .start();
    let (status, listed) = server.get_json("/env");
    assert_eq!(status, 200);
    let vars = listed["variables"].as_object().unwrap();
    assert_eq!(vars["PLAIN_SETTING"], "visible");
    for hidden in [
        "MY_API_TOKEN",
        "aws_secret_thing",
        "db_Password",
        "SSH_KEY_PATH",
        "GIT_CREDENTIALS",
    ] {
        assert!(!vars.contains_key(hidden), "{hidden} is listed");
    }
    assert!(!listed.to_string().contains("t0ps3cret"));
    let (_, filtered) = server.get_json("/env?filter=PLAIN_SETTING,MY_API_TOKEN,NOT_SET");
    assert_eq!(filtered, json!({"variables": {"PLAIN_SETTING": "visible"}}));

    // Values are strings, and later children see them.
    let (status, body) = server.post_json(
        "/env",
        json!({"vars": {"NEW_NUMBER": "1.5", "new_flag": "True", "PLAIN_SETTING": "changed"}}),
    );
    assert_eq!(
        (status, &body),
        (
            200,
            &json!({"updated": ["NEW_NUMBER", "new_flag", "PLAIN_SETTING"]})
        )
    );
    let (_, shell) = server.post_json("/shell", json!({"command": "env"}));
    let out = shell["stdout"].as_str().unwrap();
    for line in ["NEW_NUMBER=1.5", "new_flag=True", "PLAIN_SETTING=changed"] {
        assert!(out.lines().any(|l| l == line), "{line} missing from {out}");
    }
    let (_, listed) = server.get_json("/env?filter=NEW_NUMBER");
    assert_eq!(listed, json!({"variables": {"NEW_NUMBER": "1.5"}}));
    // Protected names refuse the whole request, in the reference's words: PATH, HOME,
    // USER and SHELL exactly, ABX_* in any case.
    for (name, kind, code) in [
        ("PATH", "PermissionError", None),
        ("SHELL", "PermissionError", None),
        ("ABX_SERVER_TOKEN", "PolicyDenied", Some("env_var_denied")),
        ("abx_anything", "PolicyDenied", Some("env_var_denied")),
    ] {
        let (status, body) =
            server.post_json("/env", json!({"vars": {"SET_BEFORE": "1", name: "x"}}));
        assert_eq!(
            (status, body["type"].as_str(), body["code"].as_str()),
            (403, Some(kind), code),
            "{name}: {body}"
        );
    }
    let (_, listed) = server.get_json("/env?filter=SET_BEFORE");
    assert_eq!(
        listed,
        json!({"variables": {}}),
        "a refused request sets nothing"
    );
    for bad in [json!({"vars": ["A"]}), json!({"vars": "A=1"})] {
        let (status, body) = server.post_json("/env", bad.clone());
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some("'vars' must be an object")),
            "{bad}"
        );
    }
    // A name that is not [A-Za-z_][A-Za-z0-9_]*, or a value that is not a string.
    for (name, value) in [
        ("A=B", json!("1")),
        ("1A", json!("1")),
        ("A", json!(1.5)),
        ("A", json!([1])),
        ("A", json!(null)),
        ("A", json!("x\u{0}y")),
    ] {
        let (status, body) = server.post_json("/env", json!({"vars": {name: value}}));
        assert_eq!(
            (status, body["code"].as_str(), body["endpoint"].as_str()),
            (400, Some("env_invalid"), Some("env_set")),
            "{name}={value}: {body}"
        );
    }
    // None is an empty update.
    assert_eq!(
        server.post_json("/env", json!({})),
        (200, json!({"updated": []}))
    );
}

fn ports_show_the_servers_own_port_and_pid(driver: &'static str) {
    let server = Server::start(driver);
    let (status, body) = server.get_json("/ports");
    assert_eq!(status, 200);
    let rows = body["listening"].as_array().unwrap();
    let ours: Vec<&Value> = rows
        .iter()
        .filter(|r| r["port"] == server.addr.port())
        .collect();
    assert_eq!(
        ours,
        [
            &json!({"port": server.addr.port(), "protocol": "tcp", "address": "127.0.0.1", "pid": server.child.id()})
        ],
        "one row for the port, whatever the number of workers: {body}"
    );
    // A listener of another process, on IPv6.
    let other = std::net::TcpListener::bind("[::1]:0").unwrap();
    let (_, body) = server.get_json("/ports");
    let port = other.local_addr().unwrap().port();
    let row = body["listening"]
        .as_array()
        .unwrap()
        .iter()
        // The kernel may give [::1] the number the server has on 127.0.0.1.
        .find(|r| r["port"] == port && r["protocol"] == "tcp6")
        .cloned()
        .unwrap_or_else(|| panic!("{port} not in {body}"));
    assert_eq!(
        row,
        json!({"port": port, "protocol": "tcp6", "address": "::1", "pid": std::process::id()})
    );
}

/// A directory with fake `python3` and `npm` programs, put first on the server's PATH.
fn fake_programs(dir: &Path, script: &str) {
    for name in ["python3", "npm"] {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
        let mut perms = std::fs::metadata(&path).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&path, perms).unwrap();
    }
}

fn packages_list_pip_and_npm(driver: &'static str) {
    let server = Server::start(driver);
    let (status, body) = server.get_json("/packages");
    assert_eq!((status, &body["manager"]), (200, &json!("pip")), "{body}");
    assert!(
        body["packages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "pip"),
        "{body}"
    );
    assert_eq!(server.get_json("/packages?manager=cargo").0, 400);

    // npm's JSON, and pip's, as the programs print them.
    let bin = TempDir::new("fakebin");
    fake_programs(
        bin.path(),
        r#"case "$0" in *npm) echo '{"name":"x","dependencies":{"left-pad":{"version":"1.3.0"},"@scope/y":{"version":"2.0.0"}}}';; *) echo '[{"name":"requests","version":"2.32.0"}]';; esac"#,
    );
    let path = format!("{}:/usr/bin:/bin", bin.path().display());
    let faked = Launch::new(driver).env("PATH", &path).start();
    assert_eq!(
        faked.get_json("/packages?manager=npm").1,
        json!({"manager": "npm", "packages": [{"name": "left-pad", "version": "1.3.0"}, {"name": "@scope/y", "version": "2.0.0"}]})
    );
    assert_eq!(
        faked.get_json("/packages?manager=pip").1,
        json!({"manager": "pip", "packages": [{"name": "requests", "version": "2.32.0"}]})
    );

    // Neither program installed: empty lists.
    let empty = TempDir::new("nobin");
    let missing = Launch::new(driver)
        .env("PATH", empty.path().to_str().unwrap())
        .start();
    for manager in ["pip", "npm"] {
        assert_eq!(
            missing.get_json(&format!("/packages?manager={manager}")),
            (200, json!({"manager": manager, "packages": []}))
        );
    }
}

fn packages_time_out_after_ten_seconds(driver: &'static str) {
    let bin = TempDir::new("slowbin");
    fake_programs(bin.path(), "exec sleep 60");
    let path = format!("{}:/usr/bin:/bin", bin.path().display());
    let server = Launch::new(driver).env("PATH", &path).start();
    let (status, body) = server.get_json("/packages?manager=npm");
    assert_eq!(
        (status, body),
        (
            500,
            json!({"error": "npm list timed out after 10s", "type": "TimeoutError"})
        )
    );
}

fn dev_tools(driver: &'static str) -> Launch {
    Launch::new(driver).env("ABX_SERVER_ENABLED_GROUPS", "dev_tools")
}

fn code_runs_in_three_languages(driver: &'static str) {
    let off = Server::start(driver);
    let (status, body) = off.post_json("/code/run", json!({"code": "print(1)"}));
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("endpoint_disabled")),
        "dev_tools is opt-in"
    );

    let server = dev_tools(driver).start();
    let (status, body) = server.post_json(
        "/code/run",
        json!({"code": "import sys; print('hello'); print('err', file=sys.stderr); sys.exit(3)"}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (
            &body["stdout"],
            &body["stderr"],
            &body["exit_code"],
            &body["language"]
        ),
        (
            &json!("hello\n"),
            &json!("err\n"),
            &json!(3),
            &json!("python")
        )
    );
    assert!(body["execution_time_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(
        body["_security_note"],
        "Security relies on container isolation, not application-level restrictions"
    );
    let (_, body) = server.post_json(
        "/code/run",
        json!({"code": "echo $((6 * 7)) $0", "language": "bash"}),
    );
    assert_eq!(body["stdout"], "42 bash\n");
    let node_installed = Command::new("node").arg("--version").output().is_ok();
    let (status, body) = server.post_json(
        "/code/run",
        json!({"code": "console.log(6 * 7)", "language": "node"}),
    );
    if node_installed {
        assert_eq!((status, &body["stdout"]), (200, &json!("42\n")), "{body}");
    } else {
        assert_eq!(
            (status, body["type"].as_str()),
            (500, Some("FileNotFoundError")),
            "{body}"
        );
    }
    // A missing runtime is a 500 naming it.
    let empty = TempDir::new("nobin");
    let bare = dev_tools(driver)
        .env("PATH", empty.path().to_str().unwrap())
        .start();
    let (status, body) = bare.post_json("/code/run", json!({"code": "1", "language": "node"}));
    assert_eq!(
        (status, body["type"].as_str()),
        (500, Some("FileNotFoundError")),
        "{body}"
    );
    assert!(body["error"]
        .as_str()
        .unwrap()
        .starts_with("Runtime not found: node"));

    let (status, body) = server.post_json(
        "/code/run",
        json!({"code": "sleep 30", "language": "bash", "timeout": 0.5}),
    );
    assert_eq!(
        (status, body),
        (
            408,
            json!({"error": "Execution timed out after 0.5s", "type": "TimeoutError"})
        )
    );
    for bad in [
        json!({}),
        json!({"code": ""}),
        json!({"code": 1}),
        json!({"code": "1", "language": "ruby"}),
    ] {
        assert_eq!(server.post_json("/code/run", bad.clone()).0, 400, "{bad}");
    }
    // A timeout that is not a positive number is the default, as on the reference.
    for timeout in [json!("soon"), json!(-1)] {
        let (status, body) =
            server.post_json("/code/run", json!({"code": "print(1)", "timeout": timeout}));
        assert_eq!((status, &body["stdout"]), (200, &json!("1\n")), "{body}");
    }
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=Test",
            "-c",
            "user.email=test@example.com",
            "-c",
            "init.defaultBranch=main",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A repository at `base/repo` with one change of every kind.
fn messy_repository(base: &Path) -> std::path::PathBuf {
    let repo = base.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q"]);
    for (name, text) in [
        ("kept.txt", "one\ntwo\n"),
        ("gone.txt", "bye\n"),
        ("old name.txt", "moving\n"),
        ("conflict.txt", "base\n"),
    ] {
        std::fs::write(repo.join(name), text).unwrap();
    }
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-qm", "first"]);
    // A conflict: both branches change conflict.txt.
    git(&repo, &["checkout", "-qb", "side"]);
    std::fs::write(repo.join("conflict.txt"), "side\n").unwrap();
    git(&repo, &["commit", "-qam", "side"]);
    git(&repo, &["checkout", "-q", "main"]);
    std::fs::write(repo.join("conflict.txt"), "main\n").unwrap();
    git(&repo, &["commit", "-qam", "main"]);
    git(&repo, &["merge", "-q", "side"]);
    std::fs::write(repo.join("kept.txt"), "one\nTWO\nthree\n").unwrap();
    std::fs::remove_file(repo.join("gone.txt")).unwrap();
    git(&repo, &["mv", "old name.txt", "new name.txt"]);
    std::fs::write(repo.join("staged new.txt"), "new\n").unwrap();
    git(&repo, &["add", "staged new.txt"]);
    std::fs::write(repo.join("line\nbreak.txt"), "odd\n").unwrap();
    repo
}

fn git_status_names_every_kind_of_change(driver: &'static str) {
    let base = TempDir::new("gitbase");
    let repo = messy_repository(base.path());
    let server = dev_tools(driver).base_dir(base.path()).start();
    let (status, body) = server.get_json("/git/status?path=repo");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["branch"], "main");
    assert_eq!(body["clean"], false);
    let mut files: Vec<(String, String)> = body["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_string(),
                f["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            ("conflict.txt", "unmerged"),
            ("gone.txt", "deleted"),
            ("kept.txt", "modified"),
            ("line\nbreak.txt", "untracked"),
            ("new name.txt", "renamed"),
            ("staged new.txt", "added"),
        ]
        .map(|(p, s)| (p.to_string(), s.to_string()))
    );
    let renamed = body["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["status"] == "renamed")
        .unwrap();
    assert_eq!(renamed["original_path"], "old name.txt");

    // A clean repository.
    git(&repo, &["merge", "--abort"]);
    git(&repo, &["reset", "-q", "--hard"]);
    std::fs::remove_file(repo.join("line\nbreak.txt")).unwrap();
    assert_eq!(
        server.get_json("/git/status?path=repo").1,
        json!({"branch": "main", "clean": true, "files": []})
    );
    // Not a repository: git's own words, 400 GitError.
    std::fs::create_dir(base.path().join("plain")).unwrap();
    let (status, body) = server.get_json("/git/status?path=plain");
    assert_eq!(
        (status, body["type"].as_str()),
        (400, Some("GitError")),
        "{body}"
    );
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("not a git repository"),
        "{body}"
    );
    let (status, body) = server.get_json("/git/status?path=/etc");
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("path_not_allowed")),
        "{body}"
    );
    // git missing: 500.
    let empty = TempDir::new("nobin");
    let bare = dev_tools(driver)
        .base_dir(base.path())
        .env("PATH", empty.path().to_str().unwrap())
        .start();
    let (status, body) = bare.get_json("/git/status?path=repo");
    assert_eq!(
        (status, body["type"].as_str()),
        (500, Some("FileNotFoundError")),
        "{body}"
    );
}

fn git_diff_with_stats_staged_and_cut(driver: &'static str) {
    let base = TempDir::new("gitdiff");
    let repo = base.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q"]);
    std::fs::write(repo.join("a.txt"), "one\ntwo\n").unwrap();
    std::fs::write(repo.join("b.txt"), "bee\n").unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-qm", "first"]);
    std::fs::write(repo.join("a.txt"), "one\nTWO\nthree\n").unwrap();
    std::fs::write(repo.join("b.txt"), "").unwrap();
    git(&repo, &["add", "b.txt"]);
    let server = dev_tools(driver).base_dir(base.path()).start();

    let (status, body) = server.get_json("/git/diff?path=repo");
    assert_eq!(status, 200, "{body}");
    let diff = body["diff"].as_str().unwrap();
    assert!(diff.starts_with("diff --git a/a.txt b/a.txt\n"), "{diff}");
    assert!(diff.contains("\n-two\n+TWO\n+three\n"), "{diff}");
    assert_eq!(
        body["stats"],
        json!({"files_changed": 1, "insertions": 2, "deletions": 1})
    );
    let (_, staged) = server.get_json("/git/diff?path=repo&staged=yes");
    assert!(
        staged["diff"].as_str().unwrap().contains("-bee\n"),
        "{staged}"
    );
    assert_eq!(
        staged["stats"],
        json!({"files_changed": 1, "insertions": 0, "deletions": 1})
    );
    let (_, none) = server.get_json("/git/diff?path=repo&file=b.txt");
    assert_eq!(
        none,
        json!({"diff": "", "stats": {"files_changed": 0, "insertions": 0, "deletions": 0}})
    );

    // Over 1 MiB: cut, with a last line saying so.
    let big: String = (0..40_000)
        .map(|i| format!("line {i} of a long file\n"))
        .collect();
    std::fs::write(repo.join("big.txt"), "").unwrap();
    git(&repo, &["add", "big.txt"]);
    git(&repo, &["commit", "-qm", "big"]);
    std::fs::write(repo.join("big.txt"), &big).unwrap();
    let (_, cut) = server.get_json("/git/diff?path=repo&file=big.txt");
    let diff = cut["diff"].as_str().unwrap();
    assert!(diff.len() < 1024 * 1024 + 100, "{}", diff.len());
    assert!(diff.ends_with("\n... diff truncated at 1 MiB ...\n"));
    assert_eq!(cut["truncated"], true);
    assert_eq!(
        cut["stats"],
        json!({"files_changed": 1, "insertions": 40_000, "deletions": 0})
    );
    let (status, body) = server.get_json("/git/diff?path=.");
    assert_eq!(
        (status, body["type"].as_str()),
        (400, Some("GitError")),
        "{body}"
    );
}

/// git answers only for repositories inside the base directory, and runs no program a
/// repository's configuration, its attributes, an uploaded `~/.gitconfig` or the
/// environment names.
fn git_stays_inside_the_base_and_runs_nothing(driver: &'static str) {
    let top = TempDir::new("gitconfine");
    // A repository above the base directory is not the base's repository.
    let above = top.path().join("above");
    let base = above.join("base");
    std::fs::create_dir_all(&base).unwrap();
    git(&above, &["init", "-q"]);
    std::fs::write(above.join("secret.txt"), "outside\n").unwrap();
    std::fs::write(base.join("mine.txt"), "inside\n").unwrap();
    let markers = top.path().join("markers");
    std::fs::create_dir(&markers).unwrap();
    let marker = |name: &str| markers.join(name).to_str().unwrap().to_string();
    let server = dev_tools(driver)
        .base_dir(&base)
        .env("HOME", base.to_str().unwrap())
        // Variables the server itself was started with never reach git either.
        .env("GIT_CONFIG_COUNT", "1")
        .env("GIT_CONFIG_KEY_0", "core.fsmonitor")
        .env(
            "GIT_CONFIG_VALUE_0",
            &format!("touch {}", marker("from-env")),
        )
        .env("GIT_DIR", above.join(".git").to_str().unwrap())
        .start();
    let (status, body) = server.get_json("/git/status?path=.");
    assert_eq!(
        (status, body["type"].as_str()),
        (400, Some("GitError")),
        "{body}"
    );
    assert!(!body.to_string().contains("secret.txt"), "{body}");

    // A repository inside, whose configuration names programs everywhere it can.
    let repo = base.join("repo");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q"]);
    std::fs::write(repo.join("a.txt"), "one\n").unwrap();
    std::fs::write(repo.join("second.txt"), "one\n").unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-qm", "first"]);
    let outside_tree = top.path().join("tree");
    std::fs::create_dir(&outside_tree).unwrap();
    std::fs::write(outside_tree.join("outside.txt"), "x\n").unwrap();
    let config = format!(
        "[core]\n\tfsmonitor = touch {fsmonitor}\n\thooksPath = {hooks}\n\tpager = touch {pager}\n\tworktree = {tree}\n\
         [filter \"evil\"]\n\tclean = tee {clean}\n\tsmudge = tee {smudge}\n\trequired = true\n\
         [filter \"a=b\"]\n\tclean = tee {clean_eq}\n\
         [diff]\n\texternal = touch {external}\n[diff \"tc\"]\n\ttextconv = touch {textconv}\n",
        fsmonitor = marker("fsmonitor"),
        hooks = markers.display(),
        pager = marker("pager"),
        tree = outside_tree.display(),
        clean = marker("clean"),
        smudge = marker("smudge"),
        clean_eq = marker("clean-eq"),
        external = marker("external"),
        textconv = marker("textconv"),
    );
    let mut existing = std::fs::read_to_string(repo.join(".git/config")).unwrap();
    existing.push_str(&config);
    std::fs::write(repo.join(".git/config"), existing).unwrap();
    std::fs::write(
        repo.join(".gitattributes"),
        "* filter=evil diff=tc\nsecond.txt filter=a=b\n",
    )
    .unwrap();
    std::fs::write(repo.join("second.txt"), "one\ntwo\n").unwrap();
    std::fs::write(
        base.join(".gitconfig"),
        format!("[core]\n\tfsmonitor = touch {}\n", marker("global")),
    )
    .unwrap();
    std::fs::write(repo.join("a.txt"), "one\ntwo\n").unwrap();
    let (status, body) = server.get_json("/git/status?path=repo");
    assert_eq!(status, 200, "{body}");
    let files = body["files"].to_string();
    assert!(
        files.contains("a.txt") && !files.contains("outside.txt"),
        "{body}"
    );
    let (status, body) = server.get_json("/git/diff?path=repo");
    assert_eq!(status, 200, "{body}");
    assert!(body["diff"].as_str().unwrap().contains("+two"), "{body}");
    // A configuration that names programs only where the fixed overrides reach (no
    // section the listing would blank keys of, so the server does not list it): git
    // runs none of them either.
    let plain = base.join("plain");
    std::fs::create_dir(&plain).unwrap();
    git(&plain, &["init", "-q"]);
    std::fs::write(plain.join("b.txt"), "one\n").unwrap();
    let mut config = std::fs::read_to_string(plain.join(".git/config")).unwrap();
    config.push_str(&format!(
        "[core]\n\tfsmonitor = touch {}\n\tpager = touch {}\n\thooksPath = {}\n",
        marker("plain-fsmonitor"),
        marker("plain-pager"),
        markers.display(),
    ));
    std::fs::write(plain.join(".git/config"), config).unwrap();
    for route in ["status", "diff"] {
        let (status, body) = server.get_json(&format!("/git/{route}?path=plain"));
        assert_eq!(status, 200, "{route}: {body}");
        if route == "status" {
            assert!(body["files"].to_string().contains("b.txt"), "{body}");
        }
    }
    let ran: Vec<String> = std::fs::read_dir(&markers)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        ran,
        Vec::<String>::new(),
        "git ran programs the repository named"
    );

    // A .git that leads outside: a symlink, a gitdir: file, alternates.
    let linked = base.join("linked");
    std::fs::create_dir(&linked).unwrap();
    std::os::unix::fs::symlink(above.join(".git"), linked.join(".git")).unwrap();
    let pointer = base.join("pointer");
    std::fs::create_dir(&pointer).unwrap();
    std::fs::write(
        pointer.join(".git"),
        format!("gitdir: {}\n", above.join(".git").display()),
    )
    .unwrap();
    std::fs::write(
        repo.join(".git/objects/info/alternates"),
        format!("{}\n", above.join(".git/objects").display()),
    )
    .unwrap();
    for path in ["linked", "pointer", "repo"] {
        for route in ["status", "diff"] {
            let (status, body) = server.get_json(&format!("/git/{route}?path={path}"));
            assert_eq!(
                (status, body["code"].as_str()),
                (403, Some("path_not_allowed")),
                "{route} {path}: {body}"
            );
        }
    }

    // POST /env cannot point git elsewhere either.
    for name in [
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_CONFIG_COUNT",
        "git_config_key_0",
        "GIT_CONFIG_GLOBAL",
    ] {
        let (status, body) = server.post_json("/env", json!({"vars": {name: "x"}}));
        assert_eq!(
            (status, body["code"].as_str()),
            (403, Some("variable_not_allowed")),
            "{name}: {body}"
        );
    }
}

/// Variables that make a child load code it was not asked to run are refused: 400 in a
/// request's `env`, 403 from `POST /env`; the terminal keeps stripping the contract's
/// three (tests/it/terminal.rs).
fn code_loading_variables_are_refused(driver: &'static str) {
    let server = Server::start(driver);
    for name in [
        "LD_PRELOAD",
        "LD_AUDIT",
        "DYLD_INSERT_LIBRARIES",
        "BASH_ENV",
        "ENV",
        "BASH_FUNC_ls%%",
        "NODE_OPTIONS",
        "PYTHONPATH",
    ] {
        for route in ["/shell", "/shell/stream", "/process/start"] {
            let (status, body) = server.post_json(
                route,
                json!({"command": "true", "env": {name: "/tmp/x.so"}}),
            );
            assert_eq!(
                (status, body["code"].as_str()),
                (400, Some("variable_not_allowed")),
                "{route} {name}: {body}"
            );
        }
        let (status, body) = server.post_json("/env", json!({"vars": {name: "/tmp/x.so"}}));
        // A name that is no variable name at all is the reference's 400 first.
        let expected = if name.contains('%') {
            (400, Some("env_invalid"))
        } else {
            (403, Some("variable_not_allowed"))
        };
        assert_eq!((status, body["code"].as_str()), expected, "{name}: {body}");
    }
    let (status, body) = server.post_json(
        "/shell",
        json!({"command": "printenv MY_VAR", "env": {"MY_VAR": "kept"}}),
    );
    assert_eq!(
        (status, body["stdout"].as_str()),
        (200, Some("kept\n")),
        "{body}"
    );
}

/// No secret reaches a child: neither `ABX_SERVER_TOKEN` nor a policy identity's
/// `token_env` is in any child's environment, and the server's own `/proc` environment
/// no longer holds them once it serves. Under `ABX_CHILD_USER` children run as that user
/// and cannot read the server's environment or memory (the server is not dumpable).
fn secrets_never_reach_a_child(driver: &'static str) {
    let dir = TempDir::new("secrets");
    let policy = dir.path().join("policy.json");
    std::fs::write(
        &policy,
        r#"{"groups": {"dev_tools": true}, "identities": [{"id": "op", "scopes": ["*"], "token_env": "OP_TOKEN_FOR_TEST"}]}"#,
    )
    .unwrap();
    let start = |child_user: Option<&str>| {
        let mut launch = Launch::new(driver)
            .env("ABX_SERVER_TOKEN", "server-secret-4d1f")
            .env("OP_TOKEN_FOR_TEST", "identity-secret-9b2e")
            .env("ABX_SERVER_POLICY", policy.to_str().unwrap());
        if let Some(user) = child_user {
            launch = launch.env("ABX_CHILD_USER", user);
        }
        launch.start()
    };
    let auth = [("Authorization", "Bearer identity-secret-9b2e")];
    let run = |server: &Server, route: &str, body: Value| {
        let reply = server.request("POST", route, &auth, Some(body.to_string().as_bytes()));
        assert_eq!(reply.status, 200, "{route}: {}", reply.text());
        reply.text()
    };
    let server = start(None);
    let seen = [
        run(&server, "/shell", json!({"command": "env"})),
        run(&server, "/shell/stream", json!({"command": "env"})),
        run(
            &server,
            "/code/run",
            json!({"code": "import os; print(dict(os.environ))"}),
        ),
    ];
    for text in &seen {
        assert!(
            !text.contains("server-secret-4d1f") && !text.contains("identity-secret-9b2e"),
            "a child saw a secret: {text}"
        );
    }
    // The identity's token still works: the server kept it in its memory. The policy
    // names its own tokens, so ABX_SERVER_TOKEN is no credential (as on the reference),
    // yet it is kept from every child all the same.
    let reply = server.request("GET", "/capabilities", &auth, None);
    assert_eq!(reply.status, 200);
    let reply = server.request(
        "GET",
        "/capabilities",
        &[("Authorization", "Bearer server-secret-4d1f")],
        None,
    );
    assert_eq!(reply.status, 401);
    let pid = server.child.id();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    for (what, bytes) in [("environ", &environ), ("cmdline", &cmdline)] {
        let text = String::from_utf8_lossy(bytes);
        assert!(
            !text.contains("server-secret-4d1f") && !text.contains("identity-secret-9b2e"),
            "the server's {what} holds a secret"
        );
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(!status.is_empty());
    let dumpable = Command::new("sh")
        .arg("-c")
        .arg(format!("stat -c %u /proc/{pid}/environ"))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&dumpable.stdout).trim(),
        "0",
        "not dumpable: root owns its /proc files"
    );

    // Children as an unprivileged user: nobody (65534).
    let low = start(Some("65534:65534"));
    let out: Value =
        serde_json::from_str(&run(&low, "/shell", json!({"command": "id -u"}))).unwrap();
    assert_eq!(out["stdout"], "65534\n", "{out}");
    let server_pid = low.child.id();
    for file in ["environ", "mem", "maps"] {
        let out: Value = serde_json::from_str(&run(
            &low,
            "/shell",
            json!({"command": format!("cat /proc/{server_pid}/{file}")}),
        ))
        .unwrap();
        assert_ne!(out["exit_code"], 0, "{file}: {out}");
        assert!(
            out["stderr"]
                .as_str()
                .unwrap()
                .contains("Permission denied"),
            "{file}: {out}"
        );
    }
    // Not root is refused at startup only when the server itself is not root; as root a
    // root child user is refused.
    let (code, stderr) = Launch::new(driver).env("ABX_CHILD_USER", "0").fail();
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("ABX_CHILD_USER"), "{stderr}");
}

on_both_drivers!(
    secrets_never_reach_a_child,
    git_stays_inside_the_base_and_runs_nothing,
    code_loading_variables_are_refused,
    system_info_and_metrics_read_the_kernel,
    env_hides_secrets_and_sets_for_later_children,
    ports_show_the_servers_own_port_and_pid,
    packages_list_pip_and_npm,
    packages_time_out_after_ten_seconds,
    code_runs_in_three_languages,
    git_status_names_every_kind_of_change,
    git_diff_with_stats_staged_and_cut,
);
