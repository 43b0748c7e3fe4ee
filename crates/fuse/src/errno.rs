//! HiveFS error codes → errno.

use hivefs_fusewire::Errno;
use hivefs_types::error::{ErrorCode, FsError};

pub fn errno(e: &FsError) -> Errno {
    let code = match e.code {
        ErrorCode::NotFound => libc::ENOENT,
        ErrorCode::Exists => libc::EEXIST,
        ErrorCode::NotDir => libc::ENOTDIR,
        ErrorCode::IsDir => libc::EISDIR,
        ErrorCode::NotEmpty => libc::ENOTEMPTY,
        ErrorCode::Invalid => libc::EINVAL,
        ErrorCode::NameTooLong => libc::ENAMETOOLONG,
        ErrorCode::NotPermitted => libc::EPERM,
        ErrorCode::AccessDenied => libc::EACCES,
        ErrorCode::NoSpace => libc::ENOSPC,
        ErrorCode::Quota => libc::EDQUOT,
        ErrorCode::NoData => libc::ENODATA,
        ErrorCode::Range => libc::ERANGE,
        ErrorCode::CrossDevice => libc::EXDEV,
        ErrorCode::TimedOut => libc::ETIMEDOUT,
        ErrorCode::Busy => libc::EBUSY,
        ErrorCode::NotSupported => libc::EOPNOTSUPP,
        ErrorCode::TooManyLinks => libc::EMLINK,
        ErrorCode::Loop => libc::ELOOP,
        ErrorCode::Unavailable | ErrorCode::Io | ErrorCode::Protocol | ErrorCode::Auth | ErrorCode::Internal => {
            libc::EIO
        }
        _ => libc::EIO,
    };
    Errno::from_i32(code)
}
