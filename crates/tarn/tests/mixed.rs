//! Concurrency across the front ends: one dataset of a raidz1 pool is
//! exported at once over FUSE (mounted by the daemon), NFS and WebDAV, and
//! real clients of each kind work on it in parallel — FUSE threads using
//! the mountpoint, libnfs's `nfs-cp`/`nfs-cat`, curl speaking WebDAV —
//! while an admin loop commits transaction groups (`pool sync`, and a one
//! second txg interval), takes and destroys snapshots and starts scrubs.
//!
//! Each client owns the names with its prefix (`fuse0-…`, `nfs2-…`) and
//! keeps a model of what it holds: it writes seeded data, reads every write
//! back through its own protocol, overwrites, renames files and its folder,
//! deletes, and every operation must succeed. libnfs's tools can only
//! create: `nfs-cp` creates with O_EXCL (GUARDED, so it never overwrites)
//! and nothing renames or deletes, so NFS clients create and read. Files a
//! client will never touch again are "sealed" and published; other clients
//! read them through their own, different protocol while the load goes on.
//! libnfs takes a URL's folder as the export to mount and tarn exports only
//! a share's top, so NFS reads files at the top; a share's subfolders are
//! checked over NFS by listing (names and sizes).
//!
//! Then it checks, exactly:
//! - a final scrub finds nothing to repair and the pool is healthy, with no
//!   read, write or checksum error on any device;
//! - the whole tree (every name, every byte) seen through FUSE, NFS and
//!   WebDAV is the union of the clients' models: nothing missing, nothing
//!   extra, nothing different;
//! - after a daemon restart FUSE and WebDAV show the same tree, and every
//!   snapshot kept holds every file sealed before it was taken, byte for
//!   byte, and otherwise only names some client used, each holding bytes
//!   some client wrote there (a write caught half-way shows a prefix, with
//!   zeros where later parts of it had not arrived yet);
//! - the daemon never panicked.
//!
//! `TARN_MIXED_SEED` (decimal or `0x` hex) replays every client's choices
//! and data; the interleaving is the machine's.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::clients::add_user;
use common::process::{files, Daemon};
use tarn_testkit::clients::{curl, nfs_cat, nfs_cp, nfs_url, tool, write_file};
use tarn_testkit::data::{env_seed, random_seed, Rng};
use tarn_testkit::net::free_port;
use tarn_testkit::require::{self, is_mounted};

const POOL: &str = "tank";
const DATASET: &str = "tank/mixed";
const SHARE: &str = "mixed";
const USER: &str = "carol";
const PASSWORD: &str = "all-at-once";
/// The uid `user add` gives the first user, which NFS clients are squashed
/// to, so they and WebDAV act as the same owner of the share.
const UID: &str = "10000";

const FUSE_CLIENTS: usize = 4;
const NFS_CLIENTS: usize = 3;
const DAV_CLIENTS: usize = 3;
/// Rounds of each client: one new file a round, and one more operation.
const ROUNDS: usize = 30;
/// How long the whole test may take before it counts as hung.
const LIMIT: Duration = Duration::from_secs(120);

/// A front end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Proto {
    Fuse,
    Nfs,
    Dav,
}

/// Where the dataset is reached, and a scratch folder for the files
/// `nfs-cp` and curl upload.
struct Env {
    mnt: PathBuf,
    nfs: u16,
    dav: u16,
    scratch: PathBuf,
}

impl Env {
    fn nfs_url(&self, rel: &str) -> String {
        nfs_url(self.nfs, self.nfs, &format!("/{SHARE}/{rel}"))
    }

    fn dav_url(&self, rel: &str) -> String {
        format!("http://127.0.0.1:{}/{SHARE}/{rel}", self.dav)
    }

    /// A WebDAV request as the share's user: status and body.
    fn dav(&self, args: &[&str]) -> (u16, Vec<u8>) {
        let creds = format!("{USER}:{PASSWORD}");
        let mut all = vec!["-u", creds.as_str()];
        all.extend_from_slice(args);
        let (code, body, _) = curl(&all);
        (code, body)
    }

