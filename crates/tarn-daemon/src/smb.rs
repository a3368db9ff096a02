//! SMB for Windows and macOS: a real Samba `smbd`, configured and
//! supervised by the daemon.
//!
//! # Why Samba, and how it reaches the data
//!
//! Windows and macOS are tested against Samba, and an SMB3 server is a
//! project of its own; tarn runs Samba unmodified instead of speaking SMB
//! itself. Samba serves files through the kernel as the logged-in user, so
//! every dataset an SMB share names gets a *service mount* (see `mounts`):
//! a FUSE mount of the dataset's one shared `Fs` in
//! `STATE/smb/mnt/SHARE`, with `allow_other`, and `.snapshot` listing the
//! snapshots by the time they were taken (`@GMT-…`, what Samba's
//! shadow-copy module needs to show "Previous Versions"). Because smbd
//! switches to the user's uid before it touches a file, the POSIX layer
//! sees the user's uid and gid: a file alice creates over SMB has alice's
//! owner, as seen over NFS, WebDAV and FUSE, and permissions are the
//! POSIX layer's.
//!
//! # Accounts without touching the host
//!
//! smbd maps a login name to a Unix account with `getpwnam`. tarn's users
//! live in the pool, not in `/etc/passwd`, so smbd runs with nss_wrapper
//! (Debian's `libnss-wrapper`, from Samba's own project) preloaded, which
//! answers those lookups from a `passwd` and a `group` file tarn writes in
//! `STATE/smb/nss`. Without the library, smbd falls back to the host's
//! accounts, and each SMB user needs a host account of the same name and
//! uid (said at start). Passwords are checked by Samba against the NT
//! hashes tarn keeps for users with SMB access (`tarn user passwd --smb`),
//! written to an `smbpasswd` file (0600, in a 0700 directory).
//!
//! # Everything is derived, and follows live
//!
//! `smb.conf`, the account files and the password file are regenerated
//! from the pools' share and user records whenever shares, users, pools or
//! datasets change (the same moments the NFS and WebDAV lists are rebuilt),
//! written atomically, and smbd is told to reload (SIGHUP) instead of
//! restarted, so connected clients stay connected. Nothing in `STATE/smb`
//! is a source of truth: deleting it loses nothing.
//!
//! # Supervision
//!
//! One thread starts smbd in the foreground, in its own process group
//! (its children are per-client), and waits for it. If smbd ends without
//! being asked (a crash, a signal), the thread records how, reports it on
//! stderr and in `daemon.stats`, and starts it again after a back-off
//! (0.5 s doubling to 30 s, reset after a minute of good running).
//! Stopping the daemon sends SIGTERM and waits for it (SIGKILL after ten
//! seconds). An smbd left over from a daemon that was killed is found by
//! its pid file and stopped before a new one starts, so the port is free.
//!
//! # Durability
//!
//! An SMB client's flush (Time Machine's `F_FULLFSYNC` arrives as one) is
//! an `fsync` on the FUSE mount (`strict sync`, Samba's default), which
//! commits the dataset's intent log: what a client flushed survives a
//! crash of tarn or of the machine, as `docs/smb.md` says.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tarn_api::access::{Access, SmbEncrypt, SmbShare};
use tarn_api::params::SmbStatus;

use crate::error::{DaemonError, Result};

/// One share as Samba serves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SmbEntry {
    /// Share name.
    pub name: String,
    /// The dataset.
    pub dataset: String,
    /// How it is served.
    pub share: SmbShare,
    /// Where its service mount is (the share's `path`).
    pub path: PathBuf,
}

/// A user who may log in over SMB.
#[derive(Clone, PartialEq, Eq)]
pub struct SmbUser {
    /// Login name.
    pub name: String,
    /// Unix uid files get.
    pub uid: u32,
    /// Unix gid.
    pub gid: u32,
    /// NT hash, 32 upper-case hex digits.
    pub nt_hash: String,
}

impl std::fmt::Debug for SmbUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmbUser")
            .field("name", &self.name)
            .field("uid", &self.uid)
            .field("gid", &self.gid)
            .finish_non_exhaustive()
    }
}

/// The account the guest maps to.
const GUEST_UID: u32 = 65534;

/// The files under `STATE/smb`.
#[derive(Clone, Debug)]
pub struct Layout {
    /// `STATE/smb`.
    pub root: PathBuf,
}

impl Layout {
    fn conf(&self) -> PathBuf {
        self.root.join("smb.conf")
    }
    fn private(&self) -> PathBuf {
        self.root.join("private")
    }
    fn smbpasswd(&self) -> PathBuf {
        self.private().join("smbpasswd")
    }
    fn nss(&self) -> PathBuf {
        self.root.join("nss")
    }
    fn log(&self) -> PathBuf {
        self.root.join("log")
    }
    fn pid(&self) -> PathBuf {
        self.root.join("pid")
    }
    /// Where the service mount of `share` goes.
    pub fn mountpoint(&self, share: &str) -> PathBuf {
        self.root.join("mnt").join(share)
    }
}

/// A value for smb.conf: one line, no characters Samba's parser treats
/// specially (it has no quoting).
pub(crate) fn conf_value(what: &str, v: &str) -> Result<String> {
    // No quoting exists: a newline or bracket would start a section, ';'
    // and '#' a comment, '%' a macro Samba expands, a backslash a
    // continued line.
    if v.chars().any(|c| c.is_control() || ";#[]%\\".contains(c)) {
        return Err(DaemonError::msg(format!(
            "{what} '{v}' cannot be written to smb.conf (a control character or one of \
             ; # [ ] % \\)"
        )));
    }
    Ok(v.to_string())
}

/// Section names Samba gives a meaning of their own: a share by one of
/// these names would change the settings of every share, print, or make
/// home directories.
pub const RESERVED_SHARE_NAMES: [&str; 5] = ["global", "globals", "homes", "printers", "print$"];

/// Whether `name` cannot be an SMB share's name (Samba compares section
/// names without case).
pub fn reserved_share_name(name: &str) -> bool {
    RESERVED_SHARE_NAMES
        .iter()
        .any(|r| r.eq_ignore_ascii_case(name))
}

