//! `process.Process`: start, attach to, list, feed and signal processes, as envd does.
//! Processes belong to the identity that started them: another identity's pid or tag
//! is not found.

use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::api::ApiError;
use crate::app::endpoint::HandlerFuture;
use crate::app::Call;
use crate::app::RawSink;
use crate::envd::processes::{self, Chunk, Item, Process, Processes};
use crate::envd::proto::process::{
    DataEvent, Empty, EndEvent, Event, EventResponse, Input, ListResponse, Output, ProcessConfig,
    ProcessEvent, ProcessInfo, ProcessInput, ProcessSelector, SelectRequest, Selector,
    SendInputRequest, SendSignalRequest, Signal, StartEvent, StartRequest,
    StreamInput as StreamInputEvent, StreamInputRequest, UpdateRequest,
};
use crate::http::connect::{self, Code, ContentType, Envelopes, FLAG_END_STREAM};
use crate::http::response::LocalFuture;
use crate::http::Response;
use crate::process::child::{Child, Spawn};
use crate::routes::shared::{command_refusal, protected_env_refusal, spawn_error, working_dir};

use super::rpc::{self, error, Events, Next, Timing};
use super::user;

/// How long input may wait for a process that reads nothing.
const INPUT_WAIT: Duration = Duration::from_secs(10);

fn table(call: &Call) -> Result<Arc<Processes>, ApiError> {
    call.group_arc::<Processes>()
}

/// The caller's process a selector names.
fn select(call: &Call, selector: Option<&ProcessSelector>) -> Result<Arc<Process>, ApiError> {
    let table = table(call)?;
    let owner = &call.identity.id;
    match selector.and_then(|s| s.selector.as_ref()) {
        Some(Selector::Pid(pid)) => table
            .by_pid(*pid, owner)
            .ok_or_else(|| error(Code::NotFound, format!("process with pid {pid} not found"))),
        Some(Selector::Tag(tag)) => table
            .by_tag(tag, owner)
            .ok_or_else(|| error(Code::NotFound, format!("process with tag {tag} not found"))),
        None => Err(error(
            Code::InvalidArgument,
            "process must name a pid or a tag",
        )),
    }
}

