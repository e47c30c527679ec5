//! The `envd` group: E2B's in-sandbox daemon protocol on its own port (`ABX_ENVD_PORT`,
//! default 49983), so the `e2b` SDK in debug mode (`E2B_DEBUG=true`,
//! `E2B_SANDBOX_URL`) and the OpenAI Agents SDK's E2B sandboxes drive this server.
//! Connect RPCs (`process.Process`, `filesystem.Filesystem`) in JSON or protobuf, and
//! envd's REST routes. The work is the other groups' code: `fs` for files, `process`
//! for children, the same policy, identities and limits. See `docs/envd.md`.

mod filesystem;
mod process;
mod rest;
mod rpc;
mod user;
mod watch;

use std::sync::Arc;

use crate::api::{ErrorStyle, Group, Listener, Method};
use crate::app::{handler, sink_handler, Endpoint, Handler};

fn rpc(path: &'static str, id: &'static str, f: Handler) -> Endpoint {
    Endpoint::new(Method::Post, path, Group::Envd, f)
        .id(id)
        .extension()
        .opaque_body()
        .errors(ErrorStyle::Connect)
}

fn rest(method: Method, path: &'static str, id: &'static str, f: Handler) -> Endpoint {
    Endpoint::new(method, path, Group::Envd, f)
        .id(id)
        .extension()
        .errors(ErrorStyle::Envd)
}

