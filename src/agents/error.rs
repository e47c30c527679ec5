//! Why a domain operation of the agents surface was refused, in domain terms; the
//! routes word it in OpenAI's envelope.

use super::records::StoreError;
use super::runtime::Runtime;

#[derive(Debug)]
pub enum AgentError {
    /// The store refused an operation on `object` `id`, which the request named in
    /// field `param`.
    Store {
        error: StoreError,
        object: &'static str,
        id: String,
        param: &'static str,
    },
    /// A value the request cannot have: 400, naming `param`.
    Invalid { param: String, message: String },
    /// A value this server cannot honour (a tool codex has no equivalent of, a hosted
    /// environment's packages): 400 `unsupported_parameter`, naming `param`.
    Unsupported { param: String, message: String },
    /// Another refusal with its own status and code (an idempotency key in use, a
    /// setup command that failed).
    Rejected {
        status: u16,
        code: &'static str,
        param: Option<String>,
        message: String,
    },
    /// A file operation on a caller's path (named by `param`) failed.
    File {
        error: crate::fs::FsError,
        param: String,
    },
    /// The conversation `id` (named by `param`) is running a turn.
    Busy { id: String, param: &'static str },
    /// A runtime declared without a local backend.
    NotImplemented(Runtime),
    /// The runtime's CLI is not on the children's `PATH`.
    NotInstalled(Runtime),
    /// The turn could not start: the server's failure.
    Failed(String),
}

impl AgentError {
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> AgentError {
        AgentError::Invalid {
            param: param.into(),
            message: message.into(),
        }
    }

    /// The field a refusal names, if any.
    pub fn param(&self) -> Option<&str> {
        match self {
            AgentError::Store { param, .. } => Some(param),
            AgentError::Invalid { param, .. }
            | AgentError::Unsupported { param, .. }
            | AgentError::File { param, .. } => Some(param),
            AgentError::Rejected { param, .. } => param.as_deref(),
            _ => None,
        }
    }

    /// A store refusal about `object` `id`, named by `param`.
    pub fn store(
        object: &'static str,
        id: &str,
        param: &'static str,
    ) -> impl FnOnce(StoreError) -> AgentError {
        let id = id.to_string();
        move |error| AgentError::Store {
            error,
            object,
            id,
            param,
        }
    }
}

/// A store error of a transaction that names nothing more precise.
impl From<StoreError> for AgentError {
    fn from(error: StoreError) -> AgentError {
        AgentError::Store {
            error,
            object: "object",
            id: String::new(),
            param: "id",
        }
    }
}