/// `Start`: runs a program and streams its events: `start` with the pid, `data` as it
/// writes, `end` with the exit.
pub async fn start(mut call: Call) -> Result<Response, ApiError> {
    let (ct, request) = rpc::request::<StartRequest>(&mut call, true)?;
    let config = request.process.unwrap_or_default();
    if config.cmd.is_empty() {
        return Err(error(
            Code::InvalidArgument,
            "process.cmd must name a program",
        ));
    }
    let mut argv = vec![config.cmd.clone()];
    argv.extend(config.args.iter().cloned());
    check_commands(&call, &argv)?;
    if let Some(refusal) = protected_env_refusal(&call, config.envs.keys().map(String::as_str)) {
        return Err(refusal);
    }
    if let Some(name) = config
        .envs
        .keys()
        .find(|name| name.is_empty() || name.contains('=') || name.contains('\0'))
    {
        return Err(error(
            Code::InvalidArgument,
            format!("envs: '{name}' is not a variable name"),
        ));
    }
    let account = user::account(&call).await?;
    // envd starts in the user's home: here when it lies beneath the base directory.
    let cwd_input = match &config.cwd {
        Some(cwd) => Some(user::rooted(&call, &account, cwd)),
        None => account
            .home
            .starts_with(call.services().base.path())
            .then(|| account.home.to_string_lossy().into_owned()),
    };
    let cwd = match working_dir(&call, cwd_input.as_deref()).await {
        // A home that is not there (yet): the base directory, as without one.
        Err(_) if config.cwd.is_none() => working_dir(&call, None).await?,
        other => other?,
    };
    // The account's own variables first, so the caller's `envs` win.
    let mut env: Vec<(String, String)> = vec![
        ("HOME".into(), account.home.to_string_lossy().into_owned()),
        ("USER".into(), account.name.clone()),
        ("LOGNAME".into(), account.name.clone()),
    ];
    let mut asked: Vec<(String, String)> = config
        .envs
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    asked.sort();
    env.extend(asked);
    let mut terminal = None;
    let mut terminal_path = None;
    if let Some(pty) = &request.pty {
        let (cols, rows) = pty
            .size
            .as_ref()
            .map_or((80, 24), |s| (s.cols.clamp(1, 1000), s.rows.clamp(1, 1000)));
        let (master, path) = open_terminal(cols as u16, rows as u16)
            .map_err(|e| error(Code::Internal, format!("cannot open a terminal: {e}")))?;
        terminal = Some(master);
        terminal_path = Some(path);
        if !env.iter().any(|(k, _)| k == "TERM") {
            env.push(("TERM".into(), "xterm-256color".into()));
        }
    }
    let stdin = terminal.is_none() && request.stdin.unwrap_or(true);
    let spec = Spawn {
        argv,
        cwd,
        env: call.services().environment.with(&env),
        stdin,
        capture: terminal.is_none(),
        terminal: terminal_path,
        user: user::hands_over(&account).then_some((account.uid, account.gid)),
    };
    let child = Child::spawn(spec, &call.services().children)
        .await
        .map_err(|e| {
            let api = spawn_error(&e, &config.cmd);
            error(
                if e.kind() == std::io::ErrorKind::NotFound {
                    Code::NotFound
                } else {
                    Code::Internal
                },
                api.message,
            )
        })?;
    let config_kept = processes::Config {
        cmd: config.cmd.clone(),
        args: config.args.clone(),
        envs: config.envs.clone(),
        cwd: config.cwd.clone(),
    };
    let process = table(&call)?
        .add(
            child,
            &call.identity.id,
            request.tag.clone(),
            config_kept,
            terminal,
        )
        .map_err(|e| match e {
            processes::AddError::Full => error(
                Code::ResourceExhausted,
                format!(
                    "{} processes are held already; wait for some to end",
                    processes::MAX_PROCESSES
                ),
            ),
            processes::AddError::TagTaken(tag) => error(
                Code::AlreadyExists,
                format!("a running process already has tag '{tag}'"),
            ),
        })?;
    let stream = process.attach(true);
    Ok(event_stream(ct, Timing::of(&call), process, stream, true))
}

/// The policy's `commands` rule on what `argv` runs. The SDK runs everything as
/// `/bin/bash -l -c <script>`, so for a shell's `-c` script the rule is applied to the
/// program of each command in the script instead of the shell: `deny: [nc]` refuses
/// `nc -l 80; true`, and `allow: [python3]` lets `python3 x.py` through. What a script
/// computes at run time cannot be checked, so under an `allow` list a script with
/// `$(...)`, backticks or `eval` is refused.
fn check_commands(call: &Call, argv: &[String]) -> Result<(), ApiError> {
    let decision = call.decision();
    let id = &call.spec().id;
    let Some(script) = shell_script(argv) else {
        return command_refusal(decision, id, argv).map_or(Ok(()), Err);
    };
    if decision.knob_list("commands.allow").is_some()
        && (script.contains("$(")
            || script.contains('`')
            || script_programs(script).iter().any(|p| p == "eval"))
    {
        return Err(ApiError::new(
            403,
            "PermissionError",
            format!(
                "The script builds commands at run time ($(...), backticks or eval), which policy rule endpoints.{id}.commands (allow) cannot check; run the program directly"
            ),
        )
        .with_code("command_not_allowed"));
    }
    for program in script_programs(script) {
        if let Some(refusal) = command_refusal(decision, id, &[program]) {
            return Err(refusal);
        }
    }
    Ok(())
}

/// The script of `sh|bash|zsh|dash [-l] -c <script>` (flags may be combined: `-lc`).
fn shell_script(argv: &[String]) -> Option<&str> {
    let shell = argv.first()?.rsplit('/').next()?;
    if !matches!(shell, "sh" | "bash" | "zsh" | "dash") {
        return None;
    }
    let mut args = argv[1..].iter();
    while let Some(arg) = args.next() {
        match arg.strip_prefix('-') {
            Some(flags) if !flags.starts_with('-') && flags.contains('c') => {
                return args.next().map(String::as_str)
            }
            Some(_) => {}
            None => return None,
        }
    }
    None
}

