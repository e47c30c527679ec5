//! Server configuration: command-line flags beat `ABX_*` environment variables, which beat
//! the built-in defaults. Parsed once at startup and then shared read-only by every thread.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::api::Group;

/// Which event loop backs the worker runtimes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoDriverChoice {
    /// io_uring when the kernel (and seccomp) allow it, epoll otherwise.
    Auto,
    /// io_uring or refuse to start.
    Uring,
    /// epoll, even where io_uring would work.
    Epoll,
}

impl IoDriverChoice {
    fn parse(value: &str) -> Option<Self> {
        match value {
            "auto" => Some(Self::Auto),
            "uring" | "io_uring" | "iouring" => Some(Self::Uring),
            "epoll" | "legacy" => Some(Self::Epoll),
            _ => None,
        }
    }
}

/// Everything the server needs to know before it binds its first socket.
#[derive(Clone, Debug)]
pub struct Config {
    pub host: IpAddr,
    pub port: u16,
    pub pty_port: u16,
    /// The port of the `k8s_runtime` group (kubernetes-sigs/agent-sandbox's runtime
    /// contract), bound only while that group is on.
    pub k8s_runtime_port: u16,
    /// The port of the `envd` group (E2B's envd protocol; envd's own port by default).
    pub envd_port: u16,
    /// `ABX_ENVD_DEFAULT_USER`: who envd's calls run as when they name no user (else
    /// `user` where that account exists, else the server's own user).
    pub envd_default_user: Option<String>,
    pub workers: usize,
    pub base_dir: PathBuf,
    /// `ABX_SERVER_TOKEN`; `None` (unset or empty) is local mode.
    pub token: Option<String>,
    /// `ABX_TOKEN_FILE`: a file whose content is the server token, read again whenever
    /// it changes; while it is missing or empty no route that needs a token answers.
    pub token_file: Option<PathBuf>,
    /// Opt-in groups named in `ABX_SERVER_ENABLED_GROUPS`.
    pub enabled_groups: Vec<Group>,
    pub max_upload_size: u64,
    /// Path of the policy document: `--policy`, `ABX_SERVER_POLICY` naming a file,
    /// `ABX_SERVER_POLICY_FILE`, `/etc/agent-sandbox/server-policy.json`, or a
    /// template's `template.yaml`, the first that is given.
    pub policy_path: Option<PathBuf>,
    /// The policy document itself, when `ABX_SERVER_POLICY` holds JSON (as the
    /// reference reads it) rather than a path.
    pub policy_inline: Option<String>,
    pub io_driver: IoDriverChoice,
    /// How long a keep-alive connection may sit between requests.
    pub idle_timeout: Duration,
    /// How long a started request (head or body) may take to arrive.
    pub read_timeout: Duration,
    /// Upper bound on threads in the blocking pool.
    pub blocking_threads: usize,
    /// How long a blocking-pool thread may sit idle before it exits.
    pub blocking_idle_timeout: Duration,
    /// `ABX_CHILD_USER`: every child runs as this user and group (uid, gid), not as the
    /// server's.
    pub child_user: Option<(u32, u32)>,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_grace: Duration,
    /// `ABX_PYTHON_APP`: the Python program whose commands and routes this server
    /// serves (set by the `agent_sandbox` package's `start`; see `crate::bridge`).
    pub python_app: Option<String>,
    /// How long the Python worker may leave a ping unanswered before it is restarted.
    pub bridge_hang_timeout: Duration,
    /// `ABX_BROWSER_PATH`: the Chromium the browser group starts (else `chromium` or
    /// `chromium-headless-shell` on `PATH`).
    pub browser_path: Option<PathBuf>,
    /// `ABX_AGENTS_DEFAULT`: the agent runtime `/v1` requests use when they name none.
    pub agents_default: Option<String>,
    /// `ABX_STATE_DIR`: what the server keeps across restarts (the runtimes it
    /// installed, the agents store `agents.redb`), mode 0700.
    pub state_dir: PathBuf,
    /// `ABX_AGENTS_AUTO_INSTALL`: install a runtime's pinned CLI on first use.
    pub agents_auto_install: bool,
    /// `ABX_AGENTS_PATH_CLI=any`: a CLI on `PATH` at another version than the pin is
    /// used (by default only the pinned version is).
    pub agents_any_path_cli: bool,
    /// `ABX_AGENTS_INSTALL_WAIT`: how long a request that is not streamed waits for an
    /// install before it is answered 503 with `Retry-After`.
    pub agents_install_wait: Duration,
    /// `ABX_AGENTS_NPM_REGISTRY`: the registry installs use (npm's own configuration
    /// when unset).
    pub agents_npm_registry: Option<String>,
}

