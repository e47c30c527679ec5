//! A root turn's trace, as the SDK's `SessionTrace.otlp` holds it: an OTLP JSON
//! `ExportTraceServiceRequest` (`resourceSpans` → `scopeSpans` → `spans`) with one span
//! for the turn and, beneath it, one per model request and one per command or tool call.
//!
//! codex says when an item starts and completes (`startedAtMs`, `completedAtMs`), so
//! command and tool spans are exact. It says nothing when a model request starts; it
//! reports token usage when one ends (`thread/tokenUsage/updated`). A model request's
//! span therefore runs from the turn's start, or the end of the tool call before it,
//! to that report — the time the turn waited for the model.

use serde_json::{json, Value};

use crate::agents::records::new_id;

/// OTLP span kinds.
const INTERNAL: u8 = 1;
const CLIENT: u8 = 3;

/// Spans one trace keeps at most (a runaway turn does not grow it without bound).
pub const MAX_SPANS: usize = 1_000;

struct Span {
    id: String,
    name: String,
    kind: u8,
    start_ms: u64,
    end_ms: u64,
    attributes: Vec<(String, Value)>,
    failed: bool,
}

/// The spans of one turn, while it runs.
pub struct TraceBuilder {
    trace_id: String,
    turn_span: String,
    started_ms: u64,
    /// Where the next model request's span starts.
    model_from_ms: u64,
    spans: Vec<Span>,
    model_requests: usize,
}

impl TraceBuilder {
    pub fn new(started_ms: u64) -> TraceBuilder {
        TraceBuilder {
            trace_id: new_id(""),
            turn_span: span_id(),
            started_ms,
            model_from_ms: started_ms,
            spans: Vec::new(),
            model_requests: 0,
        }
    }

    /// A model request ended at `now_ms` (codex reported its usage).
    pub fn model_request(&mut self, now_ms: u64, model: &str, usage: &Value) {
        self.model_requests += 1;
        let mut attributes = vec![("gen_ai.request.model".to_string(), json!(model))];
        for (key, field) in [
            ("gen_ai.usage.input_tokens", "inputTokens"),
            ("gen_ai.usage.output_tokens", "outputTokens"),
        ] {
            if let Some(n) = usage.get(field).and_then(Value::as_u64) {
                attributes.push((key.to_string(), json!(n)));
            }
        }
        let start = self.model_from_ms.min(now_ms);
        self.push("model.request", CLIENT, start, now_ms, attributes, false);
        self.model_from_ms = now_ms;
    }

    /// A command, function, MCP or other tool call ran from `start_ms` to `end_ms`.
    pub fn tool_call(
        &mut self,
        name: &str,
        start_ms: u64,
        end_ms: u64,
        attributes: Vec<(String, Value)>,
        failed: bool,
    ) {
        self.push(name, INTERNAL, start_ms, end_ms, attributes, failed);
        self.model_from_ms = self.model_from_ms.max(end_ms);
    }

    fn push(
        &mut self,
        name: &str,
        kind: u8,
        start_ms: u64,
        end_ms: u64,
        attributes: Vec<(String, Value)>,
        failed: bool,
    ) {
        if self.spans.len() < MAX_SPANS {
            self.spans.push(Span {
                id: span_id(),
                name: name.to_string(),
                kind,
                start_ms,
                end_ms: end_ms.max(start_ms),
                attributes,
                failed,
            });
        }
    }

    /// The trace of the turn that ended at `end_ms` with `status`.
    pub fn finish(self, end_ms: u64, session_id: &str, turn_id: &str, status: &str) -> Value {
        let turn = Span {
            id: self.turn_span.clone(),
            name: "agent.turn".into(),
            kind: INTERNAL,
            start_ms: self.started_ms,
            end_ms: end_ms.max(self.started_ms),
            attributes: vec![
                ("agent.session.id".into(), json!(session_id)),
                ("agent.turn.id".into(), json!(turn_id)),
                ("agent.turn.status".into(), json!(status)),
                (
                    "agent.turn.model_requests".into(),
                    json!(self.model_requests),
                ),
            ],
            failed: status == "failed",
        };
        let mut spans = vec![otlp_span(&self.trace_id, None, &turn)];
        for span in &self.spans {
            spans.push(otlp_span(&self.trace_id, Some(&self.turn_span), span));
        }
        json!({"resourceSpans": [{
            "resource": {"attributes": [
                attribute("service.name", &json!("agent-sandbox")),
                attribute("service.version", &json!(env!("CARGO_PKG_VERSION"))),
            ]},
            "scopeSpans": [{
                "scope": {"name": "agent-sandbox.agents", "version": env!("CARGO_PKG_VERSION")},
                "spans": spans,
            }],
        }]})
    }
}

fn span_id() -> String {
    new_id("")[..16].to_string()
}

fn attribute(key: &str, value: &Value) -> Value {
    let any = match value {
        Value::String(s) => json!({"stringValue": s}),
        Value::Bool(b) => json!({"boolValue": b}),
        // OTLP JSON carries 64-bit integers as strings.
        Value::Number(n) if n.is_i64() || n.is_u64() => json!({"intValue": n.to_string()}),
        Value::Number(n) => json!({"doubleValue": n.as_f64()}),
        other => json!({"stringValue": other.to_string()}),
    };
    json!({"key": key, "value": any})
}

fn otlp_span(trace_id: &str, parent: Option<&str>, span: &Span) -> Value {
    let nanos = |ms: u64| (ms as u128 * 1_000_000).to_string();
    let attributes: Vec<Value> = span
        .attributes
        .iter()
        .map(|(k, v)| attribute(k, v))
        .collect();
    json!({
        "traceId": trace_id,
        "spanId": span.id,
        "parentSpanId": parent.unwrap_or(""),
        "name": span.name,
        "kind": span.kind,
        "startTimeUnixNano": nanos(span.start_ms),
        "endTimeUnixNano": nanos(span.end_ms),
        "attributes": attributes,
        // 1 is OK, 2 is ERROR.
        "status": {"code": if span.failed { 2 } else { 1 }},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_is_a_root_span_over_its_model_requests_and_tool_calls() {
        let mut trace = TraceBuilder::new(1_000);
        trace.model_request(1_400, "m", &json!({"inputTokens": 10, "outputTokens": 3}));
        trace.tool_call(
            "command_execution",
            1_410,
            1_500,
            vec![("command".into(), json!("ls"))],
            false,
        );
        trace.model_request(1_900, "m", &json!({}));
        let otlp = trace.finish(2_000, "sess_1", "turn_1", "completed");
        let spans = otlp["resourceSpans"][0]["scopeSpans"][0]["spans"]
            .as_array()
            .unwrap();
        let names: Vec<&str> = spans.iter().map(|s| s["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "agent.turn",
                "model.request",
                "command_execution",
                "model.request"
            ]
        );
        let root = &spans[0];
        assert_eq!(root["parentSpanId"], "");
        assert_eq!(root["startTimeUnixNano"], "1000000000");
        assert_eq!(root["traceId"].as_str().unwrap().len(), 32);
        assert_eq!(root["spanId"].as_str().unwrap().len(), 16);
        for child in &spans[1..] {
            assert_eq!(child["parentSpanId"], root["spanId"]);
            assert_eq!(child["traceId"], root["traceId"]);
        }
        // The second model request waited from the end of the command.
        assert_eq!(spans[3]["startTimeUnixNano"], "1500000000");
        assert_eq!(spans[1]["attributes"][1]["value"]["intValue"], "10");
    }
}
