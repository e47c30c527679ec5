//! `agent-sandbox`: parse flags and environment, then serve.

use std::process::ExitCode;

use agent_sandbox::config::{Config, Parsed};
use agent_sandbox::Server;

fn main() -> ExitCode {
    // A child under ABX_CHILD_USER: drop to that user and become the program.
    if let Some(code) = agent_sandbox::child_user::run_if_asked() {
        return code;
    }
    let parsed = Config::parse(std::env::args().skip(1), |name| std::env::var(name).ok());
    let config = match parsed {
        Ok(Parsed::Run(config)) => *config,
        Ok(Parsed::Help(usage)) => {
            agent_sandbox::log::stdout_line(format_args!("{usage}"));
            return ExitCode::SUCCESS;
        }
        Ok(Parsed::HealthCheck(config)) => return health_check(&config),
        Ok(Parsed::CheckPolicy(config)) => {
            return match Server::new(*config).check_policy() {
                Ok(table) => {
                    agent_sandbox::log::stdout_line(format_args!("{table}"));
                    ExitCode::SUCCESS
                }
                Err(message) => {
                    agent_sandbox::log::line(format_args!("{message}"));
                    ExitCode::from(2)
                }
            }
        }
        Ok(Parsed::Version) => {
            agent_sandbox::log::stdout_line(format_args!(
                "agent-sandbox {}",
                env!("CARGO_PKG_VERSION")
            ));
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            agent_sandbox::log::line(format_args!("{message}"));
            return ExitCode::from(2);
        }
    };
    match Server::new(config).run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            agent_sandbox::log::line(format_args!("{message}"));
            ExitCode::from(2)
        }
    }
}

/// `--health-check`, for a container's `HEALTHCHECK` (the image has no curl): `GET
/// /health` on the configured port of this machine; exit 0 on 200, 1 otherwise.
fn health_check(config: &Config) -> ExitCode {
    use std::io::{Read, Write};
    use std::net::{IpAddr, SocketAddr, TcpStream};
    use std::time::Duration;
    let host = match config.host {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::from([127, 0, 0, 1]),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1]),
        ip => ip,
    };
    let addr = SocketAddr::new(host, config.port);
    let probe = || -> std::io::Result<bool> {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
        stream.set_read_timeout(Some(Duration::from_secs(3)))?;
        stream
            .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer)?;
        Ok(answer.starts_with(b"HTTP/1.1 200 "))
    };
    match probe() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            agent_sandbox::log::line(format_args!("health check: {addr} did not answer 200"));
            ExitCode::from(1)
        }
        Err(e) => {
            agent_sandbox::log::line(format_args!("health check: {addr}: {e}"));
            ExitCode::from(1)
        }
    }
}