/// `ABX_STATE_DIR`'s default: `$XDG_STATE_HOME/agent-sandbox`, else
/// `$HOME/.local/state/agent-sandbox`, else `/var/lib/agent-sandbox`.
pub fn default_state_dir() -> PathBuf {
    let from = |var: &str, tail: &str| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty() && std::path::Path::new(v).is_absolute())
            .map(|v| PathBuf::from(v).join(tail))
    };
    from("XDG_STATE_HOME", "agent-sandbox")
        .or_else(|| from("HOME", ".local/state/agent-sandbox"))
        .unwrap_or_else(|| PathBuf::from("/var/lib/agent-sandbox"))
}

/// Raw JSON body cap from the contract (413 `payload_too_large`).
pub const MAX_JSON_BODY: usize = 10 * 1024 * 1024;

impl Default for Config {
    fn default() -> Self {
        Config::with_workers(available_cores())
    }
}

/// The worker count by default: the cores this process may run on (its affinity and
/// cgroup quota, which std reads from /proc and /sys: about 50 µs of start, spent
/// only when no count is given).
fn available_cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

impl Config {
    fn with_workers(workers: usize) -> Config {
        Config {
            host: IpAddr::from([0, 0, 0, 0]),
            port: 9000,
            pty_port: 9001,
            k8s_runtime_port: 8888,
            envd_port: 49983,
            envd_default_user: None,
            workers,
            base_dir: PathBuf::from("/home/user"),
            token: None,
            token_file: None,
            enabled_groups: Vec::new(),
            max_upload_size: 100 * 1024 * 1024,
            policy_path: None,
            policy_inline: None,
            io_driver: IoDriverChoice::Auto,
            idle_timeout: Duration::from_secs(75),
            read_timeout: Duration::from_secs(30),
            blocking_threads: 64,
            blocking_idle_timeout: Duration::from_secs(10),
            child_user: None,
            shutdown_grace: Duration::from_secs(10),
            python_app: None,
            bridge_hang_timeout: Duration::from_secs(10),
            browser_path: None,
            agents_default: None,
            state_dir: default_state_dir(),
            agents_auto_install: true,
            agents_any_path_cli: false,
            agents_install_wait: Duration::from_secs(120),
            agents_npm_registry: None,
        }
    }
}

/// One setting: its flag (if it has one), its variable, the default as the README and
/// `--help` state it, and how a value is applied. Every setting is declared here once;
/// `--help` is generated from this table and a unit test checks the README's table
/// against it.
struct Setting {
    flag: Option<&'static str>,
    var: &'static str,
    default: &'static str,
    apply: fn(&mut Config, &str, &str) -> Result<(), String>,
}

/// An IP address, or a host name resolved once at startup (`localhost`): its first IPv4
/// address, since the contract's default listens on IPv4, else its first address.
fn parse_host(value: &str) -> Option<IpAddr> {
    if let Ok(ip) = value.parse() {
        return Some(ip);
    }
    use std::net::ToSocketAddrs;
    let resolved: Vec<IpAddr> = (value, 0).to_socket_addrs().ok()?.map(|a| a.ip()).collect();
    resolved
        .iter()
        .find(|ip| ip.is_ipv4())
        .or(resolved.first())
        .copied()
}

