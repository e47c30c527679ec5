//! Named starting points for a policy (`preset:` in the document). A preset switches
//! endpoints on or off below the document's own `groups` and `endpoints` rules, which
//! can still change any of them; its decisions carry the rule `preset:<name>`.

use crate::api::{EndpointSpec, Group, Method};

/// The presets a document may name.
pub const PRESETS: [&str; 3] = ["default", "locked-down", "read-only"];

/// What `locked-down` leaves on besides core: reading files, and named commands.
pub const LOCKED_DOWN_ON: [&str; 9] = [
    "download",
    "files_list",
    "files_stat",
    "files_search",
    "files_download_stream",
    "files_archive",
    "files_watch",
    "commands_list",
    "commands_run",
];

/// What `read-only` turns off: every route that writes a file, starts a program (a
/// command, a shell, a terminal, pip or git), changes the environment, or navigates (the
/// browser and agents groups, whole). Custom routes that take a body (POST, DELETE) are
/// off too; custom GET routes stay on.
pub const READ_ONLY_OFF: [&str; 20] = [
    "upload",
    "files_mkdir",
    "files_delete",
    "files_move",
    "files_upload_stream",
    "shell",
    "shell_stream",
    "process_start",
    "process_signal",
    "process_stdin",
    "commands_run",
    "env_set",
    "packages",
    "code_run",
    "git_status",
    "git_diff",
    "pty_create",
    "pty_resize",
    "pty_delete",
    "pty_connect",
];

/// Built-in routes that take a body yet only read (a search, an archive answered in
/// the response); any other route with a body is off under `read-only`.
const READS_WITH_A_BODY: [&str; 3] = ["files_search", "files_archive", "capabilities_check"];

/// Whether preset `name` switches `endpoint` on or off (`None`: it leaves it alone).
pub fn decide(name: &str, endpoint: &EndpointSpec) -> Option<bool> {
    let id = endpoint.id.as_str();
    match name {
        "locked-down" => Some(LOCKED_DOWN_ON.contains(&id)),
        "read-only" => {
            let off = READ_ONLY_OFF.contains(&id)
                || matches!(endpoint.group, Group::Browser | Group::Agents)
                || (endpoint.method != Method::Get && !READS_WITH_A_BODY.contains(&id));
            off.then_some(false)
        }
        _ => None,
    }
}
