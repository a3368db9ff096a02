//! Targets: the IQN-named devices a server offers, and the table a
//! connection looks names up in.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;

use tarn_conn::IpNet;
use tarn_vol::Device;

use crate::lu::LuState;
use crate::Error;

/// CHAP credentials: a user name and its secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Chap {
    /// The name (`CHAP_N`), 1 to 255 bytes.
    pub user: String,
    /// The secret, 12 to 255 bytes (RFC 7143 asks for at least 96 bits
    /// when the secret is not random; shorter ones are refused).
    pub secret: String,
}

impl std::fmt::Debug for Chap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chap")
            .field("user", &self.user)
            .field("secret", &"<hidden>")
            .finish()
    }
}

impl Chap {
    /// Credentials `user` / `secret`.
    pub fn new(user: impl Into<String>, secret: impl Into<String>) -> Chap {
        Chap {
            user: user.into(),
            secret: secret.into(),
        }
    }

    pub(crate) fn check(&self, what: &str) -> Result<(), Error> {
        if self.user.is_empty() || self.user.len() > 255 || self.user.contains('\0') {
            return Err(Error::Config(format!(
                "{what}: the CHAP user must be 1 to 255 bytes without NUL"
            )));
        }
        if !(12..=255).contains(&self.secret.len()) {
            return Err(Error::Config(format!(
                "{what}: the CHAP secret must be 12 to 255 bytes"
            )));
        }
        Ok(())
    }
}

/// One target: an iSCSI name (`iqn.…`) and the device it serves as LUN 0.
#[derive(Clone)]
pub struct IscsiTarget {
    /// The iSCSI name: `iqn.`, `eui.` or `naa.` form, lower case, at most
    /// 223 bytes, unique per server.
    pub name: String,
    /// Sent as `TargetAlias` at login, if set.
    pub alias: Option<String>,
    /// The device served as LUN 0.
    pub device: Arc<dyn Device>,
    /// Refuse writes even if the device takes them. A read-only device
    /// is read-only regardless.
    pub read_only: bool,
    /// When set, initiators must log in with CHAP as this user.
    pub chap: Option<Chap>,
    /// The target's own credentials, sent when an initiator asks the
    /// target to authenticate itself (mutual CHAP). Without them such a
    /// login fails.
    pub mutual_chap: Option<Chap>,
    /// Initiator names (`InitiatorName`) that may log in, compared
    /// without regard to case; empty: any.
    pub initiators: Vec<String>,
    /// Networks whose clients may see and use the target; to any other
    /// client it does not exist (not listed by discovery, "not found" at
    /// login). Empty: nobody.
    pub clients: Vec<IpNet>,
}

impl IscsiTarget {
    /// A writable target of `device` named `name`, without CHAP, open to
    /// every initiator and client address.
    pub fn new(name: impl Into<String>, device: Arc<dyn Device>) -> IscsiTarget {
        IscsiTarget {
            name: name.into(),
            alias: None,
            device,
            read_only: false,
            chap: None,
            mutual_chap: None,
            initiators: Vec::new(),
            clients: vec![IpNet::any_v4(), IpNet::any_v6()],
        }
    }

    /// True if a client at `ip` may see and use the target.
    pub fn allows(&self, ip: IpAddr) -> bool {
        self.clients.iter().any(|n| n.contains(ip))
    }

    /// True if the initiator named `name` may log in.
    pub fn admits(&self, initiator: &str) -> bool {
        self.initiators.is_empty()
            || self
                .initiators
                .iter()
                .any(|i| i.eq_ignore_ascii_case(initiator))
    }