    /// `rel` read through `proto`, which must succeed.
    fn read(&self, proto: Proto, rel: &str) -> Vec<u8> {
        match proto {
            Proto::Fuse => std::fs::read(self.mnt.join(rel))
                .unwrap_or_else(|e| panic!("read {rel} through FUSE: {e}")),
            Proto::Nfs => nfs_cat(&self.nfs_url(rel)),
            Proto::Dav => {
                let (code, body) = self.dav(&[&self.dav_url(rel)]);
                assert_eq!(code, 200, "GET {rel}");
                body
            }
        }
    }

    /// The entries of folder `dir` (`""` for the top, else ending in `/`)
    /// through `proto`, as paths below the top with a `/` after folders,
    /// in the order listed; `.snapshot` is left out. Over NFS only the top
    /// can be listed alone (see above).
    fn list(&self, proto: Proto, dir: &str) -> Vec<String> {
        match proto {
            Proto::Fuse => fuse_list(&self.mnt, dir),
            Proto::Nfs => {
                assert_eq!(dir, "", "NFS lists the top");
                self.nfs_list(false).into_iter().map(|(n, _)| n).collect()
            }
            Proto::Dav => self.dav_list(dir),
        }
    }

    /// Every file and folder below the top through `proto`, each listed
    /// once.
    fn walk(&self, proto: Proto) -> BTreeSet<String> {
        match proto {
            Proto::Nfs => once(proto, self.nfs_list(true).into_iter().map(|(n, _)| n)),
            _ => walk(proto, |dir| self.list(proto, dir)),
        }
    }

    /// `nfs-ls` (with `-R`, of the whole tree) of the share's top: paths
    /// (folders with a trailing `/`) and sizes. Lines end in size and path.
    fn nfs_list(&self, recursive: bool) -> Vec<(String, u64)> {
        let url = self.nfs_url("");
        let args = if recursive {
            vec!["nfs-ls", "-R", &url]
        } else {
            vec!["nfs-ls", &url]
        };
        let (ok, out, err) = tool(&args);
        assert!(ok, "nfs-ls: {err}");
        let text = String::from_utf8_lossy(&out);
        text.lines()
            .map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                let (Some(path), Some(size)) = (w.last(), w.len().checked_sub(2)) else {
                    panic!("nfs-ls line {l:?}");
                };
                let size = w[size]
                    .parse()
                    .unwrap_or_else(|_| panic!("nfs-ls line {l:?}"));
                if l.starts_with('d') {
                    (format!("{path}/"), size)
                } else {
                    (path.to_string(), size)
                }
            })
            .collect()
    }

    /// A `Depth: 1` PROPFIND of `dir` (the server refuses `infinity`).
    fn dav_list(&self, dir: &str) -> Vec<String> {
        let top = format!("/{SHARE}/");
        let url = self.dav_url(dir);
        let (code, body) = self.dav(&["-X", "PROPFIND", "-H", "Depth: 1", &url]);
        let body = String::from_utf8_lossy(&body);
        assert_eq!(code, 207, "PROPFIND {dir:?}: {body}");
        body.split("<D:href>")
            .skip(1)
            .filter_map(|s| s.split("</D:href>").next())
            .map(|h| {
                h.strip_prefix(top.as_str())
                    .unwrap_or_else(|| panic!("PROPFIND {dir:?}: href {h}"))
            })
            .filter(|rel| *rel != dir)
            .map(String::from)
            .collect()
    }
}

/// The entries of folder `dir` below `top` through FUSE, as [`Env::list`]
/// gives them.
fn fuse_list(top: &Path, dir: &str) -> Vec<String> {
    let entries = std::fs::read_dir(top.join(dir))
        .unwrap_or_else(|e| panic!("list {dir:?} through FUSE: {e}"));
    let mut out = Vec::new();
    for e in entries {
        let e = e.unwrap_or_else(|e| panic!("list {dir:?} through FUSE: {e}"));
        let name = format!("{dir}{}", e.file_name().to_string_lossy());
        if name == ".snapshot" {
            continue;
        }
        if e.file_type().unwrap().is_dir() {
            out.push(format!("{name}/"));
        } else {
            out.push(name);
        }
    }
    out
}

/// Every path below the top, from `list` of each folder down from it.
fn walk(proto: Proto, list: impl Fn(&str) -> Vec<String>) -> BTreeSet<String> {
    let mut all = Vec::new();
    let mut todo = vec![String::new()];
    while let Some(dir) = todo.pop() {
        let entries = list(&dir);
        todo.extend(entries.iter().filter(|n| n.ends_with('/')).cloned());
        all.extend(entries);
    }
    once(proto, all.into_iter())
}