const SETTINGS: &[Setting] = &[
    Setting {
        flag: Some("host"),
        var: "ABX_SERVER_HOST",
        default: "`0.0.0.0`",
        apply: |c, src, v| {
            c.host = parse_host(v).ok_or_else(|| {
                format!("{src}: '{v}' is neither an IP address nor a host name that resolves here")
            })?;
            Ok(())
        },
    },
    Setting {
        flag: Some("port"),
        var: "ABX_SERVER_PORT",
        default: "`9000`",
        apply: |c, src, v| {
            c.port = parse_port(src, v)?;
            Ok(())
        },
    },
    Setting {
        flag: Some("pty-port"),
        var: "ABX_PTY_PORT",
        default: "`9001`",
        apply: |c, src, v| {
            c.pty_port = parse_port(src, v)?;
            Ok(())
        },
    },
    Setting {
        flag: Some("k8s-runtime-port"),
        var: "ABX_K8S_RUNTIME_PORT",
        default: "`8888`",
        apply: |c, src, v| {
            c.k8s_runtime_port = parse_port(src, v)?;
            Ok(())
        },
    },
    Setting {
        flag: Some("envd-port"),
        var: "ABX_ENVD_PORT",
        default: "`49983`",
        apply: |c, src, v| {
            c.envd_port = parse_port(src, v)?;
            Ok(())
        },
    },
    Setting {
        flag: None,
        var: "ABX_ENVD_DEFAULT_USER",
        default: "`user` if that account exists, else the server's user",
        apply: |c, _src, v| {
            c.envd_default_user = Some(v.to_string()).filter(|v| !v.is_empty());
            Ok(())
        },
    },
    Setting {
        flag: Some("workers"),
        var: "ABX_SERVER_WORKERS",
        default: "available cores",
        apply: |c, src, v| {
            c.workers = match v.parse::<usize>() {
                Ok(n) if (1..=1024).contains(&n) => n,
                _ => return Err(format!("{src}: '{v}' is not a worker count from 1 to 1024")),
            };
            Ok(())
        },
    },
    Setting {
        flag: Some("base-dir"),
        var: "ABX_SERVER_BASE_DIR",
        default: "`/home/user`",
        apply: |c, src, v| {
            c.base_dir = absolute_dir(src, v)?;
            Ok(())
        },
    },
    Setting {
        flag: Some("io-driver"),
        var: "ABX_IO_DRIVER",
        default: "`auto`",
        apply: |c, src, v| {
            c.io_driver = IoDriverChoice::parse(&v.to_ascii_lowercase())
                .ok_or_else(|| format!("{src}: '{v}' is not one of auto, uring, epoll"))?;
            Ok(())
        },
    },
    Setting {
        flag: Some("idle-timeout"),
        var: "ABX_HTTP_IDLE_TIMEOUT",
        default: "`75` seconds",
        apply: |c, src, v| {
            c.idle_timeout = parse_seconds(src, v)?;
            Ok(())
        },
    },
    Setting {
        flag: Some("read-timeout"),
        var: "ABX_HTTP_READ_TIMEOUT",
        default: "`30` seconds",
        apply: |c, src, v| {
            c.read_timeout = parse_seconds(src, v)?;
            Ok(())
        },
    },
    Setting {
        flag: None,
        var: "ABX_SERVER_TOKEN",
        default: "unset: local mode",
        apply: |c, _, v| {
            c.token = Some(v.to_string());
            Ok(())
        },
    },
    Setting {
        flag: None,
        var: "ABX_TOKEN_FILE",
        default: "unset",
        apply: |c, _, v| {
            c.token_file = Some(PathBuf::from(v));
            Ok(())
        },
    },
    Setting {
        flag: None,
        var: "ABX_SERVER_ENABLED_GROUPS",
        default: "opt-in groups to enable",
        apply: |c, src, list| {
            for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                let group = Group::parse(name).ok_or_else(|| {
                    format!(
                        "{src}: unknown group '{name}' (known: {})",
                        Group::ALL.map(Group::name).join(", ")
                    )
                })?;
                if !c.enabled_groups.contains(&group) {
                    c.enabled_groups.push(group);
                }
            }
            Ok(())
        },
    },
    Setting {
        flag: None,
        var: "ABX_MAX_UPLOAD_SIZE",
        default: "`104857600` (100 MiB)",
        apply: |c, src, v| {
            c.max_upload_size = v
                .parse::<u64>()
                .map_err(|_| format!("{src}: '{v}' is not a byte count (a whole number)"))?;
            Ok(())
        },
    },
    Setting {
        flag: None,
        var: "ABX_SERVER_POLICY",
        default: "a policy document (JSON starting with '{') or the path of one",
        apply: |c, _, v| {
            if v.starts_with('{') {
                c.policy_inline = Some(v.to_string());
            } else {
                c.policy_path = Some(PathBuf::from(v));
            }
            Ok(())
        },
    },
    Setting {
        flag: Some("policy"),
        var: "ABX_SERVER_POLICY_FILE",
        default: "path of a policy document",
        apply: |c, src, v| {
            // `--policy` beats ABX_SERVER_POLICY, which beats ABX_SERVER_POLICY_FILE.
            let from_flag = src.starts_with("--");
            if from_flag {
                c.policy_inline = None;
            }
            if from_flag || (c.policy_inline.is_none() && c.policy_path.is_none()) {
                c.policy_path = Some(PathBuf::from(v));
            }
            Ok(())
        },
    },
    Setting {
        flag: None,
        var: "ABX_PYTHON_APP",
        default: "set by `agent_sandbox.start`",
        apply: |c, _, v| {
            c.python_app = Some(v.to_string());
            Ok(())
        },
    },
    Setting {
        flag: None,
        var: "ABX_BRIDGE_HANG_TIMEOUT",
        default: "`10` seconds",
        apply: |c, src, v| {
            c.bridge_hang_timeout = parse_seconds(src, v)?;
            Ok(())
        },
    },
    Setting {
        flag: None,
        var: "ABX_BROWSER_PATH",
        default: "`chromium`, then `chromium-headless-shell`, on `PATH`",
        apply: |c, _, v| {
            c.browser_path = Some(PathBuf::from(v));
            Ok(())
        },
    },
    Setting {
        flag: None,
        var: "ABX_AGENTS_DEFAULT",
        default: "`codex`",
        apply: |c, src, v| {
            const NAMES: [&str; 7] = [
                "codex",
                "qwen-code",
                "qwen",
                "qwencode",
                "claude-code",
                "cursor",
                "command",
            ];
            if !NAMES.contains(&v.trim().to_ascii_lowercase().as_str()) {
                return Err(format!("{src}: '{v}' is not an agent runtime (codex, qwen-code, qwen, qwencode, claude-code, cursor, command)"));
            }
            c.agents_default = Some(v.to_string());
            Ok(())
        },
    },
    Setting {
        flag: None,
        var: "ABX_STATE_DIR",
        default: "`$XDG_STATE_HOME/agent-sandbox`, else `$HOME/.local/state/agent-sandbox`",
        apply: |c, src, v| {
            let path = PathBuf::from(v);
            if !path.is_absolute() {
                return Err(format!("{src}: '{v}' is not an absolute path"));
            }
            c.state_dir = path;
            Ok(())
        },
    },
    Setting {
        flag: None,
        var: "ABX_AGENTS_AUTO_INSTALL",
        default: "`1`",
        apply: |c, src, v| {
            c.agents_auto_install = match v.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => true,
                "0" | "false" | "no" | "off" => false,
                _ => return Err(format!("{src}: '{v}' is not 1 or 0")),
            };
            Ok(())
        },
    },
    Setting {
        flag: None,
        var: "ABX_AGENTS_PATH_CLI",
        default: "`pinned`",
        apply: |c, src, v| {
            c.agents_any_path_cli = match v.trim() {
                "pinned" => false,
                "any" => true,
                _ => return Err(format!("{src}: '{v}' is not pinned or any")),
            };
            Ok(())
        },
    },
    Setting {
        flag: None,
        var: "ABX_AGENTS_INSTALL_WAIT",
        default: "`120` seconds",
        apply: |c, src, v| {
            c.agents_install_wait = parse_seconds(src, v)?;
            Ok(())
        },
    },
    Setting {
        flag: None,
        var: "ABX_AGENTS_NPM_REGISTRY",
        default: "npm's own configuration",
        apply: |c, src, v| {
            if !(v.starts_with("http://") || v.starts_with("https://")) {
                return Err(format!("{src}: '{v}' is not an http:// or https:// URL"));
            }
            c.agents_npm_registry = Some(v.to_string());
            Ok(())
        },
    },
    Setting {
        flag: None,
        var: "ABX_AGENTS_VAULT_KEY",
        default: "unset: `<state_dir>/vault.key`",
        // Only checked here: the key itself is read by the agents group from the
        // server's memory (`crate::process::secrets`), never kept in the configuration.
        // (`agents::seal::parse_key` reads it the same way).
        apply: |_, src, v| {
            let hex = v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit());
            let base64 = base64_simd::STANDARD
                .decode_to_vec(v)
                .is_ok_and(|key| key.len() == 32);
            match hex || base64 {
                true => Ok(()),
                // The value is a secret: never repeated.
                false => Err(format!("{src} must be 64 hex digits or 32 bytes in base64")),
            }
        },
    },
    Setting {
        flag: None,
        var: "ABX_BLOCKING_THREADS",
        default: "`64`",
        apply: |c, src, v| {
            c.blocking_threads = match v.parse::<usize>() {
                Ok(n) if (1..=4096).contains(&n) => n,
                _ => return Err(format!("{src}: '{v}' is not a thread count from 1 to 4096")),
            };
            Ok(())
        },
    },
    Setting {
        flag: None,
        var: "ABX_BLOCKING_IDLE_TIMEOUT",
        default: "`10` seconds",
        apply: |c, src, v| {
            c.blocking_idle_timeout = parse_seconds(src, v)?;
            Ok(())
        },
    },
    Setting {
        flag: None,
        var: "ABX_CHILD_USER",
        default: "unset: children run as the server's user",
        apply: |c, src, v| {
            c.child_user = Some(parse_user(v).map_err(|why| format!("{src}: {why}"))?);
            Ok(())
        },
    },
];