    /// Checks the target on its own: a valid name, valid credentials, a
    /// device of whole 512-byte sectors. `set_targets` refuses a list
    /// with a target that fails this, so callers that build targets from
    /// stored records check each one first and leave out the bad ones.
    pub fn check(&self) -> Result<(), Error> {
        if !valid_name(&self.name) {
            return Err(Error::Config(format!(
                "target name {:?}: must be an iqn., eui. or naa. name in lower case, at most 223 bytes",
                self.name
            )));
        }
        if let Some(a) = &self.alias {
            if a.len() > 255 || a.contains('\0') {
                return Err(Error::Config(format!(
                    "target {:?}: the alias must be at most 255 bytes without NUL",
                    self.name
                )));
            }
        }
        for c in self.chap.iter().chain(self.mutual_chap.iter()) {
            c.check(&format!("target {:?}", self.name))?;
        }
        if let (Some(a), Some(b)) = (&self.chap, &self.mutual_chap) {
            if a.secret == b.secret {
                return Err(Error::Config(format!(
                    "target {:?}: the mutual CHAP secret must differ from the initiator's",
                    self.name
                )));
            }
        }
        if self.mutual_chap.is_some() && self.chap.is_none() {
            return Err(Error::Config(format!(
                "target {:?}: mutual CHAP needs CHAP",
                self.name
            )));
        }
        let bs = self.device.block_size();
        if bs == 0 || !self.device.size().is_multiple_of(512) {
            return Err(Error::Config(format!(
                "target {:?}: the device size must be a multiple of 512 bytes",
                self.name
            )));
        }
        Ok(())
    }

    /// True if writes are refused (by the target or by the device).
    pub fn is_read_only(&self) -> bool {
        self.read_only || self.device.read_only()
    }
}

impl std::fmt::Debug for IscsiTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IscsiTarget")
            .field("name", &self.name)
            .field("size", &self.device.size())
            .field("read_only", &self.is_read_only())
            .field("chap", &self.chap.is_some())
            .finish()
    }
}

/// True if `name` is a valid iSCSI name as this server accepts it.
pub fn valid_name(name: &str) -> bool {
    let prefixed = ["iqn.", "eui.", "naa."].iter().any(|p| name.starts_with(p));
    prefixed
        && name.len() > 4
        && name.len() <= 223
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b".-:".contains(&b))
}

/// The targets among `targets` (by index) whose mutual CHAP secret is a
/// secret some target of the list takes from initiators. RFC 7143
/// (section 12.1.3) forbids it: an initiator that knows only its own
/// secret could log in to the one target, present the other's challenge
/// as its mutual challenge, and hand the answer to the other target.
/// [`IscsiTarget::check`] refuses it within one target; this looks
/// across them. Callers leave these targets out (or refuse the list).
pub fn reflected(targets: &[IscsiTarget]) -> Vec<usize> {
    let taken: HashSet<&str> = targets
        .iter()
        .filter_map(|t| t.chap.as_ref())
        .map(|c| c.secret.as_str())
        .collect();
    (0..targets.len())
        .filter(|&i| {
            targets[i]
                .mutual_chap
                .as_ref()
                .is_some_and(|m| taken.contains(m.secret.as_str()))
        })
        .collect()
}

/// The target list as connections see it, swapped whole by
/// `set_targets`.
pub(crate) struct Table {
    pub(crate) targets: Vec<Arc<IscsiTarget>>,
    /// The targets' logical unit states, kept alive (reservations
    /// included) while the targets are listed.
    _units: Vec<Arc<LuState>>,
}

impl Table {
    /// Checks `targets` (names valid and unique, credentials valid).
    pub(crate) fn new(targets: Vec<IscsiTarget>) -> Result<Table, Error> {
        let mut seen = HashSet::new();
        for t in &targets {
            t.check()?;
            if !seen.insert(t.name.as_str()) {
                return Err(Error::Config(format!(
                    "target {:?} is listed twice",
                    t.name
                )));
            }
        }
        if let Some(&i) = reflected(&targets).first() {
            return Err(Error::Config(format!(
                "target {:?}: its mutual CHAP secret is also a secret an initiator logs in \
                 with (to this or another target), which would let a login to one answer \
                 for the other",
                targets[i].name
            )));
        }
        Ok(Table {
            _units: targets.iter().map(|t| LuState::of(&t.device)).collect(),
            targets: targets.into_iter().map(Arc::new).collect(),
        })
    }