/// `names` as a set; fails if `proto` listed one twice.
fn once(proto: Proto, names: impl Iterator<Item = String>) -> BTreeSet<String> {
    let mut set = BTreeSet::new();
    for n in names {
        let again = n.clone();
        assert!(set.insert(n), "{proto:?} lists {again} twice");
    }
    set
}

/// A file no client will touch again, published for the others to read.
#[derive(Clone)]
struct Sealed {
    rel: String,
    by: Proto,
    bytes: Vec<u8>,
}

/// What the clients share: the sealed files, in the order sealed.
#[derive(Default)]
struct Board {
    sealed: Mutex<Vec<Sealed>>,
}

/// What a client leaves: its files, its folders, and every version each
/// name ever held and every folder name it ever used (for snapshots).
#[derive(Default)]
struct Model {
    files: BTreeMap<String, Vec<u8>>,
    dirs: BTreeSet<String>,
    history: BTreeMap<String, Vec<Vec<u8>>>,
    dirs_ever: BTreeSet<String>,
}

impl Model {
    fn merge(&mut self, other: Model) {
        self.files.extend(other.files);
        self.dirs.extend(other.dirs);
        for (k, mut v) in other.history {
            self.history.entry(k).or_default().append(&mut v);
        }
        self.dirs_ever.extend(other.dirs_ever);
    }

    /// Files and folders as the trees list them.
    fn names(&self) -> BTreeSet<String> {
        self.files
            .keys()
            .cloned()
            .chain(self.dirs.iter().cloned())
            .collect()
    }
}

/// One client: its protocol, its own names, its generator and model.
struct Client<'a> {
    proto: Proto,
    name: String,
    seed: u64,
    env: &'a Env,
    board: &'a Board,
    rng: Rng,
    /// Files it may still change.
    live: BTreeMap<String, Vec<u8>>,
    /// Files it sealed.
    sealed: BTreeMap<String, Vec<u8>>,
    /// Which name its folder (FUSE and WebDAV) has now: `NAME-dSUB`.
    sub: usize,
    history: BTreeMap<String, Vec<Vec<u8>>>,
    dirs_ever: BTreeSet<String>,
    round: usize,
    cross_reads: usize,
}

/// A length that lands on and around block and record edges.
fn size(rng: &mut Rng) -> usize {
    match rng.below(8) {
        0 => rng.below(3) as usize,
        1 => rng.range(4095, 4098) as usize,
        2 | 3 => rng.range(5_000, 60_000) as usize,
        4 | 5 => rng.range(60_000, 200_000) as usize,
        6 => 131_072,
        _ => rng.range(200_000, 500_000) as usize,
    }
}