/// The program of each simple command in a shell script: split at `;`, `&`, `|`, newlines
/// and parentheses or braces, leading `NAME=value` assignments skipped.
fn script_programs(script: &str) -> Vec<String> {
    const KEYWORDS: [&str; 11] = [
        "if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "time",
    ];
    let assignment = |word: &str| {
        word.split_once('=').is_some_and(|(name, _)| {
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
    };
    script
        .split(['\n', ';', '&', '|', '(', ')', '{', '}'])
        .filter_map(|command| {
            let words = crate::process::shlex::split(command)
                .unwrap_or_else(|_| command.split_whitespace().map(str::to_string).collect());
            words
                .into_iter()
                .find(|w| !assignment(w) && !KEYWORDS.contains(&w.as_str()))
        })
        .collect()
}

/// `Connect`: the events of a running process from now on (its `start` first).
pub async fn connect(mut call: Call) -> Result<Response, ApiError> {
    let (ct, request) = rpc::request::<SelectRequest>(&mut call, true)?;
    let process = select(&call, request.process.as_ref())?;
    let stream = process.attach(false);
    Ok(event_stream(ct, Timing::of(&call), process, stream, false))
}

fn event_stream(
    ct: ContentType,
    timing: Timing,
    process: Arc<Process>,
    stream: processes::Stream,
    kill_at_deadline: bool,
) -> Response {
    rpc::stream(
        ct,
        timing,
        Box::new(ProcessEvents {
            ct,
            process,
            stream,
            started: false,
            kill_at_deadline,
        }),
    )
}

struct ProcessEvents {
    ct: ContentType,
    process: Arc<Process>,
    stream: processes::Stream,
    started: bool,
    /// A `Start` whose timeout passes ends its process, as envd does; a `Connect` only
    /// stops following it.
    kill_at_deadline: bool,
}

impl ProcessEvents {
    fn message(&self, event: Event) -> Vec<u8> {
        let response = EventResponse {
            event: Some(ProcessEvent { event: Some(event) }),
        };
        crate::envd::encode(self.ct.codec, &response)
    }
}

impl Events for ProcessEvents {
    fn next(&mut self) -> LocalFuture<'_, Next> {
        Box::pin(async move {
            if !self.started {
                self.started = true;
                return Next::Message(self.message(Event::Start(StartEvent {
                    pid: self.process.pid,
                })));
            }
            match self.stream.next().await {
                Some(Item::Output(chunk)) => {
                    let output = match chunk {
                        Chunk::Stdout(b) => Output::Stdout(b),
                        Chunk::Stderr(b) => Output::Stderr(b),
                        Chunk::Pty(b) => Output::Pty(b),
                    };
                    Next::Message(self.message(Event::Data(DataEvent {
                        output: Some(output),
                    })))
                }
                Some(Item::End(end)) => {
                    // The end message, then (on the next call) the stream's end.
                    Next::Message(self.message(Event::End(EndEvent {
                        exit_code: end.exit_code,
                        exited: end.exited,
                        status: end.status,
                        error: end.error,
                    })))
                }
                Some(Item::CutOff) => Next::End(Some((
                    Code::ResourceExhausted,
                    format!(
                        "this stream took no output for {} s while the process waited on it; reconnect to follow it",
                        processes::STALL.as_secs()
                    ),
                ))),
                None => Next::End(None),
            }
        })
    }

    fn keepalive(&self) -> Vec<u8> {
        self.message(Event::Keepalive(Empty {}))
    }

    fn deadline(&mut self) {
        if self.kill_at_deadline {
            let _ = self.process.signal(rustix::process::Signal::KILL);
        }
    }
}

/// `List`: the caller's running processes.
pub async fn list(mut call: Call) -> Result<Response, ApiError> {
    let (ct, _) = rpc::request::<Empty>(&mut call, false)?;
    let processes = table(&call)?
        .running(&call.identity.id)
        .into_iter()
        .map(|p| ProcessInfo {
            config: Some(ProcessConfig {
                cmd: p.config.cmd.clone(),
                args: p.config.args.clone(),
                envs: p.config.envs.clone(),
                cwd: p.config.cwd.clone(),
            }),
            pid: p.pid,
            tag: p.tag.clone(),
        })
        .collect();
    Ok(rpc::unary(ct, &ListResponse { processes }))
}

/// `SendInput`: bytes to a process's stdin or terminal.
pub async fn send_input(mut call: Call) -> Result<Response, ApiError> {
    let (ct, request) = rpc::request::<SendInputRequest>(&mut call, false)?;
    let process = select(&call, request.process.as_ref())?;
    deliver(&process, request.input).await?;
    Ok(rpc::unary(ct, &Empty {}))
}

/// Writes one input message to the process's stdin or terminal.
async fn deliver(process: &Process, input: Option<ProcessInput>) -> Result<(), ApiError> {
    let (data, to_terminal) = match input.and_then(|i| i.input) {
        Some(Input::Stdin(data)) => (data, false),
        Some(Input::Pty(data)) => (data, true),
        None => (Vec::new(), false),
    };
    if !data.is_empty() {
        process
            .write_input(&data, to_terminal, INPUT_WAIT)
            .await
            .map_err(|e| {
                let code = match e.kind() {
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::InvalidInput => {
                        Code::FailedPrecondition
                    }
                    std::io::ErrorKind::TimedOut => Code::DeadlineExceeded,
                    _ => Code::Internal,
                };
                error(code, format!("input not delivered: {e}"))
            })?;
    }
    Ok(())
}

/// `StreamInput` (client streaming): a `start` naming the process, then `data` messages
/// whose bytes go to its stdin (or terminal) as they arrive; answered once the body
/// ends. Bounded by the request body limit (`max_request_bytes`, 10 MiB by default).
pub async fn open_stream_input(call: Call) -> Result<Box<dyn RawSink>, ApiError> {
    let ct = rpc::content_type(&call, true)?;
    Ok(Box::new(StreamInput {
        call,
        ct,
        envelopes: Envelopes::new(rpc::MAX_MESSAGE),
        process: None,
    }))
}

struct StreamInput {
    call: Call,
    ct: ContentType,
    envelopes: Envelopes,
    process: Option<Arc<Process>>,
}

impl StreamInput {
    async fn take(&mut self, message: StreamInputRequest) -> Result<(), ApiError> {
        match message.event {
            Some(StreamInputEvent::Start(start)) => {
                if self.process.is_some() {
                    return Err(error(Code::InvalidArgument, "start may come only once"));
                }
                self.process = Some(select(&self.call, start.process.as_ref())?);
            }
            Some(StreamInputEvent::Data(data)) => {
                let process = self.process.as_ref().ok_or_else(|| {
                    error(
                        Code::InvalidArgument,
                        "the first message must be start, naming the process",
                    )
                })?;
                deliver(process, data.input).await?;
            }
            Some(StreamInputEvent::Keepalive(_)) | None => {}
        }
        Ok(())
    }
}

impl RawSink for StreamInput {
    fn write(&mut self, mut piece: Vec<u8>) -> LocalFuture<'_, Result<Vec<u8>, ApiError>> {
        Box::pin(async move {
            self.envelopes.push(&piece);
            loop {
                let envelope = match self.envelopes.next_envelope() {
                    Ok(Some(envelope)) => envelope,
                    Ok(None) => break,
                    Err(why) => return Err(error(Code::InvalidArgument, why)),
                };
                if envelope.flags & FLAG_END_STREAM != 0 {
                    continue;
                }
                let message =
                    crate::envd::decode::<StreamInputRequest>(self.ct.codec, &envelope.message)
                        .map_err(|why| error(Code::InvalidArgument, why))?;
                self.take(message).await?;
            }
            piece.clear();
            Ok(piece)
        })
    }

    fn finish(self: Box<Self>) -> HandlerFuture<Response> {
        Box::pin(async move {
            let mut body = connect::envelope(0, &crate::envd::encode(self.ct.codec, &Empty {}));
            body.extend(connect::end_of_stream(None));
            Ok(Response::raw(200, self.ct.header(), body))
        })
    }

    fn abort(self: Box<Self>) -> Pin<Box<dyn std::future::Future<Output = ()>>> {
        Box::pin(async {})
    }
}

