//! Firing, on the store itself: what one transaction records for a due occurrence,
//! what a restart does to a run under way, and that nothing fires twice.

use serde_json::json;

use super::*;
use crate::agents::durable::DurableStore;
use crate::agents::records::{Limits, ObjectStore};

const ALICE: &str = "alice";

fn automation(id: &str, when: When, next_at: Option<i64>) -> Automation {
    Automation {
        id: id.into(),
        created_at: 1,
        name: "nightly".into(),
        metadata: json!({}),
        when,
        status: "active".into(),
        target: Target {
            kind: "existing_session".into(),
            shown: json!({"type": "existing_session", "session_id": "sess_1", "instructions": "go"}),
            sealed: String::new(),
            session_id: Some("sess_1".into()),
        },
        created_by: json!({"type": "developer"}),
        next_at,
        fired: false,
    }
}

fn every_minute() -> When {
    When::Periodic {
        expression: "* * * * *".into(),
        timezone: "UTC".into(),
    }
}

fn store_with(a: Automation) -> DurableStore {
    let store = DurableStore::in_memory(Limits::default());
    store
        .transact(|t| {
            t.create(Scope::owner(ALICE), a.clone())?;
            index(t, ALICE, &a)
        })
        .unwrap();
    store
}

fn runs(store: &DurableStore, id: &str) -> Vec<Invocation> {
    store
        .transact(|t| t.list::<Invocation>(Scope::within(ALICE, id), &ListQuery::all()))
        .unwrap()
        .data
}

fn fire_at(store: &DurableStore, id: &str, now: i64) -> Fired {
    store.transact(|t| fire(t, ALICE, id, now)).unwrap()
}

// 2026-01-01T00:00:00Z
const T0: i64 = 1_767_225_600;

#[test]
fn a_due_occurrence_records_one_queued_run_and_moves_the_schedule() {
    let store = store_with(automation("auto_1", every_minute(), Some(T0 + 60)));
    // Not due yet: nothing fires, and it says when.
    assert_eq!(
        fire_at(&store, "auto_1", T0 + 59),
        Fired {
            next: Some(T0 + 60),
            deliver: None
        }
    );
    let fired = fire_at(&store, "auto_1", T0 + 60);
    assert_eq!(fired.next, Some(T0 + 120));
    let runs = runs(&store, "auto_1");
    assert_eq!(runs.len(), 1);
    assert_eq!(fired.deliver.as_deref(), Some(runs[0].id.as_str()));
    assert_eq!(runs[0].status, "queued");
    assert_eq!(runs[0].scheduled_at, Some(T0 + 60));
    assert_eq!(runs[0].source["type"], "automation");
    assert_eq!(runs[0].source["automation"]["id"], "auto_1");
    // The same occurrence a second time fires nothing.
    assert_eq!(fire_at(&store, "auto_1", T0 + 61).deliver, None);
    assert_eq!(super::tests::runs(&store, "auto_1").len(), 1);
    let entries = store.transact(|t| entries(t)).unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].at, T0 + 120);
}

#[test]
fn missed_occurrences_are_caught_up_once() {
    let store = store_with(automation("auto_1", every_minute(), Some(T0 + 60)));
    // Down for an hour: one run, for the first missed occurrence; then from now on.
    let fired = fire_at(&store, "auto_1", T0 + 3_630);
    assert!(fired.deliver.is_some());
    assert_eq!(fired.next, Some(T0 + 3_660));
    let runs = runs(&store, "auto_1");
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].scheduled_at, Some(T0 + 60));
}

#[test]
fn an_occurrence_while_a_run_is_pending_is_skipped() {
    let store = store_with(automation("auto_1", every_minute(), Some(T0 + 60)));
    fire_at(&store, "auto_1", T0 + 60);
    let second = fire_at(&store, "auto_1", T0 + 120);
    assert_eq!(second.deliver, None);
    let runs = runs(&store, "auto_1");
    assert_eq!(runs.len(), 2);
    let skipped = runs.iter().find(|r| r.status == "skipped").unwrap();
    assert_eq!(skipped.skip_reason.as_deref(), Some("pending_delivery"));
    assert_eq!(skipped.scheduled_at, Some(T0 + 120));
    // Settled, the next occurrence is delivered again.
    let queued = runs
        .iter()
        .find(|r| r.status == "queued")
        .unwrap()
        .id
        .clone();
    store
        .transact(|t| {
            settle(
                t,
                ALICE,
                "auto_1",
                &queued,
                Outcome::Delivered {
                    session_id: "sess_1".into(),
                },
            )
        })
        .unwrap();
    assert!(fire_at(&store, "auto_1", T0 + 180).deliver.is_some());
}

#[test]
fn a_one_time_automation_fires_once_and_completes() {
    let store = store_with(automation(
        "auto_1",
        When::Once { run_at: T0 + 10 },
        Some(T0 + 10),
    ));
    let fired = fire_at(&store, "auto_1", T0 + 10);
    assert!(fired.deliver.is_some());
    assert_eq!(fired.next, None);
    let a: Automation = store
        .transact(|t| t.get(Scope::owner(ALICE), "auto_1"))
        .unwrap();
    assert_eq!(a.status, "completed");
    assert!(a.fired);
    assert!(store.transact(|t| entries(t)).unwrap().is_empty());
    assert_eq!(fire_at(&store, "auto_1", T0 + 20), Fired::default());
    assert_eq!(runs(&store, "auto_1").len(), 1);
}

#[test]
fn a_paused_or_deleted_automation_never_fires() {
    let mut paused = automation("auto_1", every_minute(), None);
    paused.status = "paused".into();
    let store = store_with(paused);
    assert_eq!(fire_at(&store, "auto_1", T0 + 600), Fired::default());
    assert!(runs(&store, "auto_1").is_empty());
    assert_eq!(fire_at(&store, "auto_gone", T0), Fired::default());
}

#[test]
fn a_restart_fails_a_run_under_way_instead_of_repeating_it() {
    let store = store_with(automation("auto_1", every_minute(), Some(T0 + 60)));
    fire_at(&store, "auto_1", T0 + 60);
    let changed = store.transact(|t| t.restart::<Invocation>()).unwrap();
    assert_eq!(changed, 1);
    let run = &runs(&store, "auto_1")[0];
    assert_eq!(run.status, "failed");
    assert_eq!(run.error.as_ref().unwrap()["code"], "interrupted");
    // Nothing is left to deliver.
    let delivery = store
        .transact(|t| delivery(t, ALICE, "auto_1", &run.id))
        .unwrap();
    assert_eq!(delivery, None);
}

#[test]
fn runs_kept_are_bounded_the_oldest_finished_going_first() {
    let store = store_with(automation("auto_1", every_minute(), Some(T0 + 60)));
    let a: Automation = store
        .transact(|t| t.get(Scope::owner(ALICE), "auto_1"))
        .unwrap();
    store
        .transact(|t| {
            for _ in 0..MAX_RUNS_KEPT + 5 {
                let mut run = new_invocation(&a, "completed", None, json!({"type": "manual"}));
                run.session_id = Some("sess_1".into());
                record(t, ALICE, run)?;
            }
            Ok::<_, AgentError>(())
        })
        .unwrap();
    assert_eq!(runs(&store, "auto_1").len(), MAX_RUNS_KEPT);
}
