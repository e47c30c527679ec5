//! Named commands: the registry behind `GET /commands` and `POST /commands/{name}`.
//!
//! A command is a name, a description, typed arguments, a `hidden` flag, the scopes a
//! caller needs, and an implementation: a Rust function (programs that embed the
//! server) or a Python function reached over the bridge (`commands.py`, see
//! [`crate::bridge`]). Both kinds are bound the same way ([`coerce`]), so a caller
//! cannot tell them apart. The registry is built before the server starts and never
//! changes afterwards, as the contract says ("the registry is frozen when the server
//! starts"): every worker reads it without locks.

pub mod coerce;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::Serialize;
use serde_json::{Map, Value};

/// The four argument types the contract knows (from a Python annotation: `int`,
/// `float`, `bool`, anything else is a string).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ArgType {
    String,
    Integer,
    Float,
    Boolean,
}

impl ArgType {
    /// The type named as `GET /commands` names it.
    pub fn parse(name: &str) -> Option<ArgType> {
        match name {
            "string" => Some(ArgType::String),
            "integer" => Some(ArgType::Integer),
            "float" => Some(ArgType::Float),
            "boolean" => Some(ArgType::Boolean),
            _ => None,
        }
    }
}

/// One declared argument, listed by `GET /commands` exactly as these fields.
#[derive(Clone, Debug, Serialize)]
pub struct CommandArg {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: ArgType,
    pub required: bool,
    /// `null` for a required argument, and for an optional one whose default is `None`
    /// (which is then not passed at all).
    pub default: Value,
    pub description: String,
}

impl CommandArg {
    /// An optional argument of type `kind` with no default (`None`).
    pub fn new(name: &str, kind: ArgType) -> CommandArg {
        CommandArg {
            name: name.to_string(),
            kind,
            required: false,
            default: Value::Null,
            description: String::new(),
        }
    }
    pub fn string(name: &str) -> CommandArg {
        CommandArg::new(name, ArgType::String)
    }
    pub fn integer(name: &str) -> CommandArg {
        CommandArg::new(name, ArgType::Integer)
    }
    pub fn float(name: &str) -> CommandArg {
        CommandArg::new(name, ArgType::Float)
    }
    pub fn boolean(name: &str) -> CommandArg {
        CommandArg::new(name, ArgType::Boolean)
    }
    /// Makes the argument required (its default is then `null`).
    pub fn required(mut self) -> CommandArg {
        self.required = true;
        self.default = Value::Null;
        self
    }
    /// The value used when the caller omits the argument.
    pub fn default(mut self, value: impl Into<Value>) -> CommandArg {
        self.default = value.into();
        self.required = false;
        self
    }
    pub fn description(mut self, text: &str) -> CommandArg {
        self.description = text.to_string();
        self
    }
}

/// A command that failed: answered as 500 `{"error": message, "type": type_name}`, the
/// way Python reports an exception the command raised.
#[derive(Clone, Debug, PartialEq)]
pub struct CommandError {
    pub message: String,
    /// The exception's class name (`ValueError`, `ZeroDivisionError`, ...).
    pub type_name: String,
}

impl CommandError {
    pub fn new(type_name: &str, message: impl Into<String>) -> CommandError {
        CommandError {
            message: message.into(),
            type_name: type_name.to_string(),
        }
    }
}

/// The future a Rust command returns. Commands run on the worker that took the
/// request, so it need not be `Send`.
pub type CommandFuture = Pin<Box<dyn Future<Output = Result<Value, CommandError>>>>;

/// A Rust command: from the bound arguments to the JSON `result`.
pub type CommandHandler = Arc<dyn Fn(Map<String, Value>) -> CommandFuture + Send + Sync>;

/// Where a command's code lives.
#[derive(Clone)]
pub enum Implementation {
    /// A Rust function in this process.
    Native(CommandHandler),
    /// A Python function in the bridge's worker process, called by name.
    Python,
}

/// One registered command.
#[derive(Clone)]
pub struct Command {
    pub name: String,
    pub description: String,
    pub args: Vec<CommandArg>,
    pub hidden: bool,
    /// Scopes a caller needs to see and run it.
    pub scopes: Vec<String>,
    pub implementation: Implementation,
}

