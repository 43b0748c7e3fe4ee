//! Error codes that cross the wire. Services answer failed requests with an
//! [`ErrorCode`] and a message naming the entry, node or target involved. The
//! FUSE crate is the one place that turns codes into errno values.

use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ErrorCode {
    NotFound,
    Exists,
    NotDir,
    IsDir,
    NotEmpty,
    Invalid,
    NameTooLong,
    NotPermitted,
    AccessDenied,
    NoSpace,
    NoData,
    Range,
    CrossDevice,
    Io,
    TimedOut,
    Unavailable,
    Busy,
    NotSupported,
    TooManyLinks,
    Loop,
    Protocol,
    Auth,
    Internal,
    /// A user's or group's quota is used up (EDQUOT).
    Quota,
}

impl ErrorCode {
    pub fn as_str(&self) -> &'static str {
        match self {
            ErrorCode::NotFound => "not found",
            ErrorCode::Exists => "already exists",
            ErrorCode::NotDir => "not a directory",
            ErrorCode::IsDir => "is a directory",
            ErrorCode::NotEmpty => "directory not empty",
            ErrorCode::Invalid => "invalid argument",
            ErrorCode::NameTooLong => "name too long",
            ErrorCode::NotPermitted => "operation not permitted",
            ErrorCode::AccessDenied => "permission denied",
            ErrorCode::NoSpace => "no space left",
            ErrorCode::NoData => "no such attribute",
            ErrorCode::Range => "result too large",
            ErrorCode::CrossDevice => "cross-device link",
            ErrorCode::Io => "I/O error",
            ErrorCode::TimedOut => "timed out",
            ErrorCode::Unavailable => "service unavailable",
            ErrorCode::Busy => "busy",
            ErrorCode::NotSupported => "not supported",
            ErrorCode::TooManyLinks => "too many links",
            ErrorCode::Loop => "too many levels of symbolic links",
            ErrorCode::Protocol => "protocol error",
            ErrorCode::Auth => "authentication failed",
            ErrorCode::Internal => "internal error",
            ErrorCode::Quota => "disk quota exceeded",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error with its code and a human message (which names what failed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct FsError {
    pub code: ErrorCode,
    pub message: String,
}

impl FsError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        FsError { code, message: message.into() }
    }
}

pub type FsResult<T> = Result<T, FsError>;

/// Shorthand: `fs_err!(NotFound, "entry {} in {}", name, dir)`.
#[macro_export]
macro_rules! fs_err {
    ($code:ident, $($arg:tt)*) => {
        $crate::error::FsError::new($crate::error::ErrorCode::$code, format!($($arg)*))
    };
}
