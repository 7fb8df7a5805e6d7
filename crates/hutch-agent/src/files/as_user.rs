//! File operations as a user of the sandbox (`?user=` on read and write): the blocking
//! thread that runs the operation switches its filesystem ids (fsuid, fsgid) and
//! supplementary groups to the user's for the operation, then back. The kernel then checks
//! access as that user, and what the operation creates (the file, missing parents) is the
//! user's, with the user's primary group. Only opening (and creating) runs as the user: the
//! bytes are then moved through the open file.

use crate::error::{Failure, Result};
use crate::passwd::{self, Account};
use crate::sys::{self, FsIdentity};

/// The account named by `user` (a name or a numeric uid), from the sandbox's own
/// `/etc/passwd` and `/etc/group`. Blocking.
pub fn account(user: &str) -> Result<Account> {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let group = std::fs::read_to_string("/etc/group").unwrap_or_default();
    passwd::resolve(user, &passwd, &group).map_err(|e| Failure::BadRequest(e.to_string()))
}

/// Run `op` on this thread with file access as `account` (as the agent itself when `None`),
/// restoring the thread's identity afterwards. Blocking.
pub fn run_as<T>(account: Option<&Account>, op: impl FnOnce() -> Result<T>) -> Result<T> {
    let Some(account) = account else {
        return op();
    };
    let saved = sys::thread_fs_identity()
        .map_err(|e| Failure::Internal(format!("reading this thread's ids: {e}")))?;
    let wanted = FsIdentity {
        uid: account.uid,
        gid: account.gid,
        groups: account.groups.clone(),
    };
    if let Err(e) = sys::set_thread_fs_identity(&wanted) {
        let _ = sys::set_thread_fs_identity(&saved);
        return Err(Failure::Internal(format!(
            "acting as user {}: {e}",
            account.name
        )));
    }
    let result = op();
    if let Err(e) = sys::set_thread_fs_identity(&saved) {
        // Going back to root cannot fail while the agent keeps CAP_SETUID and CAP_SETGID;
        // if it did, this pool thread's later file calls would be refused, never widened.
        crate::log::log!("restoring a file thread's ids failed: {e}");
    }
    result
}
