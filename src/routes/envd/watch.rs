//! `filesystem.Filesystem`'s watches: `WatchDir` (a stream of events) and the polled
//! `CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use crate::api::ApiError;
use crate::app::Call;
use crate::envd::proto::filesystem::{
    GetWatcherEventsResponse, WatchDirResponse, WatchEvent, WatchRequest, WatcherId,
};
use crate::envd::proto::process::Empty;
use crate::envd::watchers::{self, Watchers};
use crate::fs::watch::Watcher;
use crate::fs::{BaseDir, FsError};
use crate::http::connect::{Code, ContentType};
use crate::http::response::LocalFuture;
use crate::http::Response;
use crate::routes::shared::{confine_followed, fs_error};

use super::rpc::{self, error, Events, Next, Timing};

/// How often a watch without inotify rescans.
const POLL: Duration = Duration::from_millis(500);

async fn start_watcher(call: &Call, request: &WatchRequest) -> Result<Watcher, ApiError> {
    if request.path.is_empty() {
        return Err(error(Code::InvalidArgument, "path must not be empty"));
    }
    let account = super::user::account(call).await?;
    let mut caller =
        confine_followed(call, &super::user::rooted(call, &account, &request.path)).await?;
    caller.input = request.path.clone();
    let shown = caller.display();
    match Watcher::start(&call.services().base, caller, request.recursive, POLL).await {
        Ok(watcher) => Ok(watcher),
        Err(FsError::NotFound(_)) => Err(error(
            Code::NotFound,
            format!("directory '{shown}' does not exist"),
        )),
        Err(FsError::Io { error: e, .. }) if e.raw_os_error() == Some(libc::ENOTDIR) => Err(error(
            Code::InvalidArgument,
            format!("'{shown}' is not a directory"),
        )),
        Err(e) => Err(fs_error(e)),
    }
}

/// `WatchDir`: `start`, then the directory's changes as they happen.
pub async fn watch_dir(mut call: Call) -> Result<Response, ApiError> {
    let (ct, request) = rpc::request::<WatchRequest>(&mut call, true)?;
    let watcher = start_watcher(&call, &request).await?;
    Ok(rpc::stream(
        ct,
        Timing::of(&call),
        Box::new(WatchEvents {
            ct,
            watcher,
            base: call.services().base.clone(),
            include_entry: request.include_entry,
            started: false,
            pending: VecDeque::new(),
        }),
    ))
}

struct WatchEvents {
    ct: ContentType,
    watcher: Watcher,
    base: BaseDir,
    include_entry: bool,
    started: bool,
    pending: VecDeque<WatchEvent>,
}

impl WatchEvents {
    fn message(&self, event: WatchEvent) -> Vec<u8> {
        crate::envd::encode(self.ct.codec, &WatchDirResponse { event: Some(event) })
    }
}

impl Events for WatchEvents {
    fn next(&mut self) -> LocalFuture<'_, Next> {
        Box::pin(async move {
            if !self.started {
                self.started = true;
                return Next::Message(self.message(WatchEvent::Start(Empty {})));
            }
            loop {
                if let Some(event) = self.pending.pop_front() {
                    return Next::Message(self.message(event));
                }
                match self.watcher.next(Duration::from_secs(1)).await {
                    Ok(changes) if changes.is_empty() => {}
                    Ok(changes) => {
                        let events = watchers::events_of(
                            &self.base,
                            self.watcher.caller(),
                            changes,
                            self.include_entry,
                        )
                        .await;
                        self.pending
                            .extend(events.into_iter().map(WatchEvent::Filesystem));
                    }
                    Err(end) => {
                        let why = watchers::end_message(&end, self.watcher.caller());
                        return Next::End(Some((Code::NotFound, why)));
                    }
                }
            }
        })
    }

    fn keepalive(&self) -> Vec<u8> {
        self.message(WatchEvent::Keepalive(Empty {}))
    }
}

fn table(call: &Call) -> Result<Arc<Watchers>, ApiError> {
    call.group_arc::<Watchers>()
}

/// `CreateWatcher`: a watcher whose events are read with `GetWatcherEvents`.
pub async fn create_watcher(mut call: Call) -> Result<Response, ApiError> {
    let (ct, request) = rpc::request::<WatchRequest>(&mut call, false)?;
    let watcher = start_watcher(&call, &request).await?;
    let id = table(&call)?
        .start(
            watcher,
            &call.identity.id,
            request.include_entry,
            call.services().base.clone(),
        )
        .map_err(|_| {
            error(
                Code::ResourceExhausted,
                format!(
                    "{} watchers are open for this caller; remove one (RemoveWatcher) first",
                    watchers::MAX_PER_OWNER
                ),
            )
        })?;
    Ok(rpc::unary(ct, &WatcherId { watcher_id: id }))
}

fn not_found(id: &str) -> ApiError {
    error(Code::NotFound, format!("watcher '{id}' not found"))
}

/// `GetWatcherEvents`: what happened since the last read.
pub async fn get_watcher_events(mut call: Call) -> Result<Response, ApiError> {
    let (ct, request) = rpc::request::<WatcherId>(&mut call, false)?;
    let polled = table(&call)?
        .get(&request.watcher_id, &call.identity.id)
        .ok_or_else(|| not_found(&request.watcher_id))?;
    let events = polled
        .take()
        .map_err(|why| error(Code::FailedPrecondition, why))?;
    Ok(rpc::unary(ct, &GetWatcherEventsResponse { events }))
}

/// `RemoveWatcher`.
pub async fn remove_watcher(mut call: Call) -> Result<Response, ApiError> {
    let (ct, request) = rpc::request::<WatcherId>(&mut call, false)?;
    if !table(&call)?.remove(&request.watcher_id, &call.identity.id) {
        return Err(not_found(&request.watcher_id));
    }
    Ok(rpc::unary(ct, &Empty {}))
}
