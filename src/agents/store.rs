//! The running server's agents store: `<ABX_STATE_DIR>/agents.redb`, opened once while
//! the server is built, and what a restart means for the records of work that was in
//! flight when the last server stopped. When the file cannot be opened (a read-only or
//! missing state directory, another server holding it, a damaged file) the server still
//! runs, with the same store in memory, and publishes a warning that says why and what
//! to do: the `/v1` objects then last as long as the process.

use std::path::Path;

use super::automations::Invocation;
use super::conversations::Conversation;
use super::durable::{DurableStore, OpenError};
use super::records::{Limits, ObjectStore, StoreError, Transaction};
use super::responses::ResponseRecord;
use super::sessions::records::{Session, Subagent, SubagentTurn, Turn};
use super::surface::{Agents, AgentsStore};

/// The store's file in the state directory.
pub const FILE: &str = "agents.redb";

/// The opened store.
pub struct Opened {
    pub agents: Agents<AgentsStore>,
    /// Why the store is not what it should be, and what to do: a startup warning.
    pub warning: Option<String>,
    /// Records that were in flight when the last server stopped, changed to say so.
    pub restarted: usize,
}

/// Opens the store in `state_dir` (created with mode 0700, the file 0600), or in
/// memory when that fails; then, in one transaction, tells every record of work in
/// flight that the server restarted ([`restart`]).
pub fn open(state_dir: &Path) -> Opened {
    let path = state_dir.join(FILE);
    let (store, mut warning) = match DurableStore::open(&path, Limits::default()) {
        Ok(store) => (store, None),
        Err(e) => (
            DurableStore::in_memory(Limits::default()),
            Some(in_memory_warning(&path, &e)),
        ),
    };
    // Not on a worker: the server is being built, nothing is served yet.
    let restarted = match store.transact(|t| restart(t)) {
        Ok(n) => n,
        Err(e) => {
            warning.get_or_insert(format!(
                "agents: the store {} opened, but the responses that were running when the server stopped could not be marked failed ({e:?}); they show in_progress until deleted. Check that the disk has room and the file is writable, then restart.",
                path.display()
            ));
            0
        }
    };
    Opened {
        agents: Agents::new(store),
        warning,
        restarted,
    }
}

/// Every record type whose records can describe work in flight, each told (by
/// [`Record::on_restart`](super::records::Record::on_restart)) that nothing of the last
/// process runs any more: a response running then has failed, a conversation a turn
/// had taken is free. A new record type of that kind adds itself here.
pub fn restart(t: &mut <AgentsStore as ObjectStore>::Txn<'_>) -> Result<usize, StoreError> {
    Ok(t.restart::<ResponseRecord>()?
        + t.restart::<Conversation>()?
        + t.restart::<Session>()?
        + t.restart::<Turn>()?
        + t.restart::<SubagentTurn>()?
        + t.restart::<Subagent>()?
        + t.restart::<Invocation>()?)
}

/// The startup warning of a store kept in memory because `path` could not be opened.
fn in_memory_warning(path: &Path, error: &OpenError) -> String {
    let path = path.display();
    let kept = "so this server keeps responses and conversations in memory, and they are lost when it stops";
    match error {
        OpenError::Locked => format!(
            "agents: the store {path} is open in another process (another agent-sandbox server with the same ABX_STATE_DIR), {kept}. Give each server its own ABX_STATE_DIR, or stop the other one, and restart."
        ),
        OpenError::Io(e) => format!(
            "agents: the store {path} cannot be opened ({e}), {kept}. Point ABX_STATE_DIR at a writable directory (created with mode 0700 if missing) and restart."
        ),
        OpenError::Damaged(why) => format!(
            "agents: the store {path} cannot be read ({why}), {kept}. Move the file aside (a new, empty store is then created in its place; the old file is left as it is) and restart."
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::records::{new_id, Scope};
    use serde_json::json;

    #[test]
    fn a_restart_fails_the_responses_that_were_running_and_frees_their_conversations() {
        let dir = std::env::temp_dir().join(new_id("abx-store-"));
        let alice = Scope::owner("alice");
        let running = |id: &str, status: &str| ResponseRecord {
            object: json!({"id": id, "object": "response", "status": status, "error": null}),
            session: None,
            running: status == "in_progress",
        };
        {
            let opened = open(&dir);
            assert!(opened.warning.is_none(), "{:?}", opened.warning);
            assert_eq!(opened.restarted, 0);
            let store = &opened.agents;
            store
                .transact_now(|t| {
                    t.create(alice, running("resp_1", "in_progress"))?;
                    t.create(alice, running("resp_2", "completed"))?;
                    let mut taken = conversation("conv_1");
                    taken.busy = true;
                    t.create(alice, taken)?;
                    t.create(alice, conversation("conv_2"))
                })
                .unwrap();
        }
        let opened = open(&dir);
        assert!(opened.warning.is_none(), "{:?}", opened.warning);
        assert_eq!(opened.restarted, 2);
        let (failed, done, freed) = opened
            .agents
            .transact_now(|t| {
                Ok::<_, StoreError>((
                    t.get::<ResponseRecord>(alice, "resp_1")?,
                    t.get::<ResponseRecord>(alice, "resp_2")?,
                    t.get::<Conversation>(alice, "conv_1")?,
                ))
            })
            .unwrap();
        assert_eq!(failed.object["status"], "failed");
        assert!(!failed.running);
        assert_eq!(
            failed.object["error"],
            json!({"code": "server_error", "message": super::super::responses::STOPPED_BY_RESTART})
        );
        assert_eq!(done.object["status"], "completed");
        assert!(!freed.busy);
        drop(opened);
        // Held by another server: in memory, with a warning saying so.
        let first = open(&dir);
        let second = open(&dir);
        let warning = second.warning.clone().unwrap();
        assert!(
            warning.contains("another agent-sandbox server") && warning.contains("ABX_STATE_DIR"),
            "{warning}"
        );
        drop((first, second));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn conversation(id: &str) -> Conversation {
        Conversation {
            id: id.into(),
            created_at: 0,
            metadata: json!({}),
            sessions: Vec::new(),
            seen_through: None,
            busy: false,
        }
    }
}