impl Command {
    /// A visible command with no description, arguments or scopes, implemented by `run`.
    pub fn new<F, Fut>(name: &str, run: F) -> Command
    where
        F: Fn(Map<String, Value>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, CommandError>> + 'static,
    {
        Command {
            name: name.to_string(),
            description: String::new(),
            args: Vec::new(),
            hidden: false,
            scopes: Vec::new(),
            implementation: Implementation::Native(Arc::new(move |args| Box::pin(run(args)))),
        }
    }
    pub fn description(mut self, text: &str) -> Command {
        self.description = text.to_string();
        self
    }
    pub fn arg(mut self, arg: CommandArg) -> Command {
        self.args.push(arg);
        self
    }
    /// Runs when called by name but is not listed by `GET /commands`.
    pub fn hidden(mut self, hidden: bool) -> Command {
        self.hidden = hidden;
        self
    }
    pub fn scopes(mut self, scopes: &[&str]) -> Command {
        self.scopes = scopes.iter().map(|s| s.to_string()).collect();
        self
    }
}

/// The frozen set of commands, in registration order.
#[derive(Default)]
pub struct Registry {
    commands: Vec<Command>,
    by_name: HashMap<String, usize>,
}

impl Registry {
    /// Freezes `commands`. A name registered twice keeps the later registration, as a
    /// Python dict assignment does, and the caller is told so it can warn.
    pub fn new(commands: Vec<Command>) -> (Registry, Vec<String>) {
        let mut registry = Registry::default();
        let mut replaced = Vec::new();
        for command in commands {
            match registry.by_name.get(&command.name) {
                Some(&index) => {
                    replaced.push(command.name.clone());
                    registry.commands[index] = command;
                }
                None => {
                    registry
                        .by_name
                        .insert(command.name.clone(), registry.commands.len());
                    registry.commands.push(command);
                }
            }
        }
        (registry, replaced)
    }

    pub fn get(&self, name: &str) -> Option<&Command> {
        self.by_name.get(name).map(|&i| &self.commands[i])
    }

    /// Every command, hidden ones included, in registration order.
    #[cfg(test)]
    pub fn all(&self) -> &[Command] {
        &self.commands
    }

    /// What `GET /commands` lists for a caller: not hidden, and every scope held
    /// (`holds` answers for a command's scopes).
    pub fn listed<'a>(
        &'a self,
        holds: impl Fn(&[String]) -> bool + 'a,
    ) -> impl Iterator<Item = &'a Command> + 'a {
        self.commands
            .iter()
            .filter(move |c| !c.hidden && holds(&c.scopes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_and_scoped_commands_are_not_listed() {
        let ok = |_| async { Ok(Value::Null) };
        let (registry, _) = Registry::new(vec![
            Command::new("open", ok),
            Command::new("_secret", ok).hidden(true),
            Command::new("admin", ok).scopes(&["example:admin"]),
        ]);
        let listed = |scopes: &[&str]| -> Vec<String> {
            let held: Vec<String> = scopes.iter().map(|s| s.to_string()).collect();
            registry
                .listed(move |required| required.iter().all(|r| held.contains(r)))
                .map(|c| c.name.clone())
                .collect()
        };
        assert_eq!(listed(&[]), ["open"]);
        assert_eq!(listed(&["example:admin"]), ["open", "admin"]);
        assert!(
            registry.get("_secret").is_some(),
            "hidden commands still run"
        );
    }

    #[test]
    fn a_later_registration_replaces_an_earlier_one_in_place() {
        let ok = |_| async { Ok(Value::Null) };
        let (registry, replaced) = Registry::new(vec![
            Command::new("a", ok).description("first"),
            Command::new("b", ok),
            Command::new("a", ok).description("second"),
        ]);
        assert_eq!(replaced, vec!["a".to_string()]);
        let names: Vec<&str> = registry.all().iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(registry.get("a").unwrap().description, "second");
        assert!(registry.get("c").is_none());
    }
}