/// A user name, a uid, or `uid:gid`, as `(uid, gid)`: a name takes its primary group,
/// a bare uid the group of the same number.
fn parse_user(value: &str) -> Result<(u32, u32), String> {
    let (user, group) = match value.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (value, None),
    };
    let (uid, primary) = match user.parse::<u32>() {
        Ok(uid) => (uid, uid),
        Err(_) => {
            let name =
                std::ffi::CString::new(user).map_err(|_| format!("'{value}' is not a user"))?;
            // SAFETY: getpwnam's result is read at once, before any other call could
            // reuse its static buffer; startup is single-threaded.
            let entry = unsafe { libc::getpwnam(name.as_ptr()) };
            if entry.is_null() {
                return Err(format!("no user named '{user}' on this system (give a name from /etc/passwd, a uid, or uid:gid)"));
            }
            unsafe { ((*entry).pw_uid, (*entry).pw_gid) }
        }
    };
    let gid = match group {
        None => primary,
        Some(g) => g
            .parse::<u32>()
            .map_err(|_| format!("'{g}' is not a numeric group id (uid:gid)"))?,
    };
    if uid == 0 {
        return Err(
            "ABX_CHILD_USER must not be root (uid 0): it exists to run children with less".into(),
        );
    }
    Ok((uid, gid))
}