/// `CloseStdin`: end of file on the process's stdin.
pub async fn close_stdin(mut call: Call) -> Result<Response, ApiError> {
    let (ct, request) = rpc::request::<SelectRequest>(&mut call, false)?;
    let process = select(&call, request.process.as_ref())?;
    if process.has_terminal() {
        return Err(error(
            Code::FailedPrecondition,
            "a process on a terminal has no stdin to close: send Ctrl-D (\\x04) as pty input",
        ));
    }
    process.close_stdin();
    Ok(rpc::unary(ct, &Empty {}))
}

/// `SendSignal`: SIGTERM or SIGKILL to the process's group.
pub async fn send_signal(mut call: Call) -> Result<Response, ApiError> {
    let (ct, request) = rpc::request::<SendSignalRequest>(&mut call, false)?;
    let process = select(&call, request.process.as_ref())?;
    let signal = match Signal::try_from(request.signal) {
        Ok(Signal::Sigterm) => rustix::process::Signal::TERM,
        Ok(Signal::Sigkill) => rustix::process::Signal::KILL,
        _ => {
            return Err(error(
                Code::InvalidArgument,
                "signal must be SIGNAL_SIGTERM or SIGNAL_SIGKILL",
            ))
        }
    };
    process
        .signal(signal)
        .map_err(|e| error(Code::Internal, format!("cannot signal the process: {e}")))?;
    Ok(rpc::unary(ct, &Empty {}))
}