/// Renders smb.conf for `entries` (their paths already mounted), with
/// `include` (the owner's own Samba settings) read at the end.
pub fn render_conf(
    layout: &Layout,
    bind: SocketAddr,
    entries: &[SmbEntry],
    include: Option<&Path>,
) -> Result<String> {
    let root = conf_value("the state directory", &layout.root.display().to_string())?;
    let any_guest = entries.iter().any(|e| e.share.guest);
    let mut c = String::new();
    let _ = writeln!(
        c,
        "# Written by tarn from the pools' share records; do not edit."
    );
    let _ = writeln!(c, "# It is rewritten whenever shares or users change.");
    c.push_str("[global]\n");
    let mut g = |k: &str, v: &str| {
        let _ = writeln!(c, "  {k} = {v}");
    };
    g("server role", "standalone server");
    g("workgroup", "WORKGROUP");
    g("server string", "tarn");
    g("smb ports", &bind.port().to_string());
    if !bind.ip().is_unspecified() {
        g("interfaces", &bind.ip().to_string());
        g("bind interfaces only", "yes");
    }
    // No SMB1: it is insecure and every client since Windows Vista and
    // macOS 10.9 speaks SMB2 or later.
    g("server min protocol", "SMB2_10");
    g("disable netbios", "yes");
    g("private dir", &format!("{root}/private"));
    g("lock directory", &format!("{root}/lock"));
    g("state directory", &format!("{root}/state"));
    g("cache directory", &format!("{root}/cache"));
    g("pid directory", &format!("{root}/pid"));
    g("ncalrpc dir", &format!("{root}/ncalrpc"));
    g("log file", &format!("{root}/log/smbd.log"));
    g("max log size", "5000");
    g("log level", "1");
    g(
        "passdb backend",
        &format!("smbpasswd:{root}/private/smbpasswd"),
    );
    g("map to guest", if any_guest { "Bad User" } else { "Never" });
    // Samba's default answers anyone, logged in or not, with the lists
    // of users and shares (names to guess passwords for, and each
    // share's dataset). Without guest shares nobody needs an anonymous
    // session: 2 refuses them. Guests arrive as anonymous sessions and
    // find a guest share by listing the shares (a TV browsing for the
    // media share): 1 or 2 would refuse them the list, so a server with
    // a guest share keeps Samba's default (docs/smb.md says so).
    g("restrict anonymous", if any_guest { "0" } else { "2" });
    g("guest account", "nobody");
    g("load printers", "no");
    g("printing", "bsd");
    g("printcap name", "/dev/null");
    g("disable spoolss", "yes");
    g("unix password sync", "no");
    g("obey pam restrictions", "no");
    g("usershare max shares", "0");
    // Apple's SMB extensions (fruit) must be loaded for every share once
    // one uses them; catia maps the characters macOS allows and Windows
    // does not, streams_xattr keeps alternate data streams (Finder info,
    // resource forks) in extended attributes, shadow_copy2 shows
    // `.snapshot` as previous versions.
    g("vfs objects", "catia fruit streams_xattr shadow_copy2");
    g("fruit:metadata", "stream");
    g("fruit:resource", "stream");
    g("fruit:encoding", "native");
    g("fruit:model", "MacSamba");
    g("fruit:posix_rename", "yes");
    g("fruit:veto_appledouble", "no");
    g("fruit:wipe_intentionally_left_blank_rfork", "yes");
    g("fruit:delete_empty_adfiles", "yes");
    g("shadow:snapdir", ".snapshot");
    g("shadow:format", "@GMT-%Y.%m.%d-%H.%M.%S");
    g("shadow:sort", "desc");
    g("shadow:localtime", "no");
    g("ea support", "yes");
    g("store dos attributes", "yes");
    g("strict sync", "yes");
    // Samba takes signing for the whole server only (in a share's
    // section it is ignored): a share that requires it makes the server
    // require it, for every share, rather than let it be ignored.
    let signing = if entries.iter().any(|e| e.share.signing_required) {
        "mandatory"
    } else {
        "default"
    };
    g("server signing", signing);
    g("multicast dns register", "yes");
    for e in entries {
        let _ = writeln!(c);
        let _ = writeln!(c, "[{}]", conf_value("share name", &e.name)?);
        let mut s = |k: &str, v: &str| {
            let _ = writeln!(c, "  {k} = {v}");
        };
        s("comment", &conf_value("dataset name", &e.dataset)?);
        s(
            "path",
            &conf_value("mountpoint", &e.path.display().to_string())?,
        );
        s("browseable", "yes");
        let rw: Vec<&str> = e
            .share
            .users
            .iter()
            .filter(|(_, a)| **a == Access::Rw)
            .map(|(u, _)| u.as_str())
            .collect();
        let all: Vec<&str> = e.share.users.keys().map(String::as_str).collect();
        // User names are checked where shares are served from (and made);
        // here too, as for every value that reaches this file.
        let (rw, all) = (
            conf_value("user names", &rw.join(" "))?,
            conf_value("user names", &all.join(" "))?,
        );
        s("read only", "yes");
        if !rw.is_empty() {
            s("write list", &rw);
        }
        if e.share.guest {
            s("guest ok", "yes");
        } else {
            s("guest ok", "no");
            s("valid users", &all);
        }
        // New files keep Samba's default modes (create mask 0744,
        // directory mask 0755): the owner's execute bit is what Windows
        // clients need to be granted "execute" on their own files (Samba's
        // torture suite fails without it), and the owner is the user.
        s(
            "server smb encrypt",
            match e.share.encrypt {
                SmbEncrypt::Off => "if_required",
                SmbEncrypt::Desired => "desired",
                SmbEncrypt::Required => "required",
            },
        );
        if e.share.timemachine {
            s("fruit:time machine", "yes");
            if e.share.tm_quota > 0 {
                let mib = e.share.tm_quota.div_ceil(1 << 20);
                s("fruit:time machine max size", &format!("{mib}M"));
            }
            // What Apple's guide for Time Machine over SMB asks of a
            // server: durable handles, no kernel leases or share modes.
            s("durable handles", "yes");
            s("kernel oplocks", "no");
            s("kernel share modes", "no");
            s("posix locking", "no");
        }
    }
    if let Some(inc) = include {
        let _ = writeln!(c);
        let _ = writeln!(
            c,
            "# The owner's own settings (tarn daemon --smb-include); Samba reads"
        );
        let _ = writeln!(c, "# them here, after everything tarn manages.");
        let _ = writeln!(
            c,
            "include = {}",
            conf_value("--smb-include", &inc.display().to_string())?
        );
    }
    Ok(c)
}