/// `--help`, generated from [`SETTINGS`].
fn usage() -> String {
    let mut text = String::from(
        "usage: agent-sandbox [--FLAG VALUE | --FLAG=VALUE]...\n\
         \x20      agent-sandbox --health-check   (exit 0 when the configured server answers /health)\n\
         \x20      agent-sandbox --check-policy FILE   (print the effective per-endpoint table; exit 2 on an error)\n\n\
         Every setting, with its flag (flag beats environment beats default):\n",
    );
    // Columns as wide as their longest cell, so a long flag never runs into its variable.
    let flag_width = SETTINGS
        .iter()
        .filter_map(|s| s.flag)
        .map(|f| f.len() + 4)
        .max()
        .unwrap_or(0);
    let var_width = SETTINGS.iter().map(|s| s.var.len() + 2).max().unwrap_or(0);
    for setting in SETTINGS {
        let flag = setting.flag.map(|f| format!("--{f}")).unwrap_or_default();
        text.push_str(&format!(
            "  {flag:<flag_width$}{:<var_width$}{}\n",
            setting.var,
            setting.default.replace('`', "")
        ));
    }
    text.pop();
    text
}

/// What parsing the command line produced.
pub enum Parsed {
    Run(Box<Config>),
    /// `--health-check`: probe the server this configuration describes and exit.
    HealthCheck(Box<Config>),
    /// `--check-policy FILE`: print what the policy document decides and exit.
    CheckPolicy(Box<Config>),
    Help(String),
    Version,
}

