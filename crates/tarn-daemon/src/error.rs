//! The daemon's own errors: why it could not start or run. What a request
//! fails with is an [`ApiError`]; this is for the node around it (the
//! socket, the state directory, the servers).

use std::io;

use tarn_api::ApiError;

/// Why the daemon (or the demo) could not start or keep running. Each
/// message names the thing, the cause and the fix; a cause below it, when
/// there is one, is its `source`.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// A refusal or failure explained in full by its message.
    #[error("{0}")]
    Message(String),
    /// An I/O failure, with what was being done.
    #[error("{context}")]
    Io {
        /// What the daemon was doing, and what to do about it.
        context: String,
        /// The system's error.
        #[source]
        source: io::Error,
    },
    /// An I/O failure that speaks for itself.
    #[error(transparent)]
    Os(#[from] io::Error),
    /// A failure of an API call the daemon made of itself (the demo).
    #[error(transparent)]
    Api(#[from] ApiError),
    /// Another daemon error, with what was being done when it happened.
    #[error("{context}")]
    Context {
        /// What the daemon was doing, and what to do about it.
        context: String,
        /// The error underneath.
        #[source]
        source: Box<DaemonError>,
    },
}

impl DaemonError {
    /// A refusal or failure explained by `message` alone.
    pub fn msg(message: impl Into<String>) -> Self {
        DaemonError::Message(message.into())
    }

    /// Puts what was being done in front of this error.
    pub fn context(self, context: impl Into<String>) -> Self {
        DaemonError::Context {
            context: context.into(),
            source: Box::new(self),
        }
    }
}

/// `Result` with a [`DaemonError`].
pub type Result<T, E = DaemonError> = std::result::Result<T, E>;

/// Adds what was being done to an I/O error, as [`DaemonError::Io`].
pub trait IoContext<T> {
    /// Wraps the error with `context()`, computed only on failure.
    fn io_context<C: Into<String>>(self, context: impl FnOnce() -> C) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn io_context<C: Into<String>>(self, context: impl FnOnce() -> C) -> Result<T> {
        self.map_err(|source| DaemonError::Io {
            context: context().into(),
            source,
        })
    }
}