/// The passwd file smbd's account lookups read (nss_wrapper).
pub fn render_passwd(users: &[SmbUser]) -> String {
    let mut c = String::from("root:x:0:0:root:/root:/usr/sbin/nologin\n");
    let _ = writeln!(
        c,
        "nobody:x:{GUEST_UID}:{GUEST_UID}:nobody:/nonexistent:/usr/sbin/nologin"
    );
    for u in users {
        let _ = writeln!(
            c,
            "{}:x:{}:{}:tarn user:/nonexistent:/usr/sbin/nologin",
            u.name, u.uid, u.gid
        );
    }
    c
}

/// The group every SMB user (and the guest) belongs to: the only group
/// that may enter `STATE/smb/mnt` (mode 0710), so that local accounts of
/// the host cannot walk into the service mounts around Samba's access
/// lists. A gid far above the ranges distributions hand out.
pub const SMB_GROUP: (&str, u32) = ("tarn-smb", 2_147_483_600);

/// The group file: one group per gid of the users, named after the user
/// whose uid it equals, else `gGID`, and the SMB group with every user.
pub fn render_group(users: &[SmbUser]) -> String {
    let mut c = String::from("root:x:0:\n");
    let _ = writeln!(c, "nogroup:x:{GUEST_UID}:");
    let mut gids: BTreeMap<u32, String> = BTreeMap::new();
    for u in users {
        if u.gid == 0 || u.gid == GUEST_UID || u.gid == SMB_GROUP.1 {
            continue;
        }
        let name = users
            .iter()
            .find(|o| o.uid == u.gid && o.gid == u.gid)
            .map(|o| o.name.clone())
            .unwrap_or_else(|| format!("g{}", u.gid));
        gids.entry(u.gid).or_insert(name);
    }
    for (gid, name) in gids {
        let _ = writeln!(c, "{name}:x:{gid}:");
    }
    let mut members: Vec<&str> = users.iter().map(|u| u.name.as_str()).collect();
    members.push("nobody");
    let _ = writeln!(c, "{}:x:{}:{}", SMB_GROUP.0, SMB_GROUP.1, members.join(","));
    c
}

/// Samba's `smbpasswd` file of `users`.
pub fn render_smbpasswd(users: &[SmbUser]) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut c = String::new();
    for u in users {
        let _ = writeln!(
            c,
            "{}:{}:XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX:{}:[U          ]:LCT-{:08X}:",
            u.name, u.uid, u.nt_hash, now as u32
        );
    }
    c
}

/// Keeps the users smbd may see: valid names and hashes (records come
/// from disks, which may have been written elsewhere), not root, not the
/// guest's or the SMB group's ids, names that do not clash with the
/// built-in accounts; the rest reported. Samba has one name space for the
/// users of every pool: a name in two pools with different ids or
/// passwords is left out entirely (fail closed), so importing a pool
/// cannot take over another pool's user.
pub fn usable_users(users: Vec<SmbUser>, problems: &mut Vec<String>) -> Vec<SmbUser> {
    let mut out: Vec<SmbUser> = Vec::new();
    let mut clashed: Vec<String> = Vec::new();
    for u in users {
        let hash_ok = u.nt_hash.len() == 32
            && u.nt_hash
                .chars()
                .all(|c| c.is_ascii_digit() || ('A'..='F').contains(&c));
        if tarn_api::access::check_user_name(&u.name).is_err() || !hash_ok {
            problems.push(format!(
                "a user record ({:?}) has a name or NT hash that cannot be used; left out of SMB",
                u.name
            ));
            continue;
        }
        let reserved_ids = [0, GUEST_UID, SMB_GROUP.1];
        if reserved_ids.contains(&u.uid)
            || reserved_ids.contains(&u.gid)
            || ["root", "nobody", "nogroup", SMB_GROUP.0].contains(&u.name.as_str())
        {
            problems.push(format!(
                "user '{}' (uid {}, gid {}) cannot log in over SMB: root, the guest account \
                 and tarn's SMB group are reserved",
                u.name, u.uid, u.gid
            ));
            continue;
        }
        if clashed.contains(&u.name) {
            continue;
        }
        if let Some(i) = out.iter().position(|o| o.name == u.name) {
            if out[i] != u {
                problems.push(format!(
                    "user '{}' exists in two pools with different ids or passwords: neither \
                     may log in over SMB until one is removed or they match",
                    u.name
                ));
                out.remove(i);
                clashed.push(u.name);
            }
            continue;
        }
        out.push(u);
    }
    out
}

/// Finds a program in `PATH`, then in the sbin directories Debian uses.
fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// nss_wrapper, if installed.
fn find_nss_wrapper() -> Option<PathBuf> {
    let mut dirs = vec![PathBuf::from("/usr/lib"), PathBuf::from("/usr/lib64")];
    if let Ok(rd) = std::fs::read_dir("/usr/lib") {
        dirs.extend(
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.to_string_lossy().ends_with("-linux-gnu")),
        );
    }
    dirs.into_iter()
        .map(|d| d.join("libnss_wrapper.so"))
        .find(|p| p.is_file())
}

/// Checks that users other than root can reach `dir` (smbd opens the
/// share's files as the logged-in user): every ancestor must be
/// searchable by others.
fn check_reachable(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut p = Some(dir);
    while let Some(d) = p {
        if let Ok(m) = std::fs::metadata(d) {
            if m.permissions().mode() & 0o001 == 0 {
                return Err(DaemonError::msg(format!(
                    "SMB users cannot reach {}: {} is not searchable by others (chmod o+x it, \
                     or use a --state-dir whose parents are)",
                    dir.display(),
                    d.display()
                )));
            }
        }
        p = d.parent();
    }
    Ok(())
}

struct Shared {
    status: SmbStatus,
}

/// The stop flag, and what wakes the supervisor's back-off when it is set.
/// The supervisor spawns smbd and records its pid while holding the flag,
/// so a stop sees either no new smbd or its pid.
type StopFlag = Arc<(Mutex<bool>, std::sync::Condvar)>;