    /// The targets a client at `ip` may see.
    pub(crate) fn visible_to(&self, ip: IpAddr) -> Vec<Arc<IscsiTarget>> {
        self.targets
            .iter()
            .filter(|t| t.allows(ip))
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tarn_vol::testing::MemDevice;

    fn dev() -> Arc<dyn Device> {
        Arc::new(MemDevice::new(1 << 20, 4096))
    }

    #[test]
    fn names_and_credentials_are_checked() {
        assert!(valid_name("iqn.2024-01.org.example:disk1"));
        assert!(valid_name("eui.0123456789abcdef"));
        assert!(!valid_name("iqn."));
        assert!(!valid_name("IQN.2024-01.org.example:d"));
        assert!(!valid_name("iqn.2024-01.org.example:D"));
        assert!(!valid_name("disk"));
        assert!(!valid_name(&format!("iqn.{}", "a".repeat(220))));
        let n = "iqn.2024-01.org.example:a";
        assert!(Table::new(vec![IscsiTarget::new(n, dev())]).is_ok());
        assert!(Table::new(vec![IscsiTarget::new(n, dev()), IscsiTarget::new(n, dev())]).is_err());
        let mut t = IscsiTarget::new(n, dev());
        t.chap = Some(Chap::new("u", "short"));
        assert!(Table::new(vec![t.clone()]).is_err());
        t.chap = Some(Chap::new("u", "long enough secret"));
        assert!(Table::new(vec![t.clone()]).is_ok());
        t.mutual_chap = Some(Chap::new("t", "long enough secret"));
        assert!(
            Table::new(vec![t.clone()]).is_err(),
            "same secret both ways"
        );
        t.mutual_chap = Some(Chap::new("t", "another long secret"));
        assert!(Table::new(vec![t.clone()]).is_ok());
        t.chap = None;
        assert!(Table::new(vec![t]).is_err(), "mutual without one-way");
        assert!(!format!("{:?}", Chap::new("u", "secret")).contains("secret\""));
    }

    #[test]
    fn a_mutual_secret_is_never_an_initiators_secret_anywhere() {
        let mut a = IscsiTarget::new("iqn.2024-01.x:a", dev());
        a.chap = Some(Chap::new("alice", "alice's long secret"));
        a.mutual_chap = Some(Chap::new("nas", "the target's secret"));
        let mut b = IscsiTarget::new("iqn.2024-01.x:b", dev());
        b.chap = Some(Chap::new("nas", "the target's secret"));
        let c = IscsiTarget::new("iqn.2024-01.x:c", dev());
        assert_eq!(reflected(&[a.clone(), b.clone(), c.clone()]), [0]);
        assert!(Table::new(vec![a.clone(), b.clone(), c.clone()]).is_err());
        assert!(Table::new(vec![a.clone(), c.clone()]).is_ok());
        b.chap = Some(Chap::new("nas", "some other secret"));
        assert!(reflected(&[a.clone(), b.clone()]).is_empty());
        assert!(Table::new(vec![a, b, c]).is_ok());
    }

    #[test]
    fn visibility_and_initiator_lists() {
        let mut lan = IscsiTarget::new("iqn.2024-01.x:lan", dev());
        lan.clients = vec!["192.168.1.0/24".parse().unwrap()];
        lan.initiators = vec!["iqn.1993-08.org.debian:01:abc".into()];
        let t = Table::new(vec![lan, IscsiTarget::new("iqn.2024-01.x:all", dev())]).unwrap();
        let names = |ip: &str| -> Vec<String> {
            t.visible_to(ip.parse().unwrap())
                .iter()
                .map(|x| x.name.clone())
                .collect()
        };
        assert_eq!(
            names("192.168.1.4"),
            ["iqn.2024-01.x:lan", "iqn.2024-01.x:all"]
        );
        assert_eq!(names("10.0.0.1"), ["iqn.2024-01.x:all"]);
        assert!(t.targets[0].admits("IQN.1993-08.org.debian:01:ABC"));
        assert!(!t.targets[0].admits("iqn.other"));
        assert!(t.targets[1].admits("anything"));
    }
}
