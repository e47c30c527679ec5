//! The actor's sub-agents: codex opens a child thread when the model calls
//! `spawn_agent`, and every thread of a session's app-server but the session's own is
//! one (codex sends no `thread/started` for them; a new thread's first `turn/started`
//! says so). Each becomes a subagent record, its turns and items kept apart from the
//! root agent's, and its events are published on the session's stream. The core
//! decides when a thread is one (and asks codex its name); this is what the shell does
//! with it.

use serde_json::{json, Value};

use super::core::truncated;
use super::{now_ms, Actor, ChildThread};
use crate::agents::codex_map::{EventMapper, Fact, Totals};
use crate::agents::objects::{now_unix, Object};
use crate::agents::records::{new_id, Scope, StoreError, Transaction};
use crate::agents::sessions::records::{Subagent, SubagentItem, SubagentTurn, Turn, TurnStatus};

impl Actor {
    /// Keeps sub-agent thread `thread` (`name`d so by codex) as a subagent of the
    /// session and announces it.
    pub(super) async fn open_subagent(&mut self, thread: &str, name: Option<String>, now: u64) {
        let session = self.load().await.ok();
        let subagent = Subagent {
            // The codex thread id, as the parent's subagent call items name it.
            id: thread.to_string(),
            session_id: self.session.clone(),
            parent_agent_id: session
                .as_ref()
                .and_then(|s| s.agent["id"].as_str().map(str::to_string))
                .unwrap_or_default(),
            opened_at: now,
            closed_at: None,
            name,
            instructions: None,
            thread_id: thread.to_string(),
            turns: Vec::new(),
            items: Vec::new(),
        };
        let (owner, sid, kept) = (self.owner.clone(), self.session.clone(), subagent.clone());
        let created = self
            .agents
            .transact(move |t| t.create(Scope::within(&owner, &sid), kept))
            .await;
        let known = matches!(created, Err(StoreError::Exists));
        if created.is_err() && !known {
            return;
        }
        self.children.insert(
            thread.to_string(),
            ChildThread {
                subagent: thread.to_string(),
                turn: None,
            },
        );
        if known {
            // A sub-agent of an earlier app-server (before a restart) takes a new turn.
            return;
        }
        let object = subagent.object();
        self.publish(json!({"type": "agent.session.subagent.created", "subagent": object}));
        self.publish(json!({"type": "agent.session.subagent.active", "subagent": object}));
    }

    /// What an open sub-agent's thread says: its turns and items (kept apart from the
    /// root agent's), its closing.
    pub(super) async fn child_notification(&mut self, method: &str, params: &Value) {
        let now = now_unix();
        let Some(thread) = params["threadId"].as_str().map(str::to_string) else {
            return;
        };
        let Some(child) = self.children.get(&thread) else {
            return;
        };
        let subagent = child.subagent.clone();
        if method == "thread/closed" {
            self.children.remove(&thread);
            let (owner, sid) = (self.owner.clone(), self.session.clone());
            let closed = self
                .agents
                .transact(move |t| {
                    t.update::<Subagent, _>(Scope::within(&owner, &sid), &subagent, |s| {
                        s.closed_at = Some(now);
                        s.clone()
                    })
                })
                .await;
            if let Ok(subagent) = closed {
                self.publish(
                    json!({"type": "agent.session.subagent.closed", "subagent": subagent.object()}),
                );
            }
            return;
        }
        if method == "turn/started" && child.turn.is_none() {
            let turn = Turn {
                id: new_id("turn_"),
                session_id: self.session.clone(),
                agent_id: subagent.clone(),
                status: TurnStatus::InProgress,
                created_at: now,
                started_at: Some(now),
                completed_at: None,
                error: None,
                subagent_id: Some(subagent.clone()),
                usage: None,
                codex_turn_id: params["turn"]["id"].as_str().map(str::to_string),
                items: Vec::new(),
                started_ms: now_ms(),
                not_kept: Vec::new(),
            };
            let (owner, sid, kept, sub) = (
                self.owner.clone(),
                self.session.clone(),
                turn.clone(),
                subagent.clone(),
            );
            let stored = self
                .agents
                .transact(move |t| {
                    let within = Scope::within(&owner, &sid);
                    let id = kept.id.clone();
                    t.create(within, SubagentTurn(kept))?;
                    t.update::<Subagent, _>(within, &sub, |s| s.turns.push(id))
                })
                .await;
            if stored.is_err() {
                return;
            }
            let mapper = EventMapper::new(turn.object(), &thread, None, Totals::default());
            self.publish(
                json!({"type": "agent.session.turn.created", "session_id": self.session,
                                "turn_id": turn.id, "turn": turn.object()}),
            );
            if let Some(child) = self.children.get_mut(&thread) {
                child.turn = Some((turn.id.clone(), mapper));
            }
        }
        let Some((turn_id, mapped)) = self
            .children
            .get_mut(&thread)
            .and_then(|c| c.turn.as_mut())
            .map(|(id, mapper)| (id.clone(), mapper.notification(method, params)))
        else {
            return;
        };
        let mut items = Vec::new();
        let mut ended = None;
        for fact in mapped.facts {
            match fact {
                Fact::Item(item) => items.push(truncated(item)),
                Fact::TurnEnded(end) => ended = Some(end),
                Fact::ToolCall(_) => {}
            }
        }
        let (owner, sid, sub, tid) = (
            self.owner.clone(),
            self.session.clone(),
            subagent.clone(),
            turn_id.clone(),
        );
        let finished = ended.as_ref().map(|end| {
            (
                match end.status {
                    "completed" => TurnStatus::Completed,
                    "cancelled" => TurnStatus::Cancelled,
                    _ => TurnStatus::Failed,
                },
                end.error.clone(),
                end.usage.clone(),
            )
        });
        let _ = self
            .agents
            .transact(move |t| {
                let within = Scope::within(&owner, &sid);
                let ids: Vec<String> = items
                    .iter()
                    .map(|i| i["id"].as_str().unwrap_or_default().to_string())
                    .collect();
                for item in items {
                    t.create_or_replace(within, SubagentItem(item))?;
                }
                t.update::<SubagentTurn, _>(within, &tid, |SubagentTurn(turn)| {
                    for id in &ids {
                        if !turn.items.contains(id) {
                            turn.items.push(id.clone());
                        }
                    }
                    if let Some((status, error, usage)) = finished {
                        turn.status = status;
                        turn.error = error;
                        turn.usage = Some(usage);
                        turn.completed_at = Some(now_unix());
                    }
                })?;
                t.update::<Subagent, _>(within, &sub, |s| {
                    for id in ids {
                        if !s.items.contains(&id) {
                            s.items.push(id);
                        }
                    }
                })
            })
            .await;
        for event in mapped.events {
            self.publish(event);
        }
        if ended.is_some() {
            if let Some(child) = self.children.get_mut(&thread) {
                child.turn = None;
            }
        }
    }
}