/// The supervised smbd.
pub struct Samba {
    layout: Layout,
    bind: SocketAddr,
    include: Option<PathBuf>,
    smbcontrol: PathBuf,
    /// Lists the sessions, to end those of a user whose account changed.
    smbstatus: PathBuf,
    nss_wrapper: PathBuf,
    shared: Arc<Mutex<Shared>>,
    stop: StopFlag,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// What was last written, so an unchanged update sends no reload.
    written: Mutex<Option<(String, String, String, String)>>,
    /// The shares and users served since the last update, to tell which
    /// shares' connected clients must reconnect under the new terms.
    served: Mutex<Served>,
}

/// The shares (by name) and the users one smb.conf serves.
pub(crate) type Served = (Vec<(String, SmbShare)>, Vec<SmbUser>);

/// The shares whose connected clients must be disconnected when the
/// served shares and users change from `old` to `new`: Samba decides a
/// client's access to a share when it connects to it and keeps that
/// decision for the connection, so a share removed, served on other
/// terms (users, guest, encryption), or naming a user whose account
/// changed or went away must be closed for the new terms to apply to
/// clients already in. They reconnect at once, under the new terms.
pub(crate) fn shares_to_close(old: &Served, new: &Served) -> Vec<String> {
    let changed_users = users_changed(old, new);
    shares_to_close_for(old, new, &changed_users)
}

/// The users of `old` whose account changed or went away in `new` (a new
/// password, uid or gid, SMB taken away).
fn users_changed<'a>(old: &'a Served, new: &Served) -> Vec<&'a SmbUser> {
    old.1
        .iter()
        .filter(|u| !new.1.iter().any(|n| n == *u))
        .collect()
}

/// The uids whose SMB sessions must end when the served users change
/// from `old` to `new`. Closing a share's connections is not enough: the
/// session, authenticated with the old password, stays, and the client
/// connects to the share again on it without being asked for the
/// password (nor is a session whose user lost SMB kept from guest
/// shares). Ending the session's smbd makes the client log in anew.
pub(crate) fn uids_to_end(old: &Served, new: &Served) -> Vec<u32> {
    let mut uids: Vec<u32> = users_changed(old, new).iter().map(|u| u.uid).collect();
    uids.sort_unstable();
    uids.dedup();
    uids
}

/// The smbd processes (pids) serving a session of one of `uids`, from
/// `smbstatus --json`.
pub(crate) fn session_pids(status_json: &str, uids: &[u32]) -> Vec<i32> {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(status_json) else {
        return Vec::new();
    };
    let Some(sessions) = v["sessions"].as_object() else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = sessions
        .values()
        .filter(|s| {
            s["uid"]
                .as_u64()
                .is_some_and(|u| uids.iter().any(|x| u64::from(*x) == u))
        })
        .filter_map(|s| s["server_id"]["pid"].as_str()?.parse().ok())
        .filter(|p| *p > 1)
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

fn shares_to_close_for(old: &Served, new: &Served, changed: &[&SmbUser]) -> Vec<String> {
    let (old_shares, _) = old;
    let (new_shares, _) = new;
    let changed_users: Vec<&str> = changed.iter().map(|u| u.name.as_str()).collect();
    // Signing is the server's (see `render_conf`): when it changes, every
    // share's clients reconnect under it.
    let signs = |v: &Vec<(String, SmbShare)>| v.iter().any(|(_, s)| s.signing_required);
    let everyone = signs(old_shares) != signs(new_shares);
    let mut out = Vec::new();
    for (name, share) in old_shares {
        let now = new_shares.iter().find(|(n, _)| n == name).map(|(_, s)| s);
        let close = match now {
            _ if everyone => true,
            None => true,
            Some(s) if s != share => true,
            Some(s) => s.users.keys().any(|u| changed_users.contains(&u.as_str())),
        };
        if close {
            out.push(name.clone());
        }
    }
    out
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn write_file(path: &Path, text: &str, mode: u32) -> Result<()> {
    crate::pools::write_atomically(path, text.as_bytes(), mode)
        .map_err(|e| DaemonError::msg(format!("cannot write {}: {e}", path.display())))
}

fn mkdir(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(path)
        .and_then(|()| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)))
        .map_err(|e| DaemonError::msg(format!("cannot create {}: {e}", path.display())))
}

