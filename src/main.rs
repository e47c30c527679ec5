//! `agent-sandbox`: parse flags and environment, then serve.

use std::process::ExitCode;

use agent_sandbox::config::{Config, Parsed};
use agent_sandbox::Server;

fn main() -> ExitCode {
    let parsed = Config::parse(std::env::args().skip(1), |name| std::env::var(name).ok());
    let config = match parsed {
        Ok(Parsed::Run(config)) => *config,
        Ok(Parsed::Help(usage)) => {
            println!("{usage}");
            return ExitCode::SUCCESS;
        }
        Ok(Parsed::Version) => {
            println!("agent-sandbox {}", env!("CARGO_PKG_VERSION"));
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
