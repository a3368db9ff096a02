//! Exports: which filesystem is served under which path, to which client
//! networks, with which options; and the object-safe [`ExportFs`] trait
//! that lets filesystems of different backends be served side by side.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

pub use tarn_conn::{IpNet, IpNetError};

use tarn_fs::Cred;

/// The filesystem operations the NFS server needs: tarn-fs's object-safe
/// face of `Fs`, so exports over different backends live in one list.
pub use tarn_fs::DynFs as ExportFs;

/// The uid and gid of `nobody`, the default anonymous identity.
pub const NOBODY: u32 = 65534;

/// One exported filesystem: its root is served as `path`.
#[derive(Clone)]
pub struct Export {
    /// The path clients mount, e.g. `/tank/photos` (no trailing slash).
    pub path: String,
    /// The filesystem; its root directory is the export's root.
    pub fs: Arc<dyn ExportFs>,
    /// Refuse every change with NFS3ERR_ROFS.
    pub read_only: bool,
    /// Networks whose clients may mount and use the export. Empty: no
    /// client at all.
    pub clients: Vec<IpNet>,
    /// Map uid 0 (and gid 0) to the anonymous ids.
    pub root_squash: bool,
    /// Map every user to the anonymous ids.
    pub all_squash: bool,
    /// Anonymous uid (squashed users and AUTH_NONE calls).
    pub anon_uid: u32,
    /// Anonymous gid.
    pub anon_gid: u32,
}

impl fmt::Debug for Export {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Export")
            .field("path", &self.path)
            .field("read_only", &self.read_only)
            .field("clients", &self.clients)
            .field("root_squash", &self.root_squash)
            .field("all_squash", &self.all_squash)
            .field("anon_uid", &self.anon_uid)
            .field("anon_gid", &self.anon_gid)
            .finish_non_exhaustive()
    }
}

impl Export {
    /// An export of `fs` as `path` to `clients`, with the usual defaults:
    /// read-write, `root_squash`, no `all_squash`, anonymous ids 65534.
    pub fn new(path: impl Into<String>, fs: Arc<dyn ExportFs>, clients: Vec<IpNet>) -> Export {
        Export {
            path: path.into(),
            fs,
            read_only: false,
            clients,
            root_squash: true,
            all_squash: false,
            anon_uid: NOBODY,
            anon_gid: NOBODY,
        }
    }

    /// True if a client at `ip` may use this export.
    pub fn allows(&self, ip: IpAddr) -> bool {
        self.clients.iter().any(|n| n.contains(ip))
    }

    /// The credential a call runs with after squashing: `None` (AUTH_NONE)
    /// and squashed users become the anonymous ids.
    pub fn cred_for(&self, user: Option<&Cred>) -> Cred {
        let anon = Cred::user(self.anon_uid, self.anon_gid);
        match user {
            None => anon,
            Some(_) if self.all_squash => anon,
            Some(c) if self.root_squash && c.uid == 0 => anon,
            Some(c) => {
                let mut c = c.clone();
                if self.root_squash {
                    if c.gid == 0 {
                        c.gid = self.anon_gid;
                    }
                    for g in &mut c.groups {
                        if *g == 0 {
                            *g = self.anon_gid;
                        }
                    }
                }
                c
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squash() {
        let fs = Arc::new(tarn_fs::Fs::mount(tarn_fs::testing::MemBackend::new()).unwrap());
        let mut e = Export::new("/x", fs, vec![]);
        let root = Cred::root();
        let user = Cred {
            uid: 5,
            gid: 0,
            groups: vec![0, 7],
        };
        assert_eq!(e.cred_for(Some(&root)), Cred::user(NOBODY, NOBODY));
        assert_eq!(e.cred_for(Some(&user)).groups, vec![NOBODY, 7]);
        assert_eq!(e.cred_for(None), Cred::user(NOBODY, NOBODY));
        e.root_squash = false;
        assert_eq!(e.cred_for(Some(&root)), root);
        e.all_squash = true;
        e.anon_uid = 9;
        e.anon_gid = 8;
        assert_eq!(e.cred_for(Some(&user)), Cred::user(9, 8));
    }
}
