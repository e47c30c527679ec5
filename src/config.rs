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
    pub workers: usize,
    pub base_dir: PathBuf,
    /// `ABX_SERVER_TOKEN`; `None` (unset or empty) is local mode.
    pub token: Option<String>,
    /// Opt-in groups named in `ABX_SERVER_ENABLED_GROUPS`.
    pub enabled_groups: Vec<Group>,
    pub max_upload_size: u64,
    /// Path of the policy document named by `ABX_SERVER_POLICY`.
    pub policy_path: Option<PathBuf>,
    pub io_driver: IoDriverChoice,
    /// How long a keep-alive connection may sit between requests.
    pub idle_timeout: Duration,
    /// How long a started request (head or body) may take to arrive.
    pub read_timeout: Duration,
    /// Upper bound on threads in the blocking pool.
    pub blocking_threads: usize,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_grace: Duration,
}

/// Raw JSON body cap from the contract (413 `payload_too_large`).
pub const MAX_JSON_BODY: usize = 10 * 1024 * 1024;

impl Default for Config {
    fn default() -> Self {
        Config {
            host: IpAddr::from([0, 0, 0, 0]),
            port: 9000,
            pty_port: 9001,
            workers: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            base_dir: PathBuf::from("/home/user"),
            token: None,
            enabled_groups: Vec::new(),
            max_upload_size: 100 * 1024 * 1024,
            policy_path: None,
            io_driver: IoDriverChoice::Auto,
            idle_timeout: Duration::from_secs(75),
            read_timeout: Duration::from_secs(30),
            blocking_threads: 64,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

const USAGE: &str = "\
usage: agent-sandbox [--host ADDR] [--port N] [--pty-port N] [--workers N]
                     [--base-dir DIR] [--io-driver auto|uring|epoll]
                     [--idle-timeout SECS] [--read-timeout SECS]

Every flag has an environment variable (flag beats env beats default):
  --host          ABX_SERVER_HOST          0.0.0.0
  --port          ABX_SERVER_PORT          9000
  --pty-port      ABX_PTY_PORT             9001
  --workers       ABX_SERVER_WORKERS       available cores
  --base-dir      ABX_SERVER_BASE_DIR      /home/user
  --io-driver     ABX_IO_DRIVER            auto
  --idle-timeout  ABX_HTTP_IDLE_TIMEOUT    75
  --read-timeout  ABX_HTTP_READ_TIMEOUT    30
Environment only:
  ABX_SERVER_TOKEN, ABX_SERVER_ENABLED_GROUPS, ABX_MAX_UPLOAD_SIZE, ABX_SERVER_POLICY,
  ABX_BLOCKING_THREADS";

/// What parsing the command line produced.
pub enum Parsed {
    Run(Box<Config>),
    Help(&'static str),
    Version,
}

impl Config {
    /// Builds the configuration from `args` (without the program name) and an environment
    /// lookup. Errors are one line meant for stderr, after which the caller exits 2.
    pub fn parse(
        args: impl IntoIterator<Item = String>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Parsed, String> {
        let mut flags: Vec<(String, String)> = Vec::new();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "-h" | "--help" => return Ok(Parsed::Help(USAGE)),
                "-V" | "--version" => return Ok(Parsed::Version),
                _ => {}
            }
            let Some(name) = arg.strip_prefix("--") else {
                return Err(format!("unexpected argument '{arg}' (see --help)"));
            };
            let (name, value) = match name.split_once('=') {
                Some((n, v)) => (n.to_string(), v.to_string()),
                None => {
                    let value = args
                        .next()
                        .ok_or_else(|| format!("--{name} needs a value (see --help)"))?;
                    (name.to_string(), value)
                }
            };
            flags.push((name, value));
        }
        let known = [
            ("host", "ABX_SERVER_HOST"),
            ("port", "ABX_SERVER_PORT"),
            ("pty-port", "ABX_PTY_PORT"),
            ("workers", "ABX_SERVER_WORKERS"),
            ("base-dir", "ABX_SERVER_BASE_DIR"),
            ("io-driver", "ABX_IO_DRIVER"),
            ("idle-timeout", "ABX_HTTP_IDLE_TIMEOUT"),
            ("read-timeout", "ABX_HTTP_READ_TIMEOUT"),
        ];
        for (name, _) in &flags {
            if !known.iter().any(|(k, _)| k == name) {
                return Err(format!("unknown flag --{name} (see --help)"));
            }
        }
        // Flag beats environment; an empty environment value counts as unset.
        let setting = |flag: &str, var: &str| -> Option<(String, String)> {
            if let Some((_, v)) = flags.iter().rev().find(|(n, _)| n == flag) {
                return Some((format!("--{flag}"), v.clone()));
            }
            env(var)
                .filter(|v| !v.trim().is_empty())
                .map(|v| (var.to_string(), v.trim().to_string()))
        };

        let mut config = Config::default();
        if let Some((src, v)) = setting("host", "ABX_SERVER_HOST") {
            config.host = v
                .parse()
                .map_err(|_| format!("{src}: '{v}' is not an IP address"))?;
        }
        if let Some((src, v)) = setting("port", "ABX_SERVER_PORT") {
            config.port = parse_port(&src, &v)?;
        }
        if let Some((src, v)) = setting("pty-port", "ABX_PTY_PORT") {
            config.pty_port = parse_port(&src, &v)?;
        }
        if let Some((src, v)) = setting("workers", "ABX_SERVER_WORKERS") {
            config.workers = match v.parse::<usize>() {
                Ok(n) if (1..=1024).contains(&n) => n,
                _ => return Err(format!("{src}: '{v}' is not a worker count from 1 to 1024")),
            };
        }
        if let Some((_, v)) = setting("base-dir", "ABX_SERVER_BASE_DIR") {
            config.base_dir = PathBuf::from(v);
        }
        if let Some((src, v)) = setting("io-driver", "ABX_IO_DRIVER") {
            config.io_driver = IoDriverChoice::parse(&v.to_ascii_lowercase())
                .ok_or_else(|| format!("{src}: '{v}' is not one of auto, uring, epoll"))?;
        }
        if let Some((src, v)) = setting("idle-timeout", "ABX_HTTP_IDLE_TIMEOUT") {
            config.idle_timeout = parse_seconds(&src, &v)?;
        }
        if let Some((src, v)) = setting("read-timeout", "ABX_HTTP_READ_TIMEOUT") {
            config.read_timeout = parse_seconds(&src, &v)?;
        }
        // Read exactly once: a later change of the variable does not change the server.
        config.token = env("ABX_SERVER_TOKEN").filter(|t| !t.is_empty());
        if let Some(list) = env("ABX_SERVER_ENABLED_GROUPS") {
            for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                let group = Group::parse(name).ok_or_else(|| {
                    format!(
                        "ABX_SERVER_ENABLED_GROUPS: unknown group '{name}' (known: {})",
                        Group::ALL.map(Group::name).join(", ")
                    )
                })?;
                if !config.enabled_groups.contains(&group) {
                    config.enabled_groups.push(group);
                }
            }
        }
        if let Some(v) = env("ABX_MAX_UPLOAD_SIZE").filter(|v| !v.trim().is_empty()) {
            config.max_upload_size = v.trim().parse::<u64>().map_err(|_| {
                format!("ABX_MAX_UPLOAD_SIZE: '{v}' is not a byte count (a whole number)")
            })?;
        }
        if let Some(v) = env("ABX_SERVER_POLICY").filter(|v| !v.trim().is_empty()) {
            config.policy_path = Some(PathBuf::from(v.trim()));
        }
        if let Some(v) = env("ABX_BLOCKING_THREADS").filter(|v| !v.trim().is_empty()) {
            config.blocking_threads = match v.trim().parse::<usize>() {
                Ok(n) if (1..=4096).contains(&n) => n,
                _ => {
                    return Err(format!(
                        "ABX_BLOCKING_THREADS: '{v}' is not a thread count from 1 to 4096"
                    ))
                }
            };
        }
        Ok(Parsed::Run(Box::new(config)))
    }
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
        assert!(parse(&["--workers", "0"], &[]).is_err());
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
    fn enabled_groups_are_parsed() {
        let c = parse(&[], &[("ABX_SERVER_ENABLED_GROUPS", "dev_tools, agents")]).unwrap();
        assert_eq!(c.enabled_groups, vec![Group::DevTools, Group::Agents]);
    }
}
