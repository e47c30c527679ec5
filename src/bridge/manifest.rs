//! The worker's first line: what the Python program registered before `start()`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::Group;
use crate::commands::{ArgType, Command, CommandArg, Implementation};

/// Commands, custom routes and group switches of the Python program.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct Manifest {
    /// Protocol version; this server speaks 1.
    pub protocol: u32,
    #[serde(default)]
    pub commands: Vec<CommandEntry>,
    #[serde(default)]
    pub routes: Vec<RouteEntry>,
    /// `enable_group` / `disable_group` calls on the route table, in call order.
    #[serde(default)]
    pub groups: Vec<(String, bool)>,
}

/// One `@command`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct CommandEntry {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub args: Vec<ArgEntry>,
    #[serde(default)]
    pub hidden: bool,
    #[serde(default)]
    pub scopes: Vec<String>,
}

/// One argument of a command, as `GET /commands` lists it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct ArgEntry {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub required: bool,
    #[serde(default)]
    pub default: Value,
    #[serde(default)]
    pub description: String,
}

/// One `@table.route`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct RouteEntry {
    pub method: String,
    pub path: String,
    /// The endpoint id (`"GET /hello/{name}"` unless named).
    pub name: String,
    pub group: String,
    #[serde(default = "yes")]
    pub auth_required: bool,
    #[serde(default)]
    pub streaming: bool,
    #[serde(default)]
    pub scopes: Vec<String>,
    #[serde(default)]
    pub summary: String,
}

fn yes() -> bool {
    true
}

/// A line from the control socket.
#[derive(Deserialize)]
pub(super) struct ControlLine {
    #[serde(default)]
    pub manifest: Option<Manifest>,
    #[serde(default)]
    pub pong: Option<u64>,
}

impl Manifest {
    /// The registered commands, implemented by the Python worker.
    pub fn commands(&self) -> Result<Vec<Command>, String> {
        self.commands
            .iter()
            .map(|entry| {
                let args = entry
                    .args
                    .iter()
                    .map(|arg| {
                        let kind = ArgType::parse(&arg.kind).ok_or_else(|| {
                            format!(
                                "command '{}': argument '{}' has type '{}' (known: string, integer, float, boolean)",
                                entry.name, arg.name, arg.kind
                            )
                        })?;
                        Ok(CommandArg {
                            name: arg.name.clone(),
                            kind,
                            required: arg.required,
                            default: if arg.required { Value::Null } else { arg.default.clone() },
                            description: arg.description.clone(),
                        })
                    })
                    .collect::<Result<Vec<_>, String>>()?;
                Ok(Command {
                    name: entry.name.clone(),
                    description: entry.description.clone(),
                    args,
                    hidden: entry.hidden,
                    scopes: entry.scopes.clone(),
                    implementation: Implementation::Python,
                })
            })
            .collect()
    }

    /// The route table's `enable_group` / `disable_group` calls.
    pub fn group_switches(&self) -> Result<Vec<(Group, bool)>, String> {
        self.groups
            .iter()
            .map(|(name, on)| {
                Group::parse(name)
                    .map(|g| (g, *on))
                    .ok_or_else(|| format!("unknown group '{name}' in enable_group/disable_group"))
            })
            .collect()
    }
}