impl<'a> Client<'a> {
    fn new(proto: Proto, index: usize, seed: u64, env: &'a Env, board: &'a Board) -> Self {
        let name = format!(
            "{}{index}",
            match proto {
                Proto::Fuse => "fuse",
                Proto::Nfs => "nfs",
                Proto::Dav => "dav",
            }
        );
        let tag = seed ^ (proto as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index as u64;
        Client {
            proto,
            name,
            seed,
            env,
            board,
            rng: Rng::new(tag),
            live: BTreeMap::new(),
            sealed: BTreeMap::new(),
            sub: 0,
            history: BTreeMap::new(),
            dirs_ever: BTreeSet::new(),
            round: 0,
            cross_reads: 0,
        }
    }

    /// Who and where, for failure messages.
    fn ctx(&self) -> String {
        format!(
            "{} round {} (TARN_MIXED_SEED={:#x})",
            self.name, self.round, self.seed
        )
    }

    /// Its folder (FUSE and WebDAV clients have one).
    fn subdir(&self) -> String {
        format!("{}-d{}", self.name, self.sub)
    }

    /// Runs its rounds; returns its model.
    fn run(mut self) -> Model {
        if self.proto != Proto::Nfs {
            self.mkdir(&self.subdir());
        }
        for round in 0..ROUNDS {
            self.round = round;
            self.create();
            match (self.proto, self.rng.below(10)) {
                (Proto::Nfs, 0..=5) => self.seal(),
                // Published later: sealing early or late both happen.
                (Proto::Nfs, _) => {}
                (_, 0..=2) => self.overwrite(),
                (_, 3 | 4) => self.rename(),
                (_, 5) => self.delete(),
                _ => self.seal(),
            }
            if self.proto != Proto::Nfs && round % 5 == 4 {
                self.rename_subdir();
            }
            self.cross_read();
            if round % 3 == 2 {
                self.check_listing();
            }
        }
        // Everything it holds is final now.
        let names: Vec<String> = self.live.keys().cloned().collect();
        for rel in names {
            self.seal_one(&rel);
        }
        eprintln!(
            "{}: {} files, {} cross-reads",
            self.name,
            self.sealed.len(),
            self.cross_reads
        );
        let mut dirs = BTreeSet::new();
        if self.proto != Proto::Nfs {
            dirs.insert(format!("{}/", self.subdir()));
        }
        Model {
            files: self.sealed,
            dirs,
            history: self.history,
            dirs_ever: self.dirs_ever,
        }
    }

    fn mkdir(&mut self, rel: &str) {
        match self.proto {
            Proto::Fuse => std::fs::create_dir(self.env.mnt.join(rel))
                .unwrap_or_else(|e| panic!("{}: mkdir {rel}: {e}", self.ctx())),
            Proto::Dav => {
                let (code, _) = self.env.dav(&["-X", "MKCOL", &self.env.dav_url(rel)]);
                assert_eq!(code, 201, "{}: MKCOL {rel}", self.ctx());
            }
            Proto::Nfs => unreachable!("libnfs's tools make no folders"),
        }
        self.dirs_ever.insert(format!("{rel}/"));
    }

    /// Writes `bytes` to `rel` (new or not) through its protocol and reads
    /// them back through it.
    fn put(&mut self, rel: &str, bytes: Vec<u8>, new: bool) {
        match self.proto {
            Proto::Fuse => std::fs::write(self.env.mnt.join(rel), &bytes)
                .unwrap_or_else(|e| panic!("{}: write {rel}: {e}", self.ctx())),
            Proto::Nfs => {
                let src = write_file(&self.env.scratch, &self.name, &bytes);
                let ok = nfs_cp(&src, &self.env.nfs_url(rel));
                assert!(ok, "{}: nfs-cp to {rel}", self.ctx());
            }
            Proto::Dav => {
                let src = write_file(&self.env.scratch, &self.name, &bytes);
                let (code, _) = self.env.dav(&["-T", &src, &self.env.dav_url(rel)]);
                let want = if new { 201 } else { 204 };
                assert_eq!(code, want, "{}: PUT {rel}", self.ctx());
            }
        }
        let back = self.env.read(self.proto, rel);
        assert!(
            back == bytes,
            "{}: {rel} reads back {} bytes, not the {} written",
            self.ctx(),
            back.len(),
            bytes.len()
        );
        self.hold(rel.to_string(), bytes);
    }

    /// `rel` holds `bytes` now.
    fn hold(&mut self, rel: String, bytes: Vec<u8>) {
        self.history
            .entry(rel.clone())
            .or_default()
            .push(bytes.clone());
        self.live.insert(rel, bytes);
    }

    fn data(&mut self) -> Vec<u8> {
        let len = size(&mut self.rng);
        self.rng.mixed(len).0
    }

    /// A new file: in its folder or subfolder (NFS: at the top, by prefix).
    fn create(&mut self) {
        let rel = match self.proto {
            Proto::Nfs => format!("{}-f{}", self.name, self.round),
            _ if self.rng.chance(0.5) => format!("{}/f{}", self.subdir(), self.round),
            _ => format!("{}-f{}", self.name, self.round),
        };
        let bytes = self.data();
        self.put(&rel, bytes, true);
    }

    fn pick_live(&mut self) -> Option<String> {
        let names: Vec<String> = self.live.keys().cloned().collect();
        (!names.is_empty()).then(|| self.rng.pick(&names).clone())
    }

    fn overwrite(&mut self) {
        if let Some(rel) = self.pick_live() {
            let bytes = self.data();
            self.put(&rel, bytes, false);
        }
    }

    /// Checks through its protocol that `rel` is gone.
    fn gone(&self, rel: &str) {
        match self.proto {
            Proto::Fuse => {
                let e = std::fs::symlink_metadata(self.env.mnt.join(rel));
                assert!(
                    matches!(&e, Err(e) if e.kind() == std::io::ErrorKind::NotFound),
                    "{}: {rel} is still there: {e:?}",
                    self.ctx()
                );
            }
            Proto::Dav => {
                let (code, _) = self.env.dav(&[&self.env.dav_url(rel)]);
                assert_eq!(code, 404, "{}: {rel} is still there", self.ctx());
            }
            Proto::Nfs => unreachable!(),
        }
    }

    /// Moves a live file to a new name, in the folder or at the top.
    fn rename(&mut self) {
        let Some(from) = self.pick_live() else {
            return;
        };
        let to = if self.rng.chance(0.5) {
            format!("{}/m{}", self.subdir(), self.round)
        } else {
            format!("{}-m{}", self.name, self.round)
        };
        self.mv(&from, &to, "");
        self.moved(&from, to);
    }

    fn delete(&mut self) {
        let Some(rel) = self.pick_live() else {
            return;
        };
        match self.proto {
            Proto::Fuse => std::fs::remove_file(self.env.mnt.join(&rel))
                .unwrap_or_else(|e| panic!("{}: remove {rel}: {e}", self.ctx())),
            Proto::Dav => {
                let (code, _) = self.env.dav(&["-X", "DELETE", &self.env.dav_url(&rel)]);
                assert_eq!(code, 204, "{}: DELETE {rel}", self.ctx());
            }
            Proto::Nfs => unreachable!("libnfs's tools cannot delete"),
        }
        self.live.remove(&rel);
        self.gone(&rel);
    }

    /// Renames its folder, with the files in it.
    fn rename_subdir(&mut self) {
        let from = self.subdir();
        self.sub += 1;
        let to = self.subdir();
        self.mv(&from, &to, "/");
        self.dirs_ever.insert(format!("{to}/"));
        let prefix = format!("{from}/");
        let inside: Vec<String> = self
            .live
            .keys()
            .filter(|k| k.starts_with(&prefix))
            .cloned()
            .collect();
        for old in inside {
            let new = format!("{to}/{}", &old[prefix.len()..]);
            self.moved(&old, new);
        }
    }

    /// Renames `from` to `to` through its protocol (`slash` is "/" for a
    /// folder, for WebDAV's URLs), and checks that `from` is gone.
    fn mv(&self, from: &str, to: &str, slash: &str) {
        match self.proto {
            Proto::Fuse => std::fs::rename(self.env.mnt.join(from), self.env.mnt.join(to))
                .unwrap_or_else(|e| panic!("{}: rename {from} {to}: {e}", self.ctx())),
            Proto::Dav => {
                let dest = format!("Destination: {}{slash}", self.env.dav_url(to));
                let url = format!("{}{slash}", self.env.dav_url(from));
                let (code, _) = self.env.dav(&["-X", "MOVE", "-H", &dest, &url]);
                assert_eq!(code, 201, "{}: MOVE {from} {to}", self.ctx());
            }
            Proto::Nfs => unreachable!("libnfs's tools cannot rename"),
        }
        self.gone(from);
    }

    /// The model after the live file `from` moved to `to`, which must read
    /// back the same.
    fn moved(&mut self, from: &str, to: String) {
        let bytes = self.live.remove(from).unwrap();
        let back = self.env.read(self.proto, &to);
        assert!(
            back == bytes,
            "{}: {from} moved to {to} differs",
            self.ctx()
        );
        self.hold(to, bytes);
    }

    /// Seals a live file outside the renamable subfolder.
    fn seal(&mut self) {
        let sub = format!("{}/", self.subdir());
        let names: Vec<String> = self
            .live
            .keys()
            .filter(|k| !k.starts_with(&sub))
            .cloned()
            .collect();
        if !names.is_empty() {
            let rel = self.rng.pick(&names).clone();
            self.seal_one(&rel);
        }
    }

    fn seal_one(&mut self, rel: &str) {
        let bytes = self.live.remove(rel).unwrap();
        self.board.sealed.lock().unwrap().push(Sealed {
            rel: rel.to_string(),
            by: self.proto,
            bytes: bytes.clone(),
        });
        self.sealed.insert(rel.to_string(), bytes);
    }

    /// Lists the top through its protocol while the others change it: the
    /// names there with its prefix are exactly the ones it holds, each
    /// listed once.
    fn check_listing(&self) {
        let own = format!("{}-", self.name);
        let mine = self
            .env
            .list(self.proto, "")
            .into_iter()
            .filter(|n| n.starts_with(&own));
        let got = once(self.proto, mine);
        let mut want: BTreeSet<String> = self
            .live
            .keys()
            .chain(self.sealed.keys())
            .filter(|k| !k.contains('/'))
            .cloned()
            .collect();
        if self.proto != Proto::Nfs {
            want.insert(format!("{}/", self.subdir()));
        }
        assert_eq!(got, want, "{}: its names at the top", self.ctx());
    }

    /// Reads a file another front end sealed, through its own protocol
    /// (NFS: one at the top, see above).
    fn cross_read(&mut self) {
        let theirs: Vec<Sealed> = self
            .board
            .sealed
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.by != self.proto)
            .filter(|s| self.proto != Proto::Nfs || !s.rel.contains('/'))
            .cloned()
            .collect();
        if theirs.is_empty() {
            return;
        }
        let s = self.rng.pick(&theirs);
        let got = self.env.read(self.proto, &s.rel);
        assert!(
            got == s.bytes,
            "{}: {} sealed by {:?} reads {} bytes through {:?}, {} written",
            self.ctx(),
            s.rel,
            s.by,
            got.len(),
            self.proto,
            s.bytes.len()
        );
        self.cross_reads += 1;
    }
}