/// The policy document the reference server reads when none is named.
pub const DEFAULT_POLICY_FILE: &str = "/etc/agent-sandbox/server-policy.json";

impl Config {
    /// Builds the configuration from `args` (without the program name) and an environment
    /// lookup. Errors are one line meant for stderr, after which the caller exits 2.
    pub fn parse(
        args: impl IntoIterator<Item = String>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Parsed, String> {
        let mut flags: Vec<(String, String)> = Vec::new();
        let mut health_check = false;
        let mut check_policy: Option<String> = None;
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "-h" | "--help" => return Ok(Parsed::Help(usage())),
                "-V" | "--version" => return Ok(Parsed::Version),
                "--health-check" => {
                    health_check = true;
                    continue;
                }
                "--check-policy" => {
                    check_policy = Some(args.next().ok_or("--check-policy needs a policy file")?);
                    continue;
                }
                _ => {}
            }
            let Some(name) = arg.strip_prefix("--") else {
                return Err(format!("unexpected argument '{arg}' (see --help)"));
            };
            let (name, inline) = match name.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (name, None),
            };
            // An unknown flag is named as such, with or without a value after it.
            if !SETTINGS.iter().any(|s| s.flag == Some(name)) {
                return Err(format!("unknown flag --{name} (see --help)"));
            }
            let value = match inline {
                Some(value) => value,
                None => args
                    .next()
                    .ok_or_else(|| format!("--{name} needs a value (see --help)"))?,
            };
            let name = name.to_string();
            flags.push((name, value));
        }
        // 0 until a setting gives the count: the cores are counted only when none does.
        let mut config = Config::with_workers(0);
        for setting in SETTINGS {
            // Flag beats environment; an empty environment value counts as unset (for
            // the token too: an empty ABX_SERVER_TOKEN is local mode). Variables are
            // read exactly once, so a later change does not change the server.
            let from_flag = setting
                .flag
                .and_then(|f| flags.iter().rev().find(|(n, _)| n == f))
                .map(|(n, v)| (format!("--{n}"), v.clone()));
            let value = from_flag.or_else(|| {
                env(setting.var)
                    .filter(|v| !v.trim().is_empty())
                    .map(|v| (setting.var.to_string(), v))
            });
            if let Some((source, value)) = value {
                let value = if setting.var == "ABX_SERVER_TOKEN" {
                    value
                } else {
                    value.trim().to_string()
                };
                (setting.apply)(&mut config, &source, &value)?;
            }
        }
        if config.workers == 0 {
            config.workers = available_cores();
        }
        // Two sources of the one server token would leave it unclear which one a
        // rotation of the file replaces.
        if config.token_file.is_some() && config.token.as_deref().is_some_and(|t| !t.is_empty()) {
            return Err(
                "ABX_TOKEN_FILE and ABX_SERVER_TOKEN are both set; the token comes from one of them"
                    .into(),
            );
        }
        if let Some(path) = check_policy {
            config.policy_path = Some(PathBuf::from(path));
            config.policy_inline = None;
            return Ok(Parsed::CheckPolicy(Box::new(config)));
        }
        if health_check {
            return Ok(Parsed::HealthCheck(Box::new(config)));
        }
        // The reference's well-known file, then a template's template.yaml in the
        // working directory (its `server:` section), when no document is named.
        if config.policy_path.is_none() && config.policy_inline.is_none() {
            let well_known = std::path::Path::new(DEFAULT_POLICY_FILE);
            if well_known.is_file() {
                config.policy_path = Some(well_known.to_path_buf());
            }
        }
        if config.policy_path.is_none() && config.policy_inline.is_none() {
            for name in ["template.yaml", "template.yml"] {
                if std::path::Path::new(name).is_file() {
                    config.policy_path = std::env::current_dir().ok().map(|d| d.join(name));
                    break;
                }
            }
        }
        Ok(Parsed::Run(Box::new(config)))
    }
}

