//! An embedding program: agent-sandbox plus custom routes, the way a template's own Rust
//! main would add them. The integration tests run it to exercise custom routes, streaming,
//! opt-in groups and the panic guard against a real process.

use std::process::ExitCode;
use std::time::Duration;

use agent_sandbox::config::{Config, Parsed};
use agent_sandbox::sse;
use agent_sandbox::{
    handler, ApiError, Command, CommandArg, CommandError, Endpoint, Group, Method, Response, Server,
};
use serde_json::json;

fn main() -> ExitCode {
    if let Some(code) = agent_sandbox::child_user::run_if_asked() {
        return code;
    }
    let config = match Config::parse(std::env::args().skip(1), |n| std::env::var(n).ok()) {
        Ok(Parsed::Run(config)) => *config,
        Ok(_) => return ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("embed-example: {message}");
            return ExitCode::from(2);
        }
    };
    let server = Server::new(config)
        // The contract's named-command example, as a Rust program registers it.
        .command(
            Command::new("hello", |args| async move {
                let name = args.get("name").and_then(|v| v.as_str()).unwrap_or("World");
                Ok(json!(format!("Hello, {name}!")))
            })
            .description("Say hello.")
            .arg(CommandArg::string("name").default("World")),
        )
        .command(Command::new("_debug_info", |_| async { Ok(json!({"ok": true})) }).hidden(true))
        // Echoes its bound arguments, so tests can see every coercion rule.
        .command(
            Command::new("types", |args| async move {
                Ok(serde_json::Value::Object(args))
            })
            .description("Echo typed arguments.")
            .arg(
                CommandArg::integer("count")
                    .required()
                    .description("How many."),
            )
            .arg(CommandArg::float("ratio").default(0.5))
            .arg(CommandArg::boolean("loud").default(false))
            .arg(CommandArg::string("label")),
        )
        .command(
            Command::new("divide", |args| async move {
                let a = args.get("a").and_then(|v| v.as_i64()).unwrap_or(0);
                let b = args.get("b").and_then(|v| v.as_i64()).unwrap_or(0);
                if b == 0 {
                    return Err(CommandError::new("ZeroDivisionError", "division by zero"));
                }
                Ok(json!(a / b))
            })
            .arg(CommandArg::integer("a").required())
            .arg(CommandArg::integer("b").required()),
        )
        .command(
            Command::new("admin_only", |_| async { Ok(json!("secret")) })
                .scopes(&["example:admin"]),
        )
        .route(
            Method::Get,
            "/hello/{name}",
            Group::Commands,
            handler(|request| async move {
                let name = request.path_param("name").unwrap_or("World").to_string();
                Ok(Response::ok(
                    &json!({"greeting": format!("Hello, {name}!")}),
                ))
            }),
        )
        .endpoint(
            Endpoint::new(
                Method::Get,
                "/open/ping",
                Group::Commands,
                handler(|_| async { Ok(Response::ok(&json!({"pong": true}))) }),
            )
            .auth_required(false),
        )
        .endpoint(
            Endpoint::new(
                Method::Get,
                "/debug/panic",
                Group::Commands,
                handler(|_| async { panic!("deliberate panic for the test suite") }),
            )
            .id("debug_panic"),
        )
        .endpoint(
            Endpoint::new(
                Method::Post,
                "/debug/panic-later",
                Group::Commands,
                handler(|_| async {
                    monoio::time::sleep(Duration::from_millis(10)).await;
                    let items: Vec<u32> = Vec::new();
                    Ok(Response::ok(&items[3]))
                }),
            )
            .id("debug_panic_later"),
        )
        .endpoint(
            Endpoint::new(
                Method::Get,
                "/debug/slow",
                Group::Commands,
                handler(|request| async move {
                    let ms: u64 = request
                        .query("ms")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(1000);
                    monoio::time::sleep(Duration::from_millis(ms)).await;
                    Ok(Response::ok(&json!({"slept_ms": ms})))
                }),
            )
            .id("debug_slow"),
        )
        .endpoint(
            Endpoint::new(
                Method::Get,
                "/debug/events",
                Group::Commands,
                handler(|request| async move {
                    let gap: u64 = request
                        .query("gap_ms")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(1500);
                    let (mut tx, rx) = sse::channel(4);
                    monoio::spawn(async move {
                        for n in 0..2 {
                            if tx.send("tick", &json!({"n": n})).await.is_err() {
                                return;
                            }
                            monoio::time::sleep(Duration::from_millis(gap)).await;
                        }
                        let _ = tx.send("done", &json!({})).await;
                    });
                    Ok(sse::response(rx))
                }),
            )
            .id("debug_events")
            .streaming(true),
        )
        .endpoint(
            Endpoint::new(
                Method::Get,
                "/example/opt-in",
                Group::DevTools,
                handler(|_| async { Ok(Response::ok(&json!({"opted_in": true}))) }),
            )
            .id("example_opt_in")
            .summary("An opt-in endpoint for tests."),
        )
        .endpoint(
            Endpoint::new(
                Method::Get,
                "/example/scoped",
                Group::Commands,
                handler(|_| async {
                    Err::<Response, _>(ApiError::new(
                        418,
                        "ValueError",
                        "unreachable without the scope",
                    ))
                }),
            )
            .id("example_scoped")
            .scopes(&["example:admin"]),
        );
    match server.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("embed-example: {message}");
            ExitCode::from(2)
        }
    }
}
