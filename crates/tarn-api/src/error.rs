//! API errors: a machine-readable [`ErrorCode`] and a sentence for the
//! operator. Every failure a method can answer is an [`ApiError`].

use std::fmt;

use serde::{Deserialize, Serialize};

/// What kind of failure an [`ApiError`] reports; clients branch on this,
/// people read the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The pool, device or object does not exist.
    NotFound,
    /// Something by that name already exists.
    Exists,
    /// The request is malformed or asks for something impossible.
    Invalid,
    /// The daemon or the pool is occupied; retry later.
    Busy,
    /// A device failed.
    Io,
    /// Data is damaged beyond what redundancy can repair.
    Damaged,
    /// An encrypted dataset whose key is not loaded (API 2.2).
    Locked,
    /// A key or passphrase that does not open the key it is given for
    /// (API 2.2).
    WrongKey,
    /// The caller may not do this (a user calling an administrator's
    /// method over HTTPS; API 2.5).
    Forbidden,
    /// A bug or an unexpected state in the daemon. Codes unknown to this
    /// build (from a newer daemon) also read as `internal`.
    #[serde(other)]
    Internal,
}

impl ErrorCode {
    /// The code as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::NotFound => "not_found",
            ErrorCode::Exists => "exists",
            ErrorCode::Invalid => "invalid",
            ErrorCode::Busy => "busy",
            ErrorCode::Io => "io",
            ErrorCode::Damaged => "damaged",
            ErrorCode::Locked => "locked",
            ErrorCode::WrongKey => "wrong_key",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::Internal => "internal",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error answered by the API. The message names the thing, the cause and,
/// where there is one, the fix; it is shown to the operator as is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// Machine-readable class.
    pub code: ErrorCode,
    /// Sentence for the operator.
    pub message: String,
}

impl ApiError {
    /// An error of any code.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
        }
    }

    /// `not_found`: the named thing does not exist.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }

    /// `exists`: the name is taken.
    pub fn exists(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Exists, message)
    }

    /// `invalid`: the request is malformed or impossible.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Invalid, message)
    }

    /// `busy`: try again later.
    pub fn busy(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Busy, message)
    }

    /// `io`: a device failed.
    pub fn io(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Io, message)
    }

    /// `damaged`: data is beyond repair.
    pub fn damaged(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Damaged, message)
    }

    /// `internal`: a bug or unexpected state.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }
}
