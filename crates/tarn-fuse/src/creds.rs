//! Caller credentials: uid and gid from the request, supplementary groups
//! from `/proc/<pid>/status` (see the crate docs).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tarn_fs::Cred;

/// How long a process's group list is reused.
const GROUPS_TTL: Duration = Duration::from_secs(1);
/// Cache size that triggers a purge of expired entries.
const MAX_ENTRIES: usize = 1024;

struct Entry {
    at: Instant,
    groups: Arc<[u32]>,
}

/// Supplementary groups per (pid, uid, gid), kept for [`GROUPS_TTL`].
#[derive(Default)]
pub(crate) struct CredCache {
    map: Mutex<HashMap<(u32, u32, u32), Entry>>,
}

/// The numbers on the `Groups:` line of a `/proc/<pid>/status` text.
pub(crate) fn parse_groups(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|rest| {
            rest.split_whitespace()
                .filter_map(|g| g.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn read_groups(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map(|s| parse_groups(&s))
        .unwrap_or_default()
}

impl CredCache {
    /// The credential of a request from `pid` running as `uid`/`gid`.
    pub(crate) fn cred(&self, uid: u32, gid: u32, pid: u32) -> Cred {
        // Root passes every check; pid 0 is the kernel itself.
        if uid == 0 || pid == 0 {
            return Cred::user(uid, gid);
        }
        let key = (pid, uid, gid);
        let now = Instant::now();
        {
            let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(e) = map.get(&key) {
                if now.duration_since(e.at) < GROUPS_TTL {
                    return Cred {
                        uid,
                        gid,
                        groups: e.groups.to_vec(),
                    };
                }
            }
        }
        // Read outside the lock: /proc reads can be slow.
        let groups: Arc<[u32]> = read_groups(pid).into();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_ENTRIES {
            map.retain(|_, e| now.duration_since(e.at) < GROUPS_TTL);
            if map.len() >= MAX_ENTRIES {
                map.clear();
            }
        }
        map.insert(
            key,
            Entry {
                at: now,
                groups: groups.clone(),
            },
        );
        Cred {
            uid,
            gid,
            groups: groups.to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_groups_line() {
        let s = "Name:\tbash\nUid:\t1000\t1000\t1000\t1000\nGroups:\t4 24 1000 \nNgid:\t0\n";
        assert_eq!(parse_groups(s), vec![4, 24, 1000]);
        assert_eq!(parse_groups("Groups:\t\n"), Vec::<u32>::new());
        assert_eq!(parse_groups("Name: x\n"), Vec::<u32>::new());
    }

    #[test]
    fn reads_own_groups() {
        let c = CredCache::default();
        let pid = std::process::id();
        let cred = c.cred(12345, 678, pid);
        assert_eq!((cred.uid, cred.gid), (12345, 678));
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        assert_eq!(cred.groups, parse_groups(&status));
        assert!(c.cred(0, 0, pid).groups.is_empty());
    }
}