/// The pool's status as JSON (its one entry).
fn status(d: &Daemon) -> serde_json::Value {
    let out = d.ok(&["-o", "json", "pool", "status", POOL]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v[0].clone()
}

/// Healthy: ONLINE, nothing damaged, no scan error, and no read, write or
/// checksum error on any device.
fn assert_healthy(st: &serde_json::Value, when: &str) {
    assert_eq!(st["health"], "ONLINE", "{when}: {st}");
    assert_eq!(st["damaged"], serde_json::json!([]), "{when}: {st}");
    if !st["scan"].is_null() {
        assert_eq!(st["scan"]["errors"], 0, "{when}: {st}");
    }
    let mut todo: Vec<&serde_json::Value> = st["vdevs"].as_array().unwrap().iter().collect();
    while let Some(v) = todo.pop() {
        for c in ["read_errors", "write_errors", "cksum_errors"] {
            assert_eq!(v["counters"][c], 0, "{when}: {c} on {}: {st}", v["name"]);
        }
        todo.extend(v["children"].as_array().into_iter().flatten());
    }
}

/// A snapshot and how many files were sealed before it was asked for.
struct Snap {
    name: String,
    sealed_before: usize,
}

/// Syncs, snapshots (keeping one in three), scrubs and checks health in a
/// loop until told to stop; returns the snapshots kept.
fn admin(d: &Daemon, board: &Board, stop: &mpsc::Receiver<()>) -> Vec<Snap> {
    let mut kept = Vec::new();
    let (mut scrubs, mut round) = (0, 0);
    loop {
        d.ok(&["pool", "sync", POOL]);
        let sealed_before = board.sealed.lock().unwrap().len();
        let name = format!("{DATASET}@s{round}");
        d.ok(&["snapshot", &name]);
        if round % 3 == 0 {
            kept.push(Snap {
                name: format!("s{round}"),
                sealed_before,
            });
        } else if round % 3 == 2 {
            d.ok(&["destroy", &format!("{DATASET}@s{}", round - 1)]);
            d.ok(&["destroy", &name]);
        }
        if round % 2 == 0 {
            let o = d.tarn(&["pool", "scrub", POOL]);
            let err = String::from_utf8_lossy(&o.stderr);
            if o.status.success() {
                scrubs += 1;
            } else {
                assert!(err.contains("already running"), "scrub: {err}");
            }
        }
        assert_healthy(&status(d), &format!("admin round {round}"));
        round += 1;
        match stop.recv_timeout(Duration::from_millis(150)) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => break,
        }
    }
    eprintln!(
        "admin: {round} rounds, {} snapshots kept, {scrubs} scrubs started",
        kept.len()
    );
    kept
}

