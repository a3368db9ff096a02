//! Exports: the named devices a server offers, and the table a
//! connection looks names up in.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;

use tarn_conn::IpNet;

use tarn_vol::Device;

use crate::proto::MAX_STRING;
use crate::Error;

/// One export: a name clients ask for (`nbd://host/NAME`) and the device
/// behind it.
#[derive(Clone)]
pub struct NbdExport {
    /// The name, 1 to 4096 bytes of UTF-8 without NUL, unique per server.
    pub name: String,
    /// Shown to clients by `NBD_OPT_LIST` and `NBD_INFO_DESCRIPTION`.
    pub description: Option<String>,
    /// The device served.
    pub device: Arc<dyn Device>,
    /// Refuse writes even if the device takes them (a read-only share of
    /// a writable volume). A read-only device is read-only regardless.
    pub read_only: bool,
    /// Networks whose clients may see and use the export; to any other
    /// client it does not exist (not listed, `NBD_REP_ERR_UNKNOWN`).
    /// Empty: nobody.
    pub clients: Vec<IpNet>,
}

impl NbdExport {
    /// A writable export of `device` named `name`, without description,
    /// open to every client address.
    pub fn new(name: impl Into<String>, device: Arc<dyn Device>) -> NbdExport {
        NbdExport {
            name: name.into(),
            description: None,
            device,
            read_only: false,
            clients: vec![IpNet::any_v4(), IpNet::any_v6()],
        }
    }

    /// True if a client at `ip` may see and use the export.
    pub fn allows(&self, ip: IpAddr) -> bool {
        self.clients.iter().any(|n| n.contains(ip))
    }

    /// True if writes are refused (by the export or by the device).
    pub fn is_read_only(&self) -> bool {
        self.read_only || self.device.read_only()
    }
}

impl std::fmt::Debug for NbdExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdExport")
            .field("name", &self.name)
            .field("description", &self.description)
            .field("size", &self.device.size())
            .field("read_only", &self.is_read_only())
            .finish()
    }
}

/// The export list as connections see it: swapped whole by
/// `set_exports`, so a connection that cloned the `Arc` keeps a
/// consistent view (and its device) however the list changes.
pub(crate) struct Table {
    pub(crate) exports: Vec<Arc<NbdExport>>,
    /// Name of the export an empty name stands for.
    pub(crate) default: Option<String>,
}

impl Table {
    /// Checks `exports` (names valid and unique, descriptions valid).
    pub(crate) fn new(exports: Vec<NbdExport>, default: Option<String>) -> Result<Table, Error> {
        let mut seen = HashSet::new();
        for e in &exports {
            if !valid_string(&e.name) || e.name.is_empty() {
                return Err(Error::Config(format!(
                    "export name {:?}: must be 1 to {MAX_STRING} bytes without NUL",
                    e.name
                )));
            }
            if !seen.insert(e.name.as_str()) {
                return Err(Error::Config(format!(
                    "export {:?} is listed twice",
                    e.name
                )));
            }
            if let Some(d) = &e.description {
                if !valid_string(d) {
                    return Err(Error::Config(format!(
                        "export {:?}: the description must be at most {MAX_STRING} bytes without NUL",
                        e.name
                    )));
                }
            }
            if e.device.block_size() == 0 {
                return Err(Error::Config(format!(
                    "export {:?}: the device reports a block size of 0",
                    e.name
                )));
            }
        }
        Ok(Table {
            exports: exports.into_iter().map(Arc::new).collect(),
            default,
        })
    }

    /// The exports a client at `ip` may see: the others do not exist for
    /// it, so it cannot even learn their names or sizes.
    pub(crate) fn visible_to(&self, ip: IpAddr) -> Table {
        Table {
            exports: self
                .exports
                .iter()
                .filter(|e| e.allows(ip))
                .cloned()
                .collect(),
            default: self.default.clone(),
        }
    }

    /// The export `name` stands for: itself, or for an empty name the
    /// default export (if one is configured and exported).
    pub(crate) fn find(&self, name: &str) -> Option<&Arc<NbdExport>> {
        let name = match (name, &self.default) {
            ("", Some(d)) => d.as_str(),
            ("", None) => return None,
            (n, _) => n,
        };
        // A closed device (its volume being rolled back or destroyed) is
        // not offered: the client is turned away rather than shown an
        // empty disk, and can connect once the command has returned.
        self.exports
            .iter()
            .find(|e| e.name == name && e.device.is_open())
    }
}

fn valid_string(s: &str) -> bool {
    s.len() <= MAX_STRING && !s.contains('\0')
}

#[cfg(test)]
mod tests {
    use super::*;
    use tarn_vol::testing::MemDevice;

    fn dev() -> Arc<dyn Device> {
        Arc::new(MemDevice::new(4096, 512))
    }

    #[test]
    fn a_client_sees_only_the_exports_its_network_may_use() {
        let mut lan = NbdExport::new("lan", dev());
        lan.clients = vec!["192.168.1.0/24".parse().unwrap()];
        let mut nobody = NbdExport::new("nobody", dev());
        nobody.clients = Vec::new();
        let t = Table::new(vec![lan, nobody, NbdExport::new("all", dev())], None).unwrap();
        let names = |ip: &str| -> Vec<String> {
            let v = t.visible_to(ip.parse().unwrap());
            v.exports.iter().map(|e| e.name.clone()).collect()
        };
        assert_eq!(names("192.168.1.9"), ["lan", "all"]);
        assert_eq!(names("::ffff:192.168.1.9"), ["lan", "all"]);
        assert_eq!(names("10.0.0.1"), ["all"]);
        assert_eq!(names("::1"), ["all"]);
        assert!(t
            .visible_to("10.0.0.1".parse().unwrap())
            .find("lan")
            .is_none());
    }

    #[test]
    fn names_are_checked() {
        assert!(Table::new(vec![NbdExport::new("", dev())], None).is_err());
        assert!(Table::new(vec![NbdExport::new("a\0b", dev())], None).is_err());
        assert!(Table::new(vec![NbdExport::new("x".repeat(4097), dev())], None).is_err());
        assert!(Table::new(
            vec![NbdExport::new("a", dev()), NbdExport::new("a", dev())],
            None
        )
        .is_err());
        let mut e = NbdExport::new("a", dev());
        e.description = Some("d\0".into());
        assert!(Table::new(vec![e], None).is_err());
    }

    #[test]
    fn default_export_and_read_only() {
        let mut b = NbdExport::new("b", Arc::new(MemDevice::new(4096, 512).read_only()));
        b.description = Some("backup".into());
        let t = Table::new(vec![NbdExport::new("a", dev()), b], Some("b".into())).unwrap();
        assert_eq!(t.find("a").unwrap().name, "a");
        assert_eq!(t.find("").unwrap().name, "b");
        assert!(t.find("c").is_none());
        assert!(t.find("b").unwrap().is_read_only());
        assert!(!t.find("a").unwrap().is_read_only());
        let t = Table::new(vec![NbdExport::new("a", dev())], None).unwrap();
        assert!(t.find("").is_none());
        let t = Table::new(vec![NbdExport::new("a", dev())], Some("gone".into())).unwrap();
        assert!(t.find("").is_none(), "a default that is not exported");
    }
}