pub fn endpoints() -> Vec<Endpoint> {
    let mut endpoints = vec![
        rpc("/process.Process/Start", "envd_process_start", handler(process::start))
            .enforces(&["paths", "commands"])
            .scopes(&["process:run"])
            .streaming(true)
            .summary("Start a process and stream its events: start (pid), data (stdout, stderr or pty bytes), end (exit)."),
        rpc("/process.Process/Connect", "envd_process_connect", handler(process::connect))
            .only_reads()
            .scopes(&["process:read"])
            .streaming(true)
            .summary("Follow a running process (by pid or tag) from now on."),
        rpc("/process.Process/List", "envd_process_list", handler(process::list))
            .only_reads()
            .scopes(&["process:read"])
            .summary("The caller's running processes with their command, args, envs, cwd and tag."),
        rpc("/process.Process/SendInput", "envd_process_send_input", handler(process::send_input))
            .scopes(&["process:manage"])
            .summary("Bytes to a process's stdin or terminal."),
        Endpoint::streamed(
            Method::Post,
            "/process.Process/StreamInput",
            Group::Envd,
            sink_handler(process::open_stream_input),
        )
        .id("envd_process_stream_input")
        .extension()
        .opaque_body()
        .errors(ErrorStyle::Connect)
        .scopes(&["process:manage"])
        .summary("Client stream: start (the process), then data messages delivered to its stdin or terminal as they arrive."),
        rpc("/process.Process/CloseStdin", "envd_process_close_stdin", handler(process::close_stdin))
            .scopes(&["process:manage"])
            .summary("End of file on a process's stdin."),
        rpc("/process.Process/SendSignal", "envd_process_send_signal", handler(process::send_signal))
            .scopes(&["process:manage"])
            .summary("SIGTERM or SIGKILL to a process's group."),
        rpc("/process.Process/Update", "envd_process_update", handler(process::update))
            .scopes(&["process:manage"])
            .summary("Resize a process's terminal."),
        rpc("/filesystem.Filesystem/Stat", "envd_fs_stat", handler(filesystem::stat))
            .enforces(&["paths"])
            .only_reads()
            .scopes(&["files:read"])
            .summary("A path's entry: name, type, path, size, mode, permissions, owner, group, modified time, symlink target."),
        rpc("/filesystem.Filesystem/ListDir", "envd_fs_list_dir", handler(filesystem::list_dir))
            .enforces(&["paths"])
            .only_reads()
            .scopes(&["files:read"])
            .summary("A directory's entries, depth levels deep."),
        rpc("/filesystem.Filesystem/MakeDir", "envd_fs_make_dir", handler(filesystem::make_dir))
            .enforces(&["paths"])
            .scopes(&["files:write"])
            .summary("Make a directory and its missing parents (already_exists when it is there)."),
        rpc("/filesystem.Filesystem/Move", "envd_fs_move", handler(filesystem::move_path))
            .enforces(&["paths"])
            .scopes(&["files:write"])
            .summary("Rename a file or directory."),
        rpc("/filesystem.Filesystem/Remove", "envd_fs_remove", handler(filesystem::remove))
            .enforces(&["paths"])
            .scopes(&["files:delete"])
            .summary("Remove a file, or a directory with everything in it."),
        rpc("/filesystem.Filesystem/WatchDir", "envd_fs_watch_dir", handler(watch::watch_dir))
            .enforces(&["paths"])
            .only_reads()
            .scopes(&["files:read"])
            .streaming(true)
            .summary("Stream a directory's changes: start, then CREATE, WRITE and REMOVE events (with entries when include_entry)."),
        rpc("/filesystem.Filesystem/CreateWatcher", "envd_fs_create_watcher", handler(watch::create_watcher))
            .enforces(&["paths"])
            .only_reads()
            .scopes(&["files:read"])
            .summary("Start a watcher whose events are read with GetWatcherEvents."),
        rpc("/filesystem.Filesystem/GetWatcherEvents", "envd_fs_get_watcher_events", handler(watch::get_watcher_events))
            .only_reads()
            .scopes(&["files:read"])
            .summary("A watcher's events since the last read."),
        rpc("/filesystem.Filesystem/RemoveWatcher", "envd_fs_remove_watcher", handler(watch::remove_watcher))
            .only_reads()
            .scopes(&["files:read"])
            .summary("Stop and forget a watcher."),
        rest(Method::Get, "/health", "envd_health", handler(rest::health))
            .auth_required(false)
            .summary("204 while the server runs (no token needed)."),
        rest(Method::Get, "/openapi.json", "envd_openapi", handler(crate::routes::core::openapi))
            .scopes(&["core:read"])
            .only_reads()
            .summary("This port's routes as an OpenAPI 3.1 document (what OpenAPI can say of Connect: each RPC a POST)."),
        rest(Method::Get, "/envs", "envd_envs", handler(rest::envs))
            .scopes(&["system:read"])
            .summary("The environment a started process gets."),
        rest(Method::Get, "/metrics", "envd_metrics", handler(rest::metrics))
            .scopes(&["system:read"])
            .summary("CPU, memory and disk use."),
        rest(Method::Post, "/init", "envd_init", handler(rest::init))
            .summary("Accepted and ignored: it can change no token and no identity."),
        rest(Method::Get, "/files", "envd_files_read", handler(rest::download))
            .signed_urls("read")
            .enforces(&["paths", "max_bytes"])
            .only_reads()
            .scopes(&["files:read"])
            .summary("A file's bytes (?path=)."),
        rest(Method::Post, "/files/compose", "envd_files_compose", handler(rest::compose))
            .scopes(&["files:write", "files:delete"])
            .enforces(&["paths", "allow_extensions", "deny_extensions"])
            .whole_json()
            .summary("Concatenate source_paths, in order, into destination (written atomically), then remove the sources."),
        Endpoint::streamed(Method::Post, "/files", Group::Envd, sink_handler(rest::open_upload))
            .id("envd_files_write")
            .signed_urls("write")
            .enforces(&["paths", "allow_extensions", "deny_extensions", "max_upload_bytes"])
            .extension()
            .errors(ErrorStyle::Envd)
            .multipart()
            .scopes(&["files:write"])
            .summary("Write files: multipart (one part per file) or octet-stream to ?path=; answers [{name, type, path}]."),
    ];
    for endpoint in &mut endpoints {
        endpoint.spec.listener = Listener::Envd;
    }
    endpoints
}

/// The group's state: the processes and the polled watchers its calls started.
pub fn registrar() -> crate::app::Registrar {
    Box::new(|setup| {
        setup.provide(Arc::new(crate::envd::processes::Processes::default()));
        setup.provide(Arc::new(crate::envd::watchers::Watchers::default()));
    })
}
