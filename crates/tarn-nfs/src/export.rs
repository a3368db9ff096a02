//! Exports: which filesystem is served under which path, to which client
//! networks, with which options; and the object-safe [`ExportFs`] trait
//! that lets filesystems of different backends be served side by side.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;

use tarn_fs::Cred;

/// An IPv4 or IPv6 network in CIDR form (`192.168.1.0/24`, `fd00::/8`); a
/// bare address means that one host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

/// A CIDR string that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid network {0:?} (want ADDRESS or ADDRESS/PREFIX)")]
pub struct IpNetError(pub String);

impl IpNet {
    /// The network of `addr` with `prefix` bits; None if the prefix is
    /// longer than the address.
    pub fn new(addr: IpAddr, prefix: u8) -> Option<IpNet> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (prefix <= max).then_some(IpNet { addr, prefix })
    }

    /// Every IPv4 address (`0.0.0.0/0`).
    pub fn any_v4() -> IpNet {
        IpNet {
            addr: IpAddr::from([0u8; 4]),
            prefix: 0,
        }
    }

    /// Every IPv6 address (`::/0`).
    pub fn any_v6() -> IpNet {
        IpNet {
            addr: IpAddr::from([0u8; 16]),
            prefix: 0,
        }
    }

    /// True if `ip` is inside the network. IPv4-mapped IPv6 addresses
    /// (`::ffff:a.b.c.d`, as a dual-stack socket reports IPv4 clients)
    /// count as their IPv4 address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for IpNet {
    type Err = IpNetError;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        let bad = || IpNetError(s.to_string());
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a.trim().parse().map_err(|_| bad())?;
        let prefix = match p {
            Some(p) => p.trim().parse::<u8>().map_err(|_| bad())?,
            None => {
                if addr.is_ipv4() {
                    32
                } else {
                    128
                }
            }
        };
        IpNet::new(addr, prefix).ok_or_else(bad)
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

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
    fn cidr() {
        let n: IpNet = "192.168.1.0/24".parse().unwrap();
        assert!(n.contains("192.168.1.77".parse().unwrap()));
        assert!(!n.contains("192.168.2.1".parse().unwrap()));
        assert!(n.contains("::ffff:192.168.1.5".parse().unwrap()));
        assert!(!n.contains("fd00::1".parse().unwrap()));
        let h: IpNet = "10.0.0.1".parse().unwrap();
        assert!(h.contains("10.0.0.1".parse().unwrap()));
        assert!(!h.contains("10.0.0.2".parse().unwrap()));
        let v6: IpNet = "fd00::/8".parse().unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()));
        assert!(!v6.contains("fe80::1".parse().unwrap()));
        assert!(IpNet::any_v4().contains("1.2.3.4".parse().unwrap()));
        assert!(IpNet::any_v6().contains("::1".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<IpNet>().is_err());
        assert!("nonsense".parse::<IpNet>().is_err());
        assert_eq!(n.to_string(), "192.168.1.0/24");
    }

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