/// `snap` as FUSE shows it under `.snapshot`: every file sealed before it
/// was taken, exactly; otherwise only names and folders some client used,
/// each file a prefix of a version written there (zeros where later parts
/// of the write had not arrived). Returns how many files it holds.
fn check_snapshot(mnt: &Path, snap: &Snap, sealed: &[Sealed], all: &Model) -> usize {
    let top = mnt.join(".snapshot").join(&snap.name);
    let mut files = BTreeMap::new();
    for n in walk(Proto::Fuse, |dir| fuse_list(&top, dir)) {
        if n.ends_with('/') {
            assert!(all.dirs_ever.contains(&n), "@{}: folder {n}", snap.name);
        } else {
            let got = std::fs::read(top.join(&n)).unwrap();
            files.insert(n, got);
        }
    }
    for s in &sealed[..snap.sealed_before] {
        let got = files.get(&s.rel);
        assert!(
            got == Some(&s.bytes),
            "@{}: {}, sealed before it was taken, is {}",
            snap.name,
            s.rel,
            got.map_or("missing".into(), |g| format!(
                "{} bytes, not {}",
                g.len(),
                s.bytes.len()
            ))
        );
    }
    for (n, got) in &files {
        let versions = all
            .history
            .get(n)
            .unwrap_or_else(|| panic!("@{}: {n} was never written", snap.name));
        let fits =
            |v: &Vec<u8>| got.len() <= v.len() && got.iter().zip(v).all(|(a, b)| a == b || *a == 0);
        assert!(
            versions.iter().any(fits),
            "@{}: {n} ({} bytes) holds no version written there",
            snap.name,
            got.len()
        );
    }
    files.len()
}

