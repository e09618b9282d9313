//! The core error type: one variant per stable `code` that JavaScript callers match on.

use std::fmt;

/// Stable error codes. The strings are part of the public contract (docs/CONTRACT.md); never rename one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// A constructor or call option is unknown or out of range.
    InvalidOption,
    /// A key that is not a non-empty string or an array of strings and finite numbers, or is too long.
    InvalidKey,
    /// A wrong argument other than a key or option (a loader that is not a function, ...).
    InvalidArgument,
    /// A value JSON cannot hold.
    ValueNotSerializable,
    /// The cache was closed.
    Closed,
    /// A load ran longer than its loadTimeout.
    LoadTimeout,
    /// Redis could not take a change (`set`, `delete`).
    Redis,
}

impl ErrorCode {
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidOption => "ERR_INVALID_OPTION",
            ErrorCode::InvalidKey => "ERR_INVALID_KEY",
            ErrorCode::InvalidArgument => "ERR_INVALID_ARGUMENT",
            ErrorCode::ValueNotSerializable => "ERR_VALUE_NOT_SERIALIZABLE",
            ErrorCode::Closed => "ERR_CLOSED",
            ErrorCode::LoadTimeout => "ERR_LOAD_TIMEOUT",
            ErrorCode::Redis => "ERR_REDIS",
        }
    }
}

/// An error with a stable code and a message meant for the person reading the stack trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub code: ErrorCode,
    pub message: String,
}

impl Error {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Error {
            code,
            message: message.into(),
        }
    }

    /// An invalid option, always naming the option so the user can find it.
    pub fn invalid_option(name: &str, why: impl fmt::Display) -> Self {
        Error::new(ErrorCode::InvalidOption, format!("option `{name}` {why}"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;
