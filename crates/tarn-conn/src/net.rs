//! Client networks in CIDR form, for the servers' allow lists (NFS
//! exports, NBD shares): who may use a share is decided by the address a
//! connection comes from.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

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

/// The client a per-client limit counts `ip` as (failed logins, for
/// one): an IPv4 address as it is, also when mapped into IPv6, and an
/// IPv6 address by its /64, because one host usually holds a whole /64
/// and could otherwise rotate through it for a fresh count each time.
pub fn client_key(ip: std::net::IpAddr) -> std::net::IpAddr {
    use std::net::IpAddr;
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut seg = v6.segments();
                seg[4..].fill(0);
                IpAddr::V6(std::net::Ipv6Addr::from(seg))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_client_is_an_address_or_an_ipv6_64() {
        let k = |s: &str| super::client_key(s.parse().unwrap());
        assert_eq!(k("2001:db8::1:2:3:4"), k("2001:db8::9:8:7:6"), "one /64");
        assert_ne!(k("2001:db8:0:1::1"), k("2001:db8::1"));
        assert_ne!(k("10.0.0.1"), k("10.0.0.2"));
        assert_eq!(k("::ffff:10.0.0.1"), k("10.0.0.1"));
    }

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
}