/// The tree seen through `proto` is exactly `want`: the same names, each
/// file with the same bytes (over NFS, files below the top by size).
fn check_tree(env: &Env, proto: Proto, want: &Model, when: &str) {
    let names = env.walk(proto);
    let nfs_sizes: Option<BTreeMap<String, u64>> =
        (proto == Proto::Nfs).then(|| env.nfs_list(true).into_iter().collect());
    let wanted = want.names();
    let missing: Vec<&String> = wanted.difference(&names).collect();
    let extra: Vec<&String> = names.difference(&wanted).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{when}, {proto:?}: missing {missing:?}, extra {extra:?}"
    );
    for (rel, bytes) in &want.files {
        if let (Some(sizes), true) = (&nfs_sizes, rel.contains('/')) {
            assert_eq!(sizes[rel], bytes.len() as u64, "{when}, NFS: {rel}'s size");
            continue;
        }
        let got = env.read(proto, rel);
        assert!(
            got == *bytes,
            "{when}, {proto:?}: {rel} has {} bytes, {} written",
            got.len(),
            bytes.len()
        );
    }
}

/// Kills the daemon whose pid `pid` holds if the test still runs after
/// [`LIMIT`] (dropping the sender ends the watch): a hang then fails the
/// test, as the clients' mounts and connections die, instead of stalling.
fn watchdog(pid: Arc<AtomicU32>) -> mpsc::Sender<()> {
    let (tx, rx) = mpsc::channel::<()>();
    thread::spawn(move || {
        if let Err(RecvTimeoutError::Timeout) = rx.recv_timeout(LIMIT) {
            let p = pid.load(Ordering::SeqCst);
            eprintln!("hung: the test ran past {LIMIT:?}; killing the daemon (pid {p})");
            // SAFETY: kill(2) of the daemon this test spawned and has not
            // reaped (it is reaped only after a clean stop, and the pid is
            // replaced when the daemon is started again).
            unsafe { libc::kill(p as libc::pid_t, libc::SIGKILL) };
        }
    });
    tx
}

