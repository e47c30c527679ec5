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
