//! Who is at the other end of the admin socket. Both ends check: the
//! daemon serves only its own user and root, and the `tarn` command talks
//! only to a daemon run by its own user or root, so a socket another local
//! user put where the command looks (a `/tmp` folder made first) never
//! receives a password or a passphrase.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

/// The uid of the process at the other end of `stream` (as it was when
/// the connection was made, or when the listening socket was bound).
pub fn peer_uid(stream: &UnixStream) -> io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given, and
    // the descriptor is open for the duration of the call.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// This process's effective uid.
pub fn own_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether a peer of uid `peer` may be trusted by a process of uid `own`
/// on the admin socket: the same user, or root.
pub fn allowed(peer: u32, own: u32) -> bool {
    peer == own || peer == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_pair_names_this_process_and_only_its_user_or_root_is_allowed() {
        let (a, _b) = UnixStream::pair().unwrap();
        assert_eq!(peer_uid(&a).unwrap(), own_uid());
        assert!(allowed(1000, 1000));
        assert!(allowed(0, 1000));
        assert!(!allowed(1001, 1000));
        assert!(!allowed(1000, 0));
    }
}
