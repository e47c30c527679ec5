//! Unit tests' server: the builtin routes over a temporary base directory, assembled as
//! `Server::run` assembles them (the same `AppState::build`) and called in-process
//! through [`InProcess`], so a test drives the real dispatcher without a socket.
//! Handlers need a worker's runtime: run the test's body in [`run`].
//!
//! ```ignore
//! let app = TestApp::builder().token("secret").build();
//! run(async {
//!     assert_eq!(app.get("/files/list?path=.").await.status, 401);
//! });
//! ```

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::app::client::{Answer, InProcess, Request};
use crate::app::state::Extras;
use crate::app::AppState;
use crate::config::Config;
use crate::runtime::blocking::BlockingPool;
use crate::runtime::IoDriver;

/// The driver unit tests run on: epoll works wherever the tests do (io_uring may be
/// refused by a sandbox's seccomp profile).
const DRIVER: IoDriver = IoDriver::Epoll;

/// The repository's root: the library is the `core/` package of the workspace, so its
/// manifest directory is one below it; fixtures, `scripts/` and `.tools/` live at the root.
pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("core/ has a parent")
}

/// Runs `future` on a worker's runtime (timers, the blocking pool).
pub fn run<F: Future>(future: F) -> F::Output {
    let pool = BlockingPool::new(4, Duration::from_secs(5));
    crate::runtime::block_on(DRIVER, pool, future).expect("a monoio runtime")
}

/// How a [`TestApp`] is configured before it is built.
pub struct Builder {
    config: Config,
    policy: Option<String>,
}

impl Builder {
    /// `ABX_SERVER_TOKEN`.
    pub fn token(mut self, token: &str) -> Builder {
        self.config.token = Some(token.to_string());
        self
    }

    /// A policy document (YAML or JSON), as `ABX_SERVER_POLICY` names one.
    pub fn policy(mut self, document: &str) -> Builder {
        self.policy = Some(document.to_string());
        self
    }

    /// Any other setting.
    pub fn config(mut self, change: impl FnOnce(&mut Config)) -> Builder {
        change(&mut self.config);
        self
    }

    pub fn build(mut self) -> TestApp {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let root = std::env::temp_dir().join(format!(
            "abx-unit-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let base = root.join("base");
        std::fs::create_dir_all(&base).expect("a temporary base directory");
        self.config.base_dir = base.clone();
        // The agents store lives here too, not in the user's state directory.
        self.config.state_dir = root.join("state");
        if let Some(document) = &self.policy {
            let path = root.join("policy.yaml");
            std::fs::write(&path, document).expect("the policy document");
            self.config.policy_path = Some(path);
        }
        let state = AppState::build(
            self.config,
            crate::routes::builtin_endpoints(),
            DRIVER,
            Extras {
                registrars: {
                    let mut registrars = crate::routes::builtin_registrars();
                    registrars.push(crate::routes::commands::registrar(Vec::new(), None));
                    registrars
                },
                ..Extras::default()
            },
        )
        .unwrap_or_else(|e| panic!("the state does not build: {e}"));
        let state = Arc::new(state);
        TestApp {
            client: InProcess::new(state.clone()),
            state,
            root,
            base,
        }
    }
}

/// The builtin routes over a temporary base directory, removed on drop.
pub struct TestApp {
    client: InProcess,
    state: Arc<AppState>,
    root: PathBuf,
    base: PathBuf,
}

/// An answer with its body collected.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

impl TestApp {
    /// Default settings: local mode (no token), the default groups.
    pub fn new() -> TestApp {
        TestApp::builder().build()
    }

    pub fn builder() -> Builder {
        Builder {
            config: Config::default(),
            policy: None,
        }
    }

    /// The base directory callers' paths are confined to.
    pub fn base(&self) -> &Path {
        &self.base
    }

    /// The dispatcher for requests the server makes itself as identity `id`.
    pub fn acting_as(&self, id: &str) -> InProcess {
        InProcess::acting_as(self.state.clone(), id)
    }

    /// Serves `request`; the answer's body is not taken yet (for streams).
    pub async fn send(&self, request: Request) -> Answer {
        self.client
            .send(request)
            .await
            .expect("an answer, as a socket would have one")
    }

    /// Serves a request and collects the whole answer.
    pub async fn request(
        &self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Reply {
        let mut request = Request::new(method, target).body(body);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let answer = self.send(request).await;
        let (status, headers) = (answer.status, answer.headers.clone());
        let body = answer.body(usize::MAX).await.expect("the whole body");
        Reply {
            status,
            headers,
            body,
        }
    }

    pub async fn get(&self, target: &str) -> Reply {
        self.request("GET", target, &[], b"").await
    }

    pub async fn post(&self, target: &str, body: &Value) -> Reply {
        let body = body.to_string();
        self.request(
            "POST",
            target,
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        )
        .await
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