/// Stops an smbd that a killed daemon left running on this state
/// directory (found by its pid file, recognised by its config path).
fn stop_leftover(layout: &Layout) {
    let Ok(rd) = std::fs::read_dir(layout.pid()) else {
        return;
    };
    let conf = layout.conf().display().to_string();
    for e in rd.flatten() {
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let Ok(pid) = text.trim().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if pid <= 1 || !cmdline.contains("smbd") || !cmdline.contains(&conf) {
            continue;
        }
        log::warn!("tarn: stopping smbd {pid} left over from an earlier daemon");
        // tarn starts smbd as the leader of its own process group: the
        // group is smbd and its per-client children.
        let p = nix::unistd::Pid::from_raw(pid);
        let _ = nix::sys::signal::killpg(p, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && Path::new(&format!("/proc/{pid}")).exists() {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = nix::sys::signal::killpg(p, nix::sys::signal::Signal::SIGKILL);
    }
}

/// Detaches what is still mounted below `dir`: the service mounts of a
/// daemon that was killed are dead (every access fails with ENOTCONN) and
/// would stop new ones from being made.
fn detach_stale(dir: &Path) {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    for line in mounts.lines() {
        let Some(point) = line.split(' ').nth(1) else {
            continue;
        };
        let point = PathBuf::from(
            <std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(
                tarn_fuse::unescape_mount_path(point),
            ),
        );
        if point.starts_with(dir) && point != dir {
            match nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH) {
                Ok(()) => log::warn!(
                    "tarn: detached {} left by an earlier daemon",
                    point.display()
                ),
                Err(e) => log::warn!("tarn: cannot detach {}: {e}", point.display()),
            }
        }
    }
}

impl Samba {
    /// Prepares `STATE/smb` and starts smbd listening on `bind`, serving
    /// no shares yet (`update` hands them over); `include` is a file of
    /// the owner's own Samba settings, read after tarn's. Fails when Samba
    /// is not installed or smbd does not come up.
    pub fn start(state_dir: &Path, bind: SocketAddr, include: Option<PathBuf>) -> Result<Samba> {
        if let Some(inc) = &include {
            if !inc.is_absolute() || !inc.is_file() {
                return Err(DaemonError::msg(format!(
                    "--smb-include {}: not an existing file given by its absolute path",
                    inc.display()
                )));
            }
        }
        let smbd = find_program("smbd").ok_or_else(|| {
            DaemonError::msg(
                "SMB needs Samba's smbd, which is not installed (Debian: apt-get install samba)",
            )
        })?;
        // Without them a revoked user's connections and sessions would go
        // on: refused, as smbd is.
        let needed = |tool: &str| {
            find_program(tool).ok_or_else(|| {
                DaemonError::msg(format!(
                    "SMB needs Samba's {tool}, which is not installed (Debian: apt-get install \
                     samba)"
                ))
            })
        };
        let smbcontrol = needed("smbcontrol")?;
        let smbstatus = needed("smbstatus")?;
        let layout = Layout {
            root: state_dir.join("smb"),
        };
        mkdir(&layout.root, 0o755)?;
        check_reachable(&layout.root)?;
        mkdir(&layout.private(), 0o700)?;
        for d in ["lock", "state", "cache", "pid", "ncalrpc", "log"] {
            mkdir(&layout.root.join(d), 0o755)?;
        }
        mkdir(&layout.nss(), 0o755)?;
        mkdir(&layout.root.join("mnt"), 0o755)?;
        // Without it smbd would map tarn's users to the host's accounts of
        // the same names, whose uids may be other tarn users'.
        let nss_wrapper = find_nss_wrapper().ok_or_else(|| {
            DaemonError::msg(
                "SMB needs nss_wrapper, which gives Samba tarn's users (Debian: apt-get install \
                 libnss-wrapper)",
            )
        })?;
        let mnt = layout.root.join("mnt");
        {
            use std::os::unix::fs::PermissionsExt;
            std::os::unix::fs::chown(&mnt, Some(0), Some(SMB_GROUP.1))
                .and_then(|()| {
                    std::fs::set_permissions(&mnt, std::fs::Permissions::from_mode(0o710))
                })
                .map_err(|e| DaemonError::msg(format!("cannot set up {}: {e}", mnt.display())))?;
        }
        stop_leftover(&layout);
        detach_stale(&mnt);
        // Refuse a port someone else holds (a distribution's smbd on 445)
        // instead of waiting for our smbd to fail to bind it.
        drop(std::net::TcpListener::bind(bind).map_err(|e| {
            DaemonError::msg(format!(
                "cannot listen for SMB on {bind}: {e} (is another Samba running? \
                 systemctl disable --now smbd)"
            ))
        })?);
        let samba = Samba {
            layout,
            bind,
            include,
            smbcontrol,
            smbstatus,
            nss_wrapper,
            shared: Arc::new(Mutex::new(Shared {
                status: SmbStatus {
                    address: bind.to_string(),
                    ..SmbStatus::default()
                },
            })),
            stop: Arc::new((Mutex::new(false), std::sync::Condvar::new())),
            thread: Mutex::new(None),
            written: Mutex::new(None),
            served: Mutex::new((Vec::new(), Vec::new())),
        };
        samba.write(&[], &[], Vec::new())?;
        let mut child = samba.spawn(&smbd)?;
        if let Err(e) = samba.wait_listening(&mut child) {
            terminate(&mut child);
            return Err(e);
        }
        lock(&samba.shared).status.pid = Some(child.id());
        let t = {
            let shared = samba.shared.clone();
            let stop = samba.stop.clone();
            let layout = samba.layout.clone();
            let env = samba.env();
            std::thread::Builder::new()
                .name("tarn-smbd".into())
                .spawn(move || supervise(smbd, layout, env, child, shared, stop))
                .map_err(|e| DaemonError::msg(format!("cannot start the SMB supervisor: {e}")))?
        };
        *lock(&samba.thread) = Some(t);
        Ok(samba)
    }

    /// The files layout (mountpoints of shares).
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    fn env(&self) -> Vec<(String, String)> {
        vec![
            ("LD_PRELOAD".into(), self.nss_wrapper.display().to_string()),
            (
                "NSS_WRAPPER_PASSWD".into(),
                self.layout.nss().join("passwd").display().to_string(),
            ),
            (
                "NSS_WRAPPER_GROUP".into(),
                self.layout.nss().join("group").display().to_string(),
            ),
        ]
    }

    fn spawn(&self, smbd: &Path) -> Result<Child> {
        spawn_smbd(smbd, &self.layout, &self.env())
    }

    /// Waits until smbd accepts connections (or ended, or ten seconds).
    fn wait_listening(&self, child: &mut Child) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let addr = if self.bind.ip().is_unspecified() {
            SocketAddr::new(
                if self.bind.is_ipv4() {
                    std::net::Ipv4Addr::LOCALHOST.into()
                } else {
                    std::net::Ipv6Addr::LOCALHOST.into()
                },
                self.bind.port(),
            )
        } else {
            self.bind
        };
        loop {
            let listening =
                std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok();
            let ended = child.try_wait().ok().flatten();
            if listening && ended.is_none() {
                return Ok(());
            }
            if ended.is_some() || Instant::now() >= deadline {
                let log =
                    std::fs::read_to_string(self.layout.log().join("smbd.out")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                return Err(DaemonError::msg(format!(
                    "smbd did not start listening on {}: {}",
                    self.bind,
                    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Writes the configuration for `entries` and `users`; returns true
    /// if anything changed.
    fn write(
        &self,
        entries: &[SmbEntry],
        users: &[SmbUser],
        problems: Vec<String>,
    ) -> Result<bool> {
        let conf = render_conf(&self.layout, self.bind, entries, self.include.as_deref())?;
        let passwd = render_passwd(users);
        let group = render_group(users);
        // The time stamp in smbpasswd changes every call: compare without it.
        let pw_key: String = users
            .iter()
            .map(|u| format!("{}:{}:{}\n", u.name, u.uid, u.nt_hash))
            .collect();
        let key = (conf.clone(), passwd.clone(), group.clone(), pw_key);
        {
            let mut sh = lock(&self.shared);
            sh.status.shares = entries.iter().map(|e| e.name.clone()).collect();
            sh.status.problems = problems;
        }
        let mut written = lock(&self.written);
        if written.as_ref() == Some(&key) {
            return Ok(false);
        }
        // Accounts and passwords before the configuration that names them.
        write_file(&self.layout.nss().join("passwd"), &passwd, 0o644)?;
        write_file(&self.layout.nss().join("group"), &group, 0o644)?;
        write_file(&self.layout.smbpasswd(), &render_smbpasswd(users), 0o600)?;
        write_file(&self.layout.conf(), &conf, 0o644)?;
        *written = Some(key);
        Ok(true)
    }

    /// Serves `entries` to `users` from now on: rewrites the files and has
    /// smbd reload them (connections stay).
    pub fn update(&self, entries: &[SmbEntry], users: &[SmbUser], problems: Vec<String>) {
        match self.write(entries, users, problems) {
            Ok(true) => {
                self.signal(nix::sys::signal::Signal::SIGHUP);
                let now = (
                    entries
                        .iter()
                        .map(|e| (e.name.clone(), e.share.clone()))
                        .collect::<Vec<_>>(),
                    users.to_vec(),
                );
                let before = std::mem::replace(&mut *lock(&self.served), now.clone());
                let close = shares_to_close(&before, &now);
                if !close.is_empty() {
                    // Every smbd process reads the new files before its
                    // clients of those shares reconnect (messages to a
                    // process are handled in order).
                    self.smbcontrol_all(&["reload-config"]);
                    for share in &close {
                        self.smbcontrol_all(&["close-share", share]);
                    }
                }
                self.end_sessions(&uids_to_end(&before, &now));
            }
            Ok(false) => {}
            Err(e) => {
                log::warn!("tarn: cannot update the SMB configuration: {e}");
                lock(&self.shared).status.problems.push(format!(
                    "the configuration could not be written ({e}): smbd still serves the \
                     previous shares and users"
                ));
            }
        }
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        if let Some(pid) = lock(&self.shared).status.pid {
            if let Ok(pid) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
            }
        }
    }

    /// Ends the SMB sessions of `uids` (see [`uids_to_end`]): their smbd
    /// processes are stopped, and their clients log in again.
    fn end_sessions(&self, uids: &[u32]) {
        if uids.is_empty() {
            return;
        }
        let mut cmd = Command::new(&self.smbstatus);
        cmd.arg("-s")
            .arg(self.layout.conf())
            .arg("--json")
            .stdin(Stdio::null())
            .stderr(Stdio::null());
        for (k, v) in self.env() {
            cmd.env(k, v);
        }
        let Ok(out) = cmd.output() else {
            return;
        };
        let parent = lock(&self.shared)
            .status
            .pid
            .and_then(|p| i32::try_from(p).ok());
        for pid in session_pids(&String::from_utf8_lossy(&out.stdout), uids) {
            // Only a child smbd (a stale listing could name a pid the
            // system gave to something else since).
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if Some(pid) == parent || !String::from_utf8_lossy(&cmdline).contains("smbd") {
                continue;
            }
            log::info!("tarn: ending SMB session process {pid}: its user's account changed");
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }

    fn smbcontrol_all(&self, message: &[&str]) {
        smbcontrol_smbd(&self.smbcontrol, &self.layout, &self.env(), message);
    }

    /// A closer for `Mounts::set_closer`.
    pub fn closer(&self) -> crate::mounts::Closer {
        let smbcontrol = self.smbcontrol.clone();
        let layout = self.layout.clone();
        let env = self.env();
        Box::new(move |share| smbcontrol_smbd(&smbcontrol, &layout, &env, &["close-share", share]))
    }

    /// How smbd is doing.
    pub fn status(&self) -> SmbStatus {
        lock(&self.shared).status.clone()
    }

    /// Stops smbd (SIGTERM to its process group; SIGKILL after ten
    /// seconds) and its supervisor.
    pub fn stop(&self) {
        let Some(t) = lock(&self.thread).take() else {
            return;
        };
        let pid = {
            let (flag, cv) = &*self.stop;
            let mut stopped = lock(flag);
            *stopped = true;
            cv.notify_all();
            lock(&self.shared).status.pid
        };
        let group = |sig| {
            if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
                let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), sig);
            }
        };
        group(nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !t.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if !t.is_finished() {
            group(nix::sys::signal::Signal::SIGKILL);
        }
        let _ = t.join();
    }
}

impl Drop for Samba {
    fn drop(&mut self) {
        self.stop();
    }
}

fn spawn_smbd(smbd: &Path, layout: &Layout, env: &[(String, String)]) -> Result<Child> {
    use std::os::unix::process::CommandExt;
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(layout.log().join("smbd.out"))
        .map_err(|e| DaemonError::msg(format!("cannot open smbd's log: {e}")))?;
    let err = out
        .try_clone()
        .map_err(|e| DaemonError::msg(format!("cannot open smbd's log: {e}")))?;
    let mut cmd = Command::new(smbd);
    cmd.arg("--foreground")
        .arg("--no-process-group")
        .arg("--debug-stdout")
        .arg("-s")
        .arg(layout.conf())
        // A pipe whose other end only this process holds (in the `Child`,
        // for as long as it supervises smbd): smbd in the foreground
        // exits when its stdin, a pipe, reaches its end, so a daemon that
        // is killed or crashes takes smbd with it instead of leaving it
        // on the port, serving mounts that are gone.
        .stdin(Stdio::piped())
        .stdout(out)
        .stderr(err)
        // Its own process group: a terminal's ^C reaches the daemon, which
        // stops smbd in order.
        .process_group(0);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn()
        .map_err(|e| DaemonError::msg(format!("cannot start {}: {e}", smbd.display())))
}

/// Sends `message` to every smbd process with `smbcontrol`, and waits for
/// the command (not for smbd to act on it).
fn smbcontrol_smbd(smbcontrol: &Path, layout: &Layout, env: &[(String, String)], message: &[&str]) {
    let mut cmd = Command::new(smbcontrol);
    cmd.arg("-s")
        .arg(layout.conf())
        .arg("smbd")
        .args(message)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let _ = cmd.status();
}

/// SIGTERM, then SIGKILL after ten seconds; reaps the child.
fn terminate(c: &mut Child) {
    // The whole process group: smbd and its per-client children.
    if let Ok(pid) = i32::try_from(c.id()) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if let Ok(pid) = i32::try_from(c.id()) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let _ = c.kill();
    let _ = c.wait();
}

fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => "ended".to_string(),
    }
}

/// The supervisor thread: waits for smbd (blocked in `wait`, no polling)
/// and starts it again whenever it ends unasked.
fn supervise(
    smbd: PathBuf,
    layout: Layout,
    env: Vec<(String, String)>,
    first: Child,
    shared: Arc<Mutex<Shared>>,
    stop: StopFlag,
) {
    let (flag, cv) = &*stop;
    let mut child = Some(first);
    let mut backoff = Duration::from_millis(500);
    let mut started = Instant::now();
    loop {
        let how = match child.take() {
            Some(mut c) => {
                // smbd's stdin stays open while it runs (see `spawn_smbd`):
                // `wait` would close it first, and smbd would end.
                let _stdin = c.stdin.take();
                match c.wait() {
                    Ok(st) => describe(st),
                    Err(e) => format!("cannot be waited for: {e}"),
                }
            }
            None => "could not be started".to_string(),
        };
        lock(&shared).status.pid = None;
        if *lock(flag) {
            return;
        }
        {
            let mut sh = lock(&shared);
            sh.status.restarts += 1;
            sh.status.last_exit = Some(how.clone());
            sh.status.last_exit_unix = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
        }
        if started.elapsed() > Duration::from_secs(60) {
            backoff = Duration::from_millis(500);
        }
        log::warn!(
            "tarn: smbd {how}; starting it again in {:.1} s",
            backoff.as_secs_f64()
        );
        let stopped = lock(flag);
        let (stopped, _) = cv
            .wait_timeout_while(stopped, backoff, |s| !*s)
            .unwrap_or_else(|e| e.into_inner());
        if *stopped {
            return;
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
        // Spawned and recorded under the stop flag (see `StopFlag`). Its
        // children may still serve the old session; the pid file of the
        // one that ended is stale, so no leftover check is needed.
        match spawn_smbd(&smbd, &layout, &env) {
            Ok(c) => {
                started = Instant::now();
                lock(&shared).status.pid = Some(c.id());
                child = Some(c);
            }
            Err(e) => log::warn!("tarn: {e}"),
        }
        drop(stopped);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_reconnect_to_shares_whose_terms_changed() {
        let user = |n: &str, h: &str| SmbUser {
            name: n.into(),
            uid: 1000,
            gid: 1000,
            nt_hash: h.into(),
        };
        let served = |shares: &[SmbEntry], users: &[SmbUser]| {
            (
                shares
                    .iter()
                    .map(|e| (e.name.clone(), e.share.clone()))
                    .collect::<Vec<_>>(),
                users.to_vec(),
            )
        };
        let (photos, docs, media) = (entry("photos"), entry("docs"), entry("media"));
        let mut guest = entry("public");
        guest.share.users.clear();
        guest.share.guest = true;
        let users = [user("alice", "AA"), user("bob", "BB")];
        let before = served(
            &[photos.clone(), docs.clone(), media.clone(), guest.clone()],
            &users,
        );
        assert!(
            shares_to_close(&before, &before).is_empty(),
            "nothing changed"
        );
        // bob loses docs; media is no longer served; photos stays as it was.
        let mut narrowed = docs.clone();
        narrowed.share.users.remove("bob");
        let after = served(&[photos.clone(), narrowed, guest.clone()], &users);
        assert_eq!(shares_to_close(&before, &after), ["docs", "media"]);
        // bob's password changes (or his SMB login ends): every share that
        // names him, not the guest share.
        let after = served(
            &[photos, docs, media, guest],
            &[user("alice", "AA"), user("bob", "CC")],
        );
        assert_eq!(
            shares_to_close(&before, &after),
            ["photos", "docs", "media"]
        );
        // Signing is the server's: when one share starts requiring it,
        // every share's clients reconnect.
        let (mut p2, d2) = (entry("photos"), entry("docs"));
        p2.share.signing_required = true;
        let two = served(&[entry("photos"), d2.clone()], &users);
        let signed = served(&[p2, d2], &users);
        assert_eq!(shares_to_close(&two, &signed), ["photos", "docs"]);
    }

    /// A user whose password changed, or who lost SMB, has their sessions
    /// ended (not only their shares closed); the smbd processes are found
    /// in `smbstatus --json` by the sessions' uids.
    #[test]
    fn sessions_of_changed_users_are_ended() {
        let user = |n: &str, uid: u32, h: &str| SmbUser {
            name: n.into(),
            uid,
            gid: uid,
            nt_hash: h.into(),
        };
        let (alice, bob) = (user("alice", 1000, "AA"), user("bob", 1001, "BB"));
        let before: Served = (Vec::new(), vec![alice.clone(), bob.clone()]);
        assert!(uids_to_end(&before, &before).is_empty());
        let new_pw: Served = (Vec::new(), vec![alice.clone(), user("bob", 1001, "CC")]);
        assert_eq!(uids_to_end(&before, &new_pw), [1001]);
        let gone: Served = (Vec::new(), vec![bob]);
        assert_eq!(uids_to_end(&before, &gone), [1000]);

        let status = r#"{"sessions": {
            "1": {"server_id": {"pid": "28325"}, "uid": 1001},
            "2": {"server_id": {"pid": "28400"}, "uid": 1000},
            "3": {"server_id": {"pid": "28325"}, "uid": 1001},
            "4": {"server_id": {"pid": "1"}, "uid": 1001}}}"#;
        assert_eq!(session_pids(status, &[1001]), [28325]);
        assert_eq!(session_pids(status, &[1000, 1001]), [28325, 28400]);
        assert!(session_pids(status, &[7]).is_empty());
        assert!(session_pids("not json", &[1001]).is_empty());
        assert!(session_pids(r#"{"sessions": 5}"#, &[1001]).is_empty());
    }

    fn entry(name: &str) -> SmbEntry {
        SmbEntry {
            name: name.into(),
            dataset: format!("tank/{name}"),
            share: SmbShare {
                users: [
                    ("alice".to_string(), Access::Rw),
                    ("bob".to_string(), Access::Ro),
                ]
                .into_iter()
                .collect(),
                ..SmbShare::default()
            },
            path: PathBuf::from(format!("/state/smb/mnt/{name}")),
        }
    }

    fn section<'a>(conf: &'a str, name: &str) -> Vec<&'a str> {
        let head = format!("[{name}]");
        conf.lines()
            .skip_while(|l| *l != head)
            .skip(1)
            .take_while(|l| !l.starts_with('['))
            .map(str::trim)
            .collect()
    }

    fn layout() -> Layout {
        Layout {
            root: PathBuf::from("/state/smb"),
        }
    }

    #[test]
    fn access_lists_follow_the_share() {
        let bind: SocketAddr = "127.0.0.1:4450".parse().unwrap();
        let conf = render_conf(&layout(), bind, &[entry("photos")], None).unwrap();
        let s = section(&conf, "photos");
        assert!(s.contains(&"path = /state/smb/mnt/photos"), "{s:?}");
        assert!(s.contains(&"read only = yes"));
        assert!(s.contains(&"write list = alice"));
        assert!(s.contains(&"valid users = alice bob"));
        assert!(s.contains(&"guest ok = no"));
        assert!(conf.contains("server min protocol = SMB2_10"), "no SMB1");
        assert!(conf.contains("map to guest = Never"));
        assert!(conf.contains("smb ports = 4450"));
        assert!(conf.contains("interfaces = 127.0.0.1"));
        assert!(section(&conf, "global").contains(&"server signing = default"));
        assert!(section(&conf, "global").contains(&"restrict anonymous = 2"));
        assert!(!s.iter().any(|l| l.starts_with("fruit:time machine")));

        let mut g = entry("media");
        g.share.guest = true;
        g.share.timemachine = true;
        g.share.tm_quota = (1 << 30) + 1;
        g.share.encrypt = SmbEncrypt::Required;
        g.share.signing_required = true;
        let conf = render_conf(
            &layout(),
            bind,
            &[g],
            Some(Path::new("/etc/tarn/smb-extra.conf")),
        )
        .unwrap();
        let s = section(&conf, "media");
        assert!(s.contains(&"guest ok = yes"));
        assert!(!s.iter().any(|l| l.starts_with("valid users")));
        assert!(conf.contains("map to guest = Bad User"));
        assert!(section(&conf, "global").contains(&"restrict anonymous = 0"));
        assert!(s.contains(&"fruit:time machine = yes"));
        assert!(
            s.contains(&"fruit:time machine max size = 1025M"),
            "rounded up"
        );
        assert!(s.contains(&"server smb encrypt = required"));
        // Signing is a server-wide setting in Samba (ignored in a share).
        assert!(!s.iter().any(|l| l.starts_with("server signing")));
        assert!(section(&conf, "global").contains(&"server signing = mandatory"));
        assert_eq!(
            conf.lines().last(),
            Some("include = /etc/tarn/smb-extra.conf"),
            "the owner's settings come last"
        );
    }

    #[test]
    fn an_unwritable_value_is_refused_not_written() {
        let bind: SocketAddr = "0.0.0.0:445".parse().unwrap();
        let mut e = entry("x");
        e.path = PathBuf::from("/state/a\n[global]\npath=/");
        assert!(render_conf(&layout(), bind, &[e], None).is_err());
        let bad = Layout {
            root: PathBuf::from("/st;ate"),
        };
        assert!(render_conf(&bad, bind, &[], None).is_err());
        // A user name from a pool's records written elsewhere: it would
        // start a line of its own in `valid users`.
        let mut e = entry("y");
        e.share
            .users
            .insert("eve\n  root preexec = /bin/sh".into(), Access::Ro);
        assert!(render_conf(&layout(), bind, &[e], None).is_err());
        let conf = render_conf(&layout(), bind, &[], None).unwrap();
        assert!(
            !conf.contains("interfaces ="),
            "all addresses: no interface list"
        );
    }

    fn user(name: &str, uid: u32, gid: u32) -> SmbUser {
        SmbUser {
            name: name.into(),
            uid,
            gid,
            nt_hash: crate::access::nt_hash("pw"),
        }
    }

    #[test]
    fn account_files_name_every_user_and_group() {
        let users = vec![user("alice", 1001, 1001), user("bob", 1002, 100)];
        let p = render_passwd(&users);
        assert!(p.lines().any(|l| l.starts_with("alice:x:1001:1001:")));
        assert!(p.lines().any(|l| l.starts_with("bob:x:1002:100:")));
        assert!(p.lines().any(|l| l.starts_with("nobody:x:65534:65534:")));
        let g = render_group(&users);
        assert!(g.lines().any(|l| l == "alice:x:1001:"));
        assert!(g.lines().any(|l| l == "g100:x:100:"));
        let s = render_smbpasswd(&users);
        let first: Vec<&str> = s.lines().next().unwrap().split(':').collect();
        assert_eq!(first[0], "alice");
        assert_eq!(first[1], "1001");
        assert_eq!(first[3], crate::access::nt_hash("pw"));
        assert_eq!(first[3].len(), 32);
    }

    #[test]
    fn reserved_section_names_are_caught_in_any_case() {
        for n in ["global", "GLOBAL", "Globals", "homes", "printers", "PRINT$"] {
            assert!(reserved_share_name(n), "{n}");
        }
        for n in ["photos", "global2", "home"] {
            assert!(!reserved_share_name(n), "{n}");
        }
    }

    #[test]
    fn reserved_and_duplicate_users_are_left_out_and_reported() {
        let mut problems = Vec::new();
        let kept = usable_users(
            vec![
                user("root", 0, 0),
                user("alice", 1001, 1001),
                user("bob", 1002, 1002),
                // Another pool's alice with other ids: neither may log in.
                user("alice", 2001, 2001),
                user("alice", 1001, 1001),
                // The same bob in another pool: one bob.
                user("bob", 1002, 1002),
                user("guest", 65534, 65534),
                user("carol", 1003, 0),
                user("Bad:Name", 1004, 1004),
                SmbUser {
                    nt_hash: "not hex".into(),
                    ..user("dave", 1005, 1005)
                },
            ],
            &mut problems,
        );
        let names: Vec<&str> = kept.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["bob"]);
        assert_eq!(problems.len(), 6, "{problems:?}");
        assert!(problems.iter().any(|p| p.contains("two pools")));
    }
}