#[test]
fn clients_of_every_front_end_at_once_with_syncs_scrubs_and_snapshots() {
    let (Some(_), true, true) = (
        require::program("curl"),
        tarn_testkit::clients::nfs_tools(),
        require::fuse(),
    ) else {
        return;
    };
    let t0 = Instant::now();
    let seed = env_seed("TARN_MIXED_SEED").unwrap_or_else(random_seed);
    eprintln!("TARN_MIXED_SEED={seed:#x}");
    let dir = tempfile::tempdir().unwrap();
    let (nfs, dav) = (free_port(), free_port());
    let nfs_arg = format!("127.0.0.1:{nfs}");
    let dav_arg = format!("127.0.0.1:{dav}");
    let args = [
        "--nfs",
        nfs_arg.as_str(),
        "--webdav",
        dav_arg.as_str(),
        "--txg-interval",
        "1",
    ];
    let log = dir.path().join("daemon.log");
    let mut d = Daemon::start_logged(dir.path(), &args, &log);
    let pid = Arc::new(AtomicU32::new(d.child.id()));
    let _watch = watchdog(pid.clone());
    let f = files(dir.path(), "m", 4, 256 << 20);
    d.ok(&["pool", "create", POOL, "raidz1", &f[0], &f[1], &f[2], &f[3]]);
    let mnt = dir.path().join("mnt");
    let mp = format!("mountpoint={}", mnt.display());
    d.ok(&["dataset", "create", "-o", &mp, DATASET]);
    assert!(is_mounted(&mnt), "the dataset is mounted");
    add_user(&d, USER, PASSWORD);
    d.ok(&[
        "share",
        "add",
        SHARE,
        DATASET,
        "--nfs",
        "127.0.0.1/32",
        "--all-squash",
        "--anon-uid",
        UID,
        "--anon-gid",
        UID,
        "--webdav",
        &format!("{USER}=rw"),
        "--owner",
        USER,
    ]);
    let scratch = dir.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let env = Env {
        mnt: mnt.clone(),
        nfs,
        dav,
        scratch,
    };
    let board = Board::default();

    // Everything at once.
    let (model, snaps) = thread::scope(|s| {
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let (d, board, env) = (&d, &board, &env);
        let admin = s.spawn(move || admin(d, board, &stop_rx));
        let mut clients = Vec::new();
        for (proto, n) in [
            (Proto::Fuse, FUSE_CLIENTS),
            (Proto::Nfs, NFS_CLIENTS),
            (Proto::Dav, DAV_CLIENTS),
        ] {
            for i in 0..n {
                let c = Client::new(proto, i, seed, env, board);
                clients.push(s.spawn(move || c.run()));
            }
        }
        let mut model = Model::default();
        let mut failed = None;
        for c in clients {
            match c.join() {
                Ok(m) => model.merge(m),
                Err(e) => failed = Some(e),
            }
        }
        drop(stop_tx);
        let snaps = admin.join();
        if let Some(e) = failed {
            std::panic::resume_unwind(e);
        }
        (
            model,
            snaps.unwrap_or_else(|e| std::panic::resume_unwind(e)),
        )
    });
    eprintln!(
        "load done after {:?}: {} files, {} folders",
        t0.elapsed(),
        model.files.len(),
        model.dirs.len()
    );

    // The admin loop's last scrub ends; a full scrub then finds nothing,
    // and the pool is healthy.
    let waited = Instant::now();
    while status(&d)["scan"]["state"] == "scanning" {
        assert!(waited.elapsed() < LIMIT, "the last scrub does not end");
        thread::sleep(Duration::from_millis(20));
    }
    let out = d.ok(&["-o", "json", "pool", "scrub", "--wait", POOL]);
    let scan: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (scan["errors"].as_u64(), scan["repaired_bytes"].as_u64()),
        (Some(0), Some(0)),
        "the final scrub: {scan}"
    );
    assert_healthy(&status(&d), "after the final scrub");

    // Every front end shows exactly the clients' files.
    for proto in [Proto::Fuse, Proto::Nfs, Proto::Dav] {
        check_tree(&env, proto, &model, "after the load");
    }
    eprintln!("verified after {:?}", t0.elapsed());

    // The same after a restart, and the snapshots kept hold what they must.
    d.stop();
    assert!(!is_mounted(&mnt), "daemon stop unmounts");
    d = Daemon::start_logged(dir.path(), &args, &dir.path().join("daemon2.log"));
    pid.store(d.child.id(), Ordering::SeqCst);
    assert!(is_mounted(&mnt), "a restarted daemon mounts the dataset");
    assert_healthy(&status(&d), "after the restart");
    check_tree(&env, Proto::Fuse, &model, "after the restart");
    check_tree(&env, Proto::Dav, &model, "after the restart");
    let sealed = board.sealed.lock().unwrap();
    let in_snapshots: usize = snaps
        .iter()
        .map(|snap| check_snapshot(&mnt, snap, &sealed, &model))
        .sum();
    d.stop();
    for l in [log, dir.path().join("daemon2.log")] {
        let text = std::fs::read_to_string(&l).unwrap();
        assert!(!text.contains("panicked"), "the daemon panicked: {text}");
    }
    eprintln!(
        "{} snapshots checked ({in_snapshots} files); done after {:?}",
        snaps.len(),
        t0.elapsed()
    );
}