/// The base directory as an absolute, lexically normalised path (`.` and `..` resolved
/// against the working directory, as Python's `os.path.abspath` does), so a relative
/// `--base-dir` means the same directory for every request. Symlinks are kept as
/// spelled: caller paths are compared with the base as configured.
fn absolute_dir(source: &str, value: &str) -> Result<PathBuf, String> {
    use std::path::Component;
    if value.is_empty() {
        return Err(format!("{source}: must name a directory, not be empty"));
    }
    let joined = std::env::current_dir()
        .map_err(|e| {
            format!("{source}: '{value}' is relative and the working directory is unknown ({e})")
        })?
        .join(value);
    let mut normal = PathBuf::from("/");
    for component in joined.components() {
        match component {
            Component::ParentDir => {
                normal.pop();
            }
            Component::Normal(part) => normal.push(part),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Ok(normal)
}

fn parse_port(source: &str, value: &str) -> Result<u16, String> {
    value
        .parse::<u16>()
        .map_err(|_| format!("{source}: '{value}' is not a port from 0 to 65535"))
}

fn parse_seconds(source: &str, value: &str) -> Result<Duration, String> {
    match value.parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Ok(Duration::from_secs_f64(s)),
        _ => Err(format!(
            "{source}: '{value}' is not a number of seconds above 0 and at most 86400"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str], env: &[(&str, &str)]) -> Result<Config, String> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        match Config::parse(args.iter().map(|s| s.to_string()), |k| {
            env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        })? {
            Parsed::Run(c) => Ok(*c),
            _ => Err("not a run".into()),
        }
    }

    #[test]
    fn defaults_match_the_contract() {
        let c = parse(&[], &[]).unwrap();
        assert_eq!(c.port, 9000);
        assert_eq!(c.pty_port, 9001);
        assert_eq!(c.host.to_string(), "0.0.0.0");
        assert_eq!(c.base_dir, PathBuf::from("/home/user"));
        assert_eq!(c.max_upload_size, 100 * 1024 * 1024);
        assert!(c.token.is_none());
        assert_eq!(c.io_driver, IoDriverChoice::Auto);
    }

    #[test]
    fn flag_beats_env_beats_default() {
        let c = parse(&["--port", "7000"], &[("ABX_SERVER_PORT", "8000")]).unwrap();
        assert_eq!(c.port, 7000);
        let c = parse(&[], &[("ABX_SERVER_PORT", "8000")]).unwrap();
        assert_eq!(c.port, 8000);
        let c = parse(&["--port=6000"], &[]).unwrap();
        assert_eq!(c.port, 6000);
    }

    #[test]
    fn bad_values_are_one_clear_line() {
        let err = parse(&["--port", "99999"], &[]).unwrap_err();
        assert!(err.contains("--port") && !err.contains('\n'), "{err}");
        let err = parse(&[], &[("ABX_IO_DRIVER", "kqueue")]).unwrap_err();
        assert!(err.contains("ABX_IO_DRIVER"), "{err}");
        let err = parse(&[], &[("ABX_SERVER_ENABLED_GROUPS", "dev_tools,nope")]).unwrap_err();
        assert!(err.contains("nope"), "{err}");
        assert!(parse(&["--frobnicate", "1"], &[]).is_err());
        // An unknown flag alone is named as unknown, not as missing its value.
        let err = parse(&["--bogus"], &[]).unwrap_err();
        assert_eq!(err, "unknown flag --bogus (see --help)");
        let err = parse(&["--port"], &[]).unwrap_err();
        assert!(err.contains("--port needs a value"), "{err}");
        assert!(parse(&["--workers", "0"], &[]).is_err());
    }

    #[test]
    fn host_names_that_resolve_are_accepted() {
        let c = parse(&["--host", "localhost"], &[]).unwrap();
        assert!(c.host.is_loopback(), "{}", c.host);
        assert_eq!(
            parse(&["--host", "::1"], &[]).unwrap().host.to_string(),
            "::1"
        );
        let err = parse(&["--host", "no such host.invalid"], &[]).unwrap_err();
        assert!(
            err.contains("neither an IP address nor a host name"),
            "{err}"
        );
    }

    #[test]
    fn base_dir_is_absolute_and_never_empty() {
        let c = parse(&["--base-dir", "."], &[]).unwrap();
        assert!(c.base_dir.is_absolute());
        assert_eq!(c.base_dir, std::env::current_dir().unwrap());
        let c = parse(&["--base-dir", "/a/./b/../c/"], &[]).unwrap();
        assert_eq!(c.base_dir, PathBuf::from("/a/c"));
        assert!(parse(&["--base-dir", ""], &[]).is_err());
        let c = parse(&["--base-dir", "no/such/dir"], &[]).unwrap();
        assert!(c.base_dir.is_absolute() && c.base_dir.ends_with("no/such/dir"));
    }

    #[test]
    fn empty_token_is_local_mode() {
        assert!(parse(&[], &[("ABX_SERVER_TOKEN", "")])
            .unwrap()
            .token
            .is_none());
        let c = parse(&[], &[("ABX_SERVER_TOKEN", "s3cret")]).unwrap();
        assert_eq!(c.token.as_deref(), Some("s3cret"));
    }

    #[test]
    fn readme_table_matches_the_settings() {
        let readme = include_str!("../README.md");
        for setting in SETTINGS {
            let row = readme
                .lines()
                .find(|l| l.starts_with('|') && l.contains(&format!("`{}`", setting.var)))
                .unwrap_or_else(|| panic!("README has no row for {}", setting.var));
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let flag = setting.flag.map(|f| format!("`--{f}`")).unwrap_or_default();
            assert_eq!(cells[1], flag, "README flag of {}", setting.var);
            assert!(
                cells[3].starts_with(setting.default),
                "README default of {} is '{}', the table says '{}'",
                setting.var,
                cells[3],
                setting.default
            );
        }
        let help = usage();
        for setting in SETTINGS {
            assert!(help.contains(setting.var), "--help lacks {}", setting.var);
            // The flag and its variable are separate words on the setting's line.
            if let Some(flag) = setting.flag {
                let flag = format!("--{flag}");
                let line = help
                    .lines()
                    .find(|l| l.split_whitespace().next() == Some(flag.as_str()))
                    .unwrap_or_else(|| panic!("--help lacks {flag}"));
                assert_eq!(line.split_whitespace().nth(1), Some(setting.var), "{line}");
            }
        }
    }

    #[test]
    fn enabled_groups_are_parsed() {
        let c = parse(&[], &[("ABX_SERVER_ENABLED_GROUPS", "dev_tools, agents")]).unwrap();
        assert_eq!(c.enabled_groups, vec![Group::DevTools, Group::Agents]);
    }
}