/// `Update`: resizes a process's terminal.
pub async fn update(mut call: Call) -> Result<Response, ApiError> {
    let (ct, request) = rpc::request::<UpdateRequest>(&mut call, false)?;
    let process = select(&call, request.process.as_ref())?;
    if let Some(size) = request.pty.and_then(|p| p.size) {
        if !(1..=1000).contains(&size.cols) || !(1..=1000).contains(&size.rows) {
            return Err(error(
                Code::InvalidArgument,
                "pty.size: cols and rows must be from 1 to 1000",
            ));
        }
        process
            .resize(size.cols as u16, size.rows as u16)
            .map_err(|e| error(Code::FailedPrecondition, format!("cannot resize: {e}")))?;
    }
    Ok(rpc::unary(ct, &Empty {}))
}

/// A new terminal of `cols` × `rows`: its master and the slave's path.
fn open_terminal(
    cols: u16,
    rows: u16,
) -> std::io::Result<(std::os::fd::OwnedFd, std::ffi::CString)> {
    use rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    grantpt(&master)?;
    unlockpt(&master)?;
    let path = ptsname(&master, Vec::new())?;
    let size = rustix::termios::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    rustix::termios::tcsetwinsize(master.as_fd(), size)?;
    Ok((master, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn a_shells_script_is_found_behind_its_flags() {
        assert_eq!(
            shell_script(&argv(&["/bin/bash", "-l", "-c", "ls"])),
            Some("ls")
        );
        assert_eq!(
            shell_script(&argv(&["sh", "-lc", "echo hi"])),
            Some("echo hi")
        );
        assert_eq!(shell_script(&argv(&["/bin/bash", "script.sh"])), None);
        assert_eq!(shell_script(&argv(&["python3", "-c", "print()"])), None);
    }

    #[test]
    fn every_command_of_a_script_is_named() {
        assert_eq!(
            script_programs("A=1 nc -l 80; echo ok && /bin/rm -rf x | tee y\n(cd d; make)"),
            ["nc", "echo", "/bin/rm", "tee", "cd", "make"]
        );
        assert_eq!(script_programs("if true; then ls; fi"), ["true", "ls"]);
    }
}
