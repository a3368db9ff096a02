//! The file pages: browse, download (a file, or a folder as a streamed
//! ZIP), upload (chunked and resumable), rename, move, delete, new
//! folders, previous versions from snapshots with restore, for logged-in
//! users on their shares and for visitors through share links
//! (`links.rs`). docs/web.md describes it for users, docs/api.md the
//! endpoints.
//!
//! # Confinement
//!
//! Every path is walked from the share's root (or a link's folder) one
//! component at a time with the caller's filesystem credential, so the
//! filesystem's own permission checks apply at each step. A component
//! must be a plain name: `.`, `..`, an empty name, a name holding a `/`
//! (an encoded `%2F` in a URL) or a NUL, and `.snapshot` are refused
//! before any lookup. A symbolic link is never followed, wherever it is
//! on the path: it is listed as a link and cannot be opened here. So a
//! request can only reach what lies below its starting folder by
//! directory entries, and `..` tricks, encoded slashes and links that
//! point elsewhere all stop at the walk.
//!
//! # Uploads land whole or not at all
//!
//! An upload is a session: `start` names the folder, the file name and
//! the size and creates a hidden temporary file (`.tarn-upload-ID`) in
//! that folder; chunks are `PUT` at the offset the server reports (a
//! chunk at another offset is refused with the right one); bytes are
//! written as they arrive, so a dropped connection loses nothing that
//! reached the server and the client resumes from the reported offset.
//! When the last byte arrives the file is renamed onto its name (an
//! atomic rename in one directory) and the dataset is synced: the name
//! shows either nothing (or the old file) or the complete new one, never
//! a partial file, also across a crash (the rename commits after the
//! data it names). Before each chunk the temporary file is checked to
//! be the one the session made and as long as the session thinks; any
//! other state ends the session rather than guessing. Sessions idle for
//! [`UPLOAD_IDLE`] are ended and their temporary files removed.
//!
//! # Reads
//!
//! Files are streamed in 1 MiB reads. A read that fails (a checksum
//! error the pool could not repair) aborts the transfer: the client sees
//! a cut connection and a short body against its `Content-Length`, never
//! a complete-looking file. Files are sent as attachments unless they
//! are images, audio, video or plain text, always with `nosniff` and a
//! sandboxing Content-Security-Policy, so a stored HTML file cannot run
//! script on this origin (where the admin API lives).

use std::collections::HashMap;
use std::io::{self, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderMap, Method, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{json, Value};
use tarn_fs::{Attr, Cred, DynFs, FileKind, FsError, ROOT_INO};

use crate::{answer, error, random_hex, Resp, State, UserId};

/// One share as the file pages see it for one caller.
#[derive(Clone)]
pub struct FileShare {
    /// The share's name (the first component of its file URLs).
    pub name: String,
    /// Its filesystem.
    pub fs: Arc<dyn DynFs>,
    /// The filesystem identity the caller acts with.
    pub cred: Cred,
    /// Whether the caller may change files here (the share's access for
    /// them; the filesystem's permissions apply on top).
    pub writable: bool,
}

/// What a share link opens, as the daemon found it at this request (a
/// revoked or expired link, or one whose owner lost the share, has none).
#[derive(Clone)]
pub struct LinkGrant {
    /// The link's id (not its secret token).
    pub id: String,
    /// The share, with the link owner's credential.
    pub share: FileShare,
    /// The linked folder, relative to the share's root (`a/b`, or empty).
    pub path: String,
    /// Upload-only: visitors may add files and see nothing.
    pub upload: bool,
    /// Whether visitors must give the link's password first.
    pub password: bool,
    /// The user who made the link: its visitors' uploads count in that
    /// user's share of the server's limits.
    pub owner: UserId,
}

/// The daemon's side of the file pages.
pub trait WebFiles: Send + Sync + 'static {
    /// The shares `user` may open in the file pages now.
    fn shares(&self, user: &UserId) -> Vec<FileShare>;
    /// The link whose secret token this is, if it is live.
    fn link(&self, token: &str) -> Option<LinkGrant>;
    /// Whether `password` is the link's (blocks: hashed on purpose).
    fn link_password(&self, token: &str, password: &str) -> bool;
    /// Takes a snapshot of the dataset behind `user`'s share `share`
    /// before a restore replaces anything in it, so what the restore
    /// replaces stays a previous version; answers the snapshot's name.
    fn snapshot_before_restore(&self, user: &UserId, share: &str) -> Result<String, String>;
}

/// An upload session without a chunk for this long is ended.
pub const UPLOAD_IDLE: Duration = Duration::from_secs(24 * 3600);
/// Upload sessions one user may have open, counting those of the
/// visitors of the links the user made.
pub const UPLOADS_PER_OWNER: usize = 64;
/// Upload sessions open in all.
pub const MAX_UPLOADS: usize = 1024;
/// How often idle upload sessions are looked for.
pub const REAP_EVERY: Duration = Duration::from_secs(600);
/// A folder's left-over temporaries (of sessions a restart forgot) are
/// looked for at most this often, when an upload starts there.
const SWEEP_EVERY: Duration = Duration::from_secs(3600);
/// Time allowed between two pieces of an upload chunk's body.
pub const CHUNK_IDLE: Duration = Duration::from_secs(60);
/// Bytes gathered from the network before one filesystem write.
const WRITE_BATCH: usize = 1 << 20;
/// Bytes per filesystem read when streaming.
const READ_BATCH: u32 = 1 << 20;
/// Deepest folder a recursive walk (zip, delete, restore) goes.
const MAX_DEPTH: usize = 128;
/// Prefix of upload temporaries; hidden from listings and refused as a
/// name.
const UPLOAD_PREFIX: &str = ".tarn-upload-";
const RESTORE_PREFIX: &str = ".tarn-restore-";

/// Who acts: a logged-in user, or a visitor through a link (its id, and
/// the user who made it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Who {
    User(UserId),
    Link { id: String, owner: UserId },
}

impl Who {
    /// The user whose share of the server's limits an act counts in: a
    /// link's visitors count in its maker's, so that making links does
    /// not multiply what one user may hold.
    fn account(&self) -> &UserId {
        match self {
            Who::User(u) | Who::Link { owner: u, .. } => u,
        }
    }
}

/// What one request may do, and where.
#[derive(Clone)]
pub(crate) struct Scope {
    pub share: FileShare,
    /// The starting folder below the share's root.
    pub base: Vec<Vec<u8>>,
    /// Listing and reading.
    pub read: bool,
    /// Renaming, deleting, new folders, restoring, replacing files.
    pub modify: bool,
    /// Adding new files (uploads that never replace: upload links).
    pub add: bool,
    pub who: Who,
}

/// A refusal: HTTP status, a short code and a sentence.
#[derive(Debug)]
pub(crate) struct FErr {
    pub status: StatusCode,
    pub code: &'static str,
    pub msg: String,
}

impl FErr {
    pub fn new(status: StatusCode, code: &'static str, msg: impl Into<String>) -> FErr {
        FErr {
            status,
            code,
            msg: msg.into(),
        }
    }
    fn bad(msg: impl Into<String>) -> FErr {
        FErr::new(StatusCode::BAD_REQUEST, "invalid", msg)
    }
    fn forbidden(msg: impl Into<String>) -> FErr {
        FErr::new(StatusCode::FORBIDDEN, "forbidden", msg)
    }
    pub fn answer(&self, st: &State) -> Resp {
        error(st, self.status, self.code, &self.msg)
    }
}

impl From<FsError> for FErr {
    fn from(e: FsError) -> FErr {
        let (status, code) = match e.errno() {
            libc::ENOENT | libc::ENOTDIR => (StatusCode::NOT_FOUND, "not_found"),
            libc::EACCES | libc::EPERM | libc::EROFS => (StatusCode::FORBIDDEN, "forbidden"),
            libc::EEXIST | libc::ENOTEMPTY => (StatusCode::CONFLICT, "exists"),
            libc::ENOSPC | libc::EDQUOT => (StatusCode::INSUFFICIENT_STORAGE, "no_space"),
            libc::EINVAL | libc::ENAMETOOLONG | libc::EISDIR => {
                (StatusCode::BAD_REQUEST, "invalid")
            }
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "io"),
        };
        FErr::new(status, code, e.message().to_string())
    }
}

type FResult<T> = Result<T, FErr>;

/// Checks one path component (see the module docs).
fn component(c: &[u8]) -> FResult<()> {
    if c.is_empty() || c == b"." || c == b".." || c.contains(&b'/') || c.contains(&0) {
        return Err(FErr::bad(
            "a path may hold plain names only (no ., .. or /)",
        ));
    }
    if c == b".snapshot" {
        return Err(FErr::forbidden(
            "snapshots are reached through previous versions",
        ));
    }
    if hidden(c) {
        // Another session's upload or restore in progress: not a file
        // anyone may open, rename or replace until it is whole.
        return Err(FErr::forbidden("that name is a transfer in progress"));
    }
    if c.len() > 255 {
        return Err(FErr::bad("a name is longer than 255 bytes"));
    }
    Ok(())
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// The components of a URL path (percent-encoded, `/`-separated).
pub(crate) fn url_components(raw: &str) -> FResult<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for seg in raw.split('/').filter(|s| !s.is_empty()) {
        let b = seg.as_bytes();
        let mut c = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' {
                let v = b
                    .get(i + 1)
                    .and_then(|&h| hex(h))
                    .zip(b.get(i + 2).and_then(|&l| hex(l)))
                    .ok_or_else(|| FErr::bad("a bad %-escape in the path"))?;
                c.push(v.0 * 16 + v.1);
                i += 3;
            } else {
                c.push(b[i]);
                i += 1;
            }
        }
        component(&c)?;
        out.push(c);
    }
    Ok(out)
}

/// The components of a path given in a JSON body (`a/b/c`, not encoded).
pub(crate) fn json_components(path: &str) -> FResult<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        component(seg.as_bytes())?;
        out.push(seg.as_bytes().to_vec());
    }
    Ok(out)
}

/// A new name for a file or folder.
fn new_name(name: &str) -> FResult<Vec<u8>> {
    // component() refuses tarn's own temporary names too.
    component(name.as_bytes())?;
    Ok(name.as_bytes().to_vec())
}

fn hidden(name: &[u8]) -> bool {
    name.starts_with(UPLOAD_PREFIX.as_bytes()) || name.starts_with(RESTORE_PREFIX.as_bytes())
}

impl Scope {
    fn fs(&self) -> &dyn DynFs {
        &*self.share.fs
    }
    fn cred(&self) -> &Cred {
        &self.share.cred
    }

    /// Walks from `start` down `comps`, never through a symbolic link.
    fn walk_from(&self, start: Attr, comps: &[Vec<u8>]) -> FResult<Attr> {
        let mut cur = start;
        for c in comps {
            if cur.kind != FileKind::Directory {
                return Err(FErr::new(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    "a path component is not a folder",
                ));
            }
            cur = self.fs().lookup(cur.ino, c, self.cred())?;
            if cur.kind == FileKind::Symlink {
                return Err(FErr::forbidden("symbolic links are not followed here"));
            }
        }
        Ok(cur)
    }

    /// The base folder plus `comps`, in the live filesystem.
    fn walk(&self, comps: &[Vec<u8>]) -> FResult<Attr> {
        let root = self.fs().getattr(ROOT_INO)?;
        let base = self.walk_from(root, &self.base)?;
        if base.kind != FileKind::Directory {
            return Err(FErr::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "the linked folder is gone",
            ));
        }
        self.walk_from(base, comps)
    }

    /// The folder holding `comps`' last component, and that name.
    fn parent(&self, comps: &[Vec<u8>]) -> FResult<(Attr, Vec<u8>)> {
        let Some((name, dir)) = comps.split_last() else {
            return Err(FErr::forbidden("the top folder itself cannot be changed"));
        };
        let d = self.walk(dir)?;
        if d.kind != FileKind::Directory {
            return Err(FErr::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such folder",
            ));
        }
        Ok((d, name.clone()))
    }

    /// `comps` inside snapshot `snap` (the share root's snapshot).
    fn walk_snapshot(&self, snap: &str, comps: &[Vec<u8>]) -> FResult<Attr> {
        let sd = self.fs().lookup(ROOT_INO, b".snapshot", self.cred())?;
        let s = self.fs().lookup(sd.ino, snap.as_bytes(), self.cred())?;
        let mut all = self.base.clone();
        all.extend_from_slice(comps);
        self.walk_from(s, &all)
    }

    /// The file at `comps`, for a caller who may read.
    pub(crate) fn file_for_reading(&self, comps: &[Vec<u8>]) -> FResult<Attr> {
        self.need_read()?;
        self.walk(comps)
    }

    /// Whether the caller may read file `a`.
    pub(crate) fn may_read(&self, a: &Attr) -> FResult<()> {
        self.fs().access(a.ino, tarn_fs::R_OK, self.cred())?;
        Ok(())
    }

    /// All of file `a` (opened as the caller: its permissions apply).
    pub(crate) fn read_all(&self, a: &Attr) -> FResult<Vec<u8>> {
        self.fs().open(a.ino, libc::O_RDONLY, self.cred())?;
        let mut out = Vec::with_capacity(a.size as usize);
        let r = copy_out(self.fs(), a.ino, 0, a.size, &mut |b| {
            out.extend_from_slice(b);
            Ok(())
        });
        let _ = self.fs().release(a.ino);
        r.map_err(|e| FErr::new(StatusCode::INTERNAL_SERVER_ERROR, "io", e.to_string()))?;
        Ok(out)
    }

    fn need_read(&self) -> FResult<()> {
        if self.read {
            Ok(())
        } else {
            Err(FErr::forbidden("this link accepts uploads only"))
        }
    }

    fn need_modify(&self) -> FResult<()> {
        if self.modify && self.share.writable {
            Ok(())
        } else {
            Err(FErr::forbidden("you may not change files here"))
        }
    }
}

/// Every entry of a directory (without `.` and `..`) with attributes.
fn entries(fs: &dyn DynFs, dir: u64) -> FResult<Vec<(Vec<u8>, Attr)>> {
    let mut out = Vec::new();
    let mut cookie = 0;
    loop {
        let batch = fs.readdirplus(dir, cookie, 1024)?;
        let Some(last) = batch.last() else { break };
        cookie = last.0.cookie;
        for (e, a) in batch {
            if e.name != b"." && e.name != b".." {
                out.push((e.name, a));
            }
        }
    }
    Ok(out)
}

fn kind_name(k: FileKind) -> &'static str {
    match k {
        FileKind::Regular => "file",
        FileKind::Directory => "dir",
        FileKind::Symlink => "link",
        _ => "special",
    }
}

/// The listing of a folder (the caller must be allowed to read it).
pub(crate) fn list(scope: &Scope, comps: &[Vec<u8>]) -> FResult<Value> {
    scope.need_read()?;
    let d = scope.walk(comps)?;
    if d.kind != FileKind::Directory {
        return Err(FErr::bad("not a folder"));
    }
    scope.fs().access(d.ino, tarn_fs::R_OK | 1, scope.cred())?;
    let items: Vec<Value> = entries(scope.fs(), d.ino)?
        .into_iter()
        .filter(|(n, _)| !hidden(n))
        .map(|(n, a)| {
            let mut e = json!({
                "name": String::from_utf8_lossy(&n),
                "kind": kind_name(a.kind),
                "size": a.size,
                "mtime": a.mtime.sec,
                "ctime": a.ctime.sec,
            });
            if std::str::from_utf8(&n).is_err() {
                // Shown, but not to be acted on by its shown name (which
                // is not its real one): use SMB, NFS or WebDAV for it.
                e["bad_name"] = Value::Bool(true);
            }
            e
        })
        .collect();
    Ok(json!({"entries": items, "writable": scope.modify && scope.share.writable}))
}

/// A file's media type, and whether a browser may show it inline.
fn media_type(name: &[u8]) -> (&'static str, bool) {
    let ext = name
        .rsplit(|&b| b == b'.')
        .next()
        .map(|e| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_slice() {
        b"jpg" | b"jpeg" => ("image/jpeg", true),
        b"png" => ("image/png", true),
        b"gif" => ("image/gif", true),
        b"webp" => ("image/webp", true),
        b"avif" => ("image/avif", true),
        b"heic" => ("image/heic", false),
        b"mp4" | b"m4v" => ("video/mp4", true),
        b"webm" => ("video/webm", true),
        b"mov" => ("video/quicktime", true),
        b"mp3" => ("audio/mpeg", true),
        b"m4a" => ("audio/mp4", true),
        b"ogg" | b"oga" => ("audio/ogg", true),
        b"flac" => ("audio/flac", true),
        b"wav" => ("audio/wav", true),
        b"txt" | b"md" | b"log" => ("text/plain; charset=utf-8", true),
        b"pdf" => ("application/pdf", false),
        b"zip" => ("application/zip", false),
        _ => ("application/octet-stream", false),
    }
}

/// `Content-Disposition` for `name` (RFC 6266 with an RFC 5987 UTF-8
/// form, and an ASCII fallback).
fn disposition(kind: &str, name: &[u8]) -> String {
    let ascii: String = String::from_utf8_lossy(name)
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut enc = String::new();
    for &b in name {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            enc.push(b as char);
        } else {
            enc.push_str(&format!("%{b:02X}"));
        }
    }
    format!("{kind}; filename=\"{ascii}\"; filename*=UTF-8''{enc}")
}

/// A single byte range of a `Range` header over `size` bytes: Ok(None)
/// for none to honour (absent, several ranges, or one that does not parse
/// or runs backwards, which RFC 9110 says to ignore), Err for one that
/// cannot be met (it starts at or past the end).
fn range(headers: &HeaderMap, size: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(v) = headers.get(header::RANGE).and_then(|v| v.to_str().ok()) else {
        return Ok(None);
    };
    let Some(spec) = v.trim().strip_prefix("bytes=") else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((a, b)) = spec.split_once('-') else {
        return Ok(None);
    };
    let (a, b) = (a.trim(), b.trim());
    let (start, end) = if a.is_empty() {
        let Ok(n) = b.parse::<u64>() else {
            return Ok(None);
        };
        if n == 0 {
            return Err(());
        }
        (size.saturating_sub(n), size)
    } else {
        let Ok(s) = a.parse::<u64>() else {
            return Ok(None);
        };
        let e = if b.is_empty() {
            size
        } else {
            match b.parse::<u64>() {
                Ok(last) if last >= s => last.saturating_add(1).min(size),
                _ => return Ok(None),
            }
        };
        (s, e)
    };
    if start >= size || start >= end {
        return Err(());
    }
    Ok(Some((start, end)))
}

/// The strong validator of a file's contents as served: its inode, its
/// modification time to the nanosecond and its size.
fn etag(a: &tarn_fs::Attr) -> String {
    // The change time too: a rewrite in place that keeps the size and
    // sets the old mtime back (tools that fix a photo's metadata do)
    // must not let a resumed download splice old and new bytes.
    format!(
        "\"{}-{}.{:09}-{}.{:09}-{}\"",
        a.ino, a.mtime.sec, a.mtime.nsec, a.ctime.sec, a.ctime.nsec, a.size
    )
}

/// Whether a `Range` may be honoured: without `If-Range`, or with one
/// naming the file's current `etag` (a resumed download of the same
/// contents). A date, or another tag, means the file may have changed
/// since the client's first part: the whole file is sent instead.
fn if_range_holds(headers: &HeaderMap, etag: &str) -> bool {
    match headers.get(header::IF_RANGE) {
        None => true,
        Some(v) => v.to_str().is_ok_and(|v| v.trim() == etag),
    }
}

/// A response body fed from a blocking task through a channel; an error
/// item aborts the connection (no clean end for a cut-short stream).
pub(crate) struct ChanBody(pub tokio::sync::mpsc::Receiver<Result<Bytes, io::Error>>);

impl hyper::body::Body for ChanBody {
    type Data = Bytes;
    type Error = io::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, io::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|o| o.map(|r| r.map(hyper::body::Frame::data)))
    }
}

/// A `Write` into a [`ChanBody`], in pieces of a few hundred KiB.
struct ChanWriter {
    tx: tokio::sync::mpsc::Sender<Result<Bytes, io::Error>>,
    buf: Vec<u8>,
}

/// A client that takes nothing of a download for this long is dropped
/// (its blocking thread and open file are needed elsewhere).
pub const SEND_STALL: Duration = Duration::from_secs(120);

impl ChanWriter {
    /// Sends a piece, waiting while the client reads what came before
    /// (on a blocking thread: the runtime's handle waits for the
    /// channel).
    fn send(&mut self, b: Bytes) -> io::Result<()> {
        let tx = self.tx.clone();
        let sent = tokio::runtime::Handle::current()
            .block_on(async move { tokio::time::timeout(SEND_STALL, tx.send(Ok(b))).await });
        match sent {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the client went away",
            )),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client stopped reading",
            )),
        }
    }
}

impl Write for ChanWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= 256 << 10 {
            self.flush()?;
        }
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            let b = Bytes::from(std::mem::take(&mut self.buf));
            self.send(b)?;
        }
        Ok(())
    }
}

fn fs_io(e: FsError) -> io::Error {
    io::Error::other(e.to_string())
}

/// Reads `[start, end)` of an open file into `out`, a batch at a time.
fn copy_out(
    fs: &dyn DynFs,
    ino: u64,
    start: u64,
    end: u64,
    out: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> io::Result<()> {
    let mut at = start;
    while at < end {
        let n = (end - at).min(u64::from(READ_BATCH)) as u32;
        let data = fs.read_data(ino, at, n).map_err(fs_io)?;
        if data.is_empty() {
            return Err(io::Error::other(
                "the file became shorter while it was read",
            ));
        }
        for s in data.slices() {
            out(s)?;
        }
        at += data.len() as u64;
    }
    Ok(())
}

/// A streamed response: `produce` runs on a blocking thread writing into
/// the body; an error it returns cuts the connection.
fn streamed<F>(status: StatusCode, headers: Vec<(&'static str, String)>, produce: F) -> Resp
where
    F: FnOnce(&tokio::sync::mpsc::Sender<Result<Bytes, io::Error>>) -> io::Result<()>
        + Send
        + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    // A thread of its own, not one of the runtime's few blocking threads:
    // the producer waits for the client to read (up to SEND_STALL per
    // piece), and a few slow clients must not hold up every other
    // request (the callers bound how many run at once).
    let rt = tokio::runtime::Handle::current();
    let failed = tx.clone();
    let work = move || {
        let _rt = rt.enter();
        if let Err(e) = produce(&tx) {
            if e.kind() != io::ErrorKind::BrokenPipe {
                log::warn!("tarn-web: a download was cut short: {e}");
            }
            // The error item makes hyper cut the connection rather than
            // end the body cleanly.
            let tx = tx.clone();
            let _ = tokio::runtime::Handle::current()
                .block_on(async move { tokio::time::timeout(SEND_STALL, tx.send(Err(e))).await });
        }
    };
    if let Err(e) = std::thread::Builder::new()
        .name("tarn-web-zip".into())
        .spawn(work)
    {
        log::warn!("tarn-web: cannot start a download's thread: {e}");
        // Cut the connection: an empty body ending cleanly would pass for
        // a whole (empty) download.
        let _ = failed.try_send(Err(e));
    }
    respond_streamed(status, headers, rx)
}

/// The response whose body is what arrives on `rx`, with `headers` and
/// the headers every download carries.
fn respond_streamed(
    status: StatusCode,
    headers: Vec<(&'static str, String)>,
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, io::Error>>,
) -> Resp {
    let mut r = http::Response::new(ChanBody(rx).boxed_unsync());
    *r.status_mut() = status;
    let h = r.headers_mut();
    for (k, v) in headers {
        if let Ok(v) = http::HeaderValue::from_str(&v) {
            h.insert(k, v);
        }
    }
    for (k, v) in [
        ("x-content-type-options", "nosniff"),
        ("content-security-policy", "default-src 'none'; sandbox"),
        ("referrer-policy", "no-referrer"),
        ("cache-control", "private, no-cache"),
    ] {
        h.insert(k, http::HeaderValue::from_static(v));
    }
    r
}

/// A download of one file (with a single `Range`), or of a folder as a
/// ZIP stream.
pub(crate) fn download(
    scope: Scope,
    comps: &[Vec<u8>],
    headers: &HeaderMap,
    attachment: bool,
    zips: &Arc<tokio::sync::Semaphore>,
) -> FResult<Resp> {
    scope.need_read()?;
    let a = scope.walk(comps)?;
    let name = comps
        .last()
        .cloned()
        .or_else(|| scope.base.last().cloned())
        .unwrap_or_else(|| scope.share.name.as_bytes().to_vec());
    match a.kind {
        FileKind::Regular => {}
        FileKind::Directory => {
            let permit = zips.clone().try_acquire_owned().map_err(|_| {
                FErr::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "busy",
                    "too many folder downloads at once; try again in a moment",
                )
            })?;
            return Ok(zip_folder(scope, a, name, permit));
        }
        _ => return Err(FErr::bad("only files and folders can be downloaded")),
    }
    scope.fs().open(a.ino, libc::O_RDONLY, scope.cred())?;
    let (ctype, inline) = media_type(&name);
    let tag = etag(&a);
    let ranged = if if_range_holds(headers, &tag) {
        range(headers, a.size)
    } else {
        Ok(None)
    };
    let (status, start, end) = match ranged {
        Ok(None) => (StatusCode::OK, 0, a.size),
        Ok(Some((s, e))) => (StatusCode::PARTIAL_CONTENT, s, e),
        Err(()) => {
            let _ = scope.fs().release(a.ino);
            return Err(FErr::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "range",
                format!("the file has {} bytes", a.size),
            ));
        }
    };
    let mut hs = vec![
        ("content-type", ctype.to_string()),
        ("content-length", (end - start).to_string()),
        ("accept-ranges", "bytes".to_string()),
        ("etag", tag),
        (
            "content-disposition",
            disposition(
                if inline && !attachment {
                    "inline"
                } else {
                    "attachment"
                },
                &name,
            ),
        ),
    ];
    if status == StatusCode::PARTIAL_CONTENT {
        hs.push((
            "content-range",
            format!("bytes {start}-{}/{}", end - 1, a.size),
        ));
    }
    Ok(streamed_file(
        status,
        hs,
        scope.share.fs.clone(),
        a.ino,
        start..end,
    ))
}

/// The response of a file download: `range` of open file `ino`, read a
/// batch at a time on a blocking thread and sent from the runtime. A
/// client that stops reading holds a task, not one of the few blocking
/// threads every request needs (a handful of stalled downloads would
/// otherwise hold up every page and login for [`SEND_STALL`]). The file
/// is released when the download ends, however it ends.
fn streamed_file(
    status: StatusCode,
    headers: Vec<(&'static str, String)>,
    fs: Arc<dyn DynFs>,
    ino: u64,
    range: std::ops::Range<u64>,
) -> Resp {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        let read = |at: u64| {
            let (fs, n) = (
                fs.clone(),
                (range.end - at).min(u64::from(READ_BATCH)) as u32,
            );
            async move {
                let data = tokio::task::spawn_blocking(move || fs.read_data(ino, at, n))
                    .await
                    .map_err(|e| io::Error::other(e.to_string()))?
                    .map_err(fs_io)?;
                if data.is_empty() {
                    return Err(io::Error::other(
                        "the file became shorter while it was read",
                    ));
                }
                Ok::<_, io::Error>(Bytes::from(data.to_vec()))
            }
        };
        let mut at = range.start;
        let mut failed = None;
        while at < range.end {
            let b = match read(at).await {
                Ok(b) => b,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            at += b.len() as u64;
            match tokio::time::timeout(SEND_STALL, tx.send(Ok(b))).await {
                Ok(Ok(())) => {}
                // The client went away: nothing to tell it.
                Ok(Err(_)) => break,
                Err(_) => {
                    failed = Some(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client stopped reading",
                    ));
                    break;
                }
            }
        }
        let f = fs.clone();
        let _ = tokio::task::spawn_blocking(move || f.release(ino)).await;
        if let Some(e) = failed {
            log::warn!("tarn-web: a download was cut short: {e}");
            // The error item makes hyper cut the connection rather than
            // end the body cleanly.
            let _ = tokio::time::timeout(SEND_STALL, tx.send(Err(e))).await;
        }
    });
    respond_streamed(status, headers, rx)
}

/// Folder downloads streamed at once (each walks a tree and holds a
/// blocking thread).
pub const MAX_ZIPS: usize = 4;

fn zip_folder(
    scope: Scope,
    dir: Attr,
    name: Vec<u8>,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> Resp {
    let top = String::from_utf8_lossy(&name).to_string();
    let hs = vec![
        ("content-type", "application/zip".to_string()),
        (
            "content-disposition",
            disposition("attachment", format!("{top}.zip").as_bytes()),
        ),
    ];
    streamed(StatusCode::OK, hs, move |tx| {
        let _permit = permit;
        let w = ChanWriter {
            tx: tx.clone(),
            buf: Vec::new(),
        };
        let mut z = crate::zip::ZipWriter::new(w);
        let mut skipped = Vec::new();
        z.dir(&top, dir.mtime.sec)?;
        zip_dir(&scope, &mut z, dir.ino, &top, 0, &mut skipped)?;
        if !skipped.is_empty() {
            // What could not be read is said inside the archive, not left
            // for the user to discover as missing files.
            let mut note = String::from(
                "These were left out of this download (no permission to read them):\n",
            );
            for s in &skipped {
                note.push_str(s);
                note.push('\n');
            }
            z.start_file(&format!("{top}/tarn-skipped.txt"), dir.mtime.sec, None)?;
            z.write(note.as_bytes())?;
        }
        let mut w = z.finish()?;
        w.flush()
    })
}

fn zip_dir(
    scope: &Scope,
    z: &mut crate::zip::ZipWriter<ChanWriter>,
    dir: u64,
    prefix: &str,
    depth: usize,
    skipped: &mut Vec<String>,
) -> io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(io::Error::other("folders nested too deep"));
    }
    let fs = scope.fs();
    if fs.access(dir, tarn_fs::R_OK | 1, scope.cred()).is_err() {
        skipped.push(format!("{prefix}/"));
        return Ok(());
    }
    let mut list = entries(fs, dir).map_err(|e| io::Error::other(e.msg))?;
    list.sort_by(|a, b| a.0.cmp(&b.0));
    for (n, a) in list {
        if hidden(&n) {
            continue;
        }
        let path = format!("{prefix}/{}", String::from_utf8_lossy(&n));
        match a.kind {
            FileKind::Directory => {
                z.dir(&path, a.mtime.sec)?;
                zip_dir(scope, z, a.ino, &path, depth + 1, skipped)?;
            }
            FileKind::Regular => {
                if fs.open(a.ino, libc::O_RDONLY, scope.cred()).is_err() {
                    skipped.push(path);
                    continue;
                }
                // The size now, not the listing's: a file that grows while
                // it is zipped is taken as it is.
                let r = fs.getattr(a.ino).map_err(fs_io).and_then(|now| {
                    z.start_file(&path, a.mtime.sec, Some(now.size))?;
                    copy_out(fs, a.ino, 0, now.size, &mut |b| z.write(b))
                });
                let _ = fs.release(a.ino);
                r?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// The versions of a file or folder in the share's snapshots, newest
/// first: `{snapshot, time, size, mtime, kind}`.
pub(crate) fn versions(scope: &Scope, comps: &[Vec<u8>]) -> FResult<Value> {
    // Reading old versions is reading: any reader may see them.
    scope.need_read()?;
    let mut snaps = scope.fs().snapshot_times()?;
    snaps.sort_by(|a, b| b.1.cmp(&a.1).then(b.0.cmp(&a.0)));
    let mut out = Vec::new();
    for (snap, time) in snaps {
        match scope.walk_snapshot(&snap, comps) {
            Ok(a) if a.kind == FileKind::Regular || a.kind == FileKind::Directory => {
                out.push(json!({
                    "snapshot": snap,
                    "time": time,
                    "size": a.size,
                    "mtime": a.mtime.sec,
                    "kind": kind_name(a.kind),
                }))
            }
            // Not there in that snapshot (or not readable): no version.
            _ => {}
        }
    }
    Ok(Value::Array(out))
}

/// Copies an open source file into a new temporary in `dir`, then
/// renames it onto `name` (replacing what is there).
fn copy_file_over(
    scope: &Scope,
    src: &Attr,
    src_fs: &dyn DynFs,
    dir: u64,
    name: &[u8],
) -> FResult<()> {
    let fs = scope.fs();
    let cred = scope.cred();
    let tmp = format!("{RESTORE_PREFIX}{}", random_hex(8).unwrap_or_default());
    let t = fs.create(
        dir,
        tmp.as_bytes(),
        src.mode & 0o7777,
        0o022,
        libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
        cred,
    )?;
    let r = (|| -> FResult<()> {
        src_fs.open(src.ino, libc::O_RDONLY, cred)?;
        let mut at = 0u64;
        let copied = copy_out(src_fs, src.ino, 0, src.size, &mut |b| {
            fs.write(t.ino, at, b, false, cred).map_err(fs_io)?;
            at += b.len() as u64;
            Ok(())
        });
        let _ = src_fs.release(src.ino);
        copied.map_err(|e| FErr::new(StatusCode::INTERNAL_SERVER_ERROR, "io", e.to_string()))?;
        // The old version's time, so it reads as that version again.
        let keep_time = tarn_fs::SetAttr {
            mtime: Some(tarn_fs::TimeSet::At(src.mtime)),
            ..Default::default()
        };
        fs.setattr(t.ino, &keep_time, cred)?;
        fs.rename(dir, tmp.as_bytes(), dir, name, 0, cred)?;
        Ok(())
    })();
    let _ = fs.release(t.ino);
    if r.is_err() {
        let _ = fs.unlink(dir, tmp.as_bytes(), cred);
    }
    r
}

/// Puts back a snapshot's version of a file (replacing the current one
/// atomically) or of a folder (each file of the old folder replaces its
/// current version; files made since are kept). Answers how many files
/// were restored.
pub(crate) fn restore(
    scope: &Scope,
    comps: &[Vec<u8>],
    snap: &str,
    safety: &dyn Fn() -> FResult<String>,
) -> FResult<Value> {
    scope.need_modify()?;
    if snap.is_empty() || snap.contains('/') || snap == "." || snap == ".." {
        return Err(FErr::bad("no such snapshot"));
    }
    let src = scope.walk_snapshot(snap, comps)?;
    let fs = scope.fs();
    let mut n = 0u64;
    if comps.is_empty() {
        if src.kind != FileKind::Directory {
            return Err(FErr::bad("the top folder of a snapshot is a folder"));
        }
        let d = scope.walk(&[])?;
        let kept = safety()?;
        restore_dir(scope, &src, d.ino, 0, &mut n)?;
        fs.fsync(d.ino)?;
        return Ok(json!({"files": n, "kept_in": kept}));
    }
    let (dir, name) = scope.parent(comps).map_err(|e| {
        if e.status == StatusCode::NOT_FOUND {
            FErr::new(
                StatusCode::CONFLICT,
                "gone",
                "the folder it was in is gone: restore that folder",
            )
        } else {
            e
        }
    })?;
    if src.kind != FileKind::Regular && src.kind != FileKind::Directory {
        return Err(FErr::bad("only files and folders can be restored"));
    }
    // What is there now stays reachable as a previous version.
    let kept = safety()?;
    match src.kind {
        FileKind::Regular => {
            copy_file_over(scope, &src, fs, dir.ino, &name)?;
            n = 1;
        }
        FileKind::Directory => {
            let d = match fs.lookup(dir.ino, &name, scope.cred()) {
                Ok(a) if a.kind == FileKind::Directory => a,
                Ok(_) => {
                    return Err(FErr::new(
                        StatusCode::CONFLICT,
                        "exists",
                        "a file has that name now",
                    ))
                }
                Err(e) if e.errno() == libc::ENOENT => {
                    fs.mkdir(dir.ino, &name, src.mode & 0o7777, 0o022, scope.cred())?
                }
                Err(e) => return Err(e.into()),
            };
            restore_dir(scope, &src, d.ino, 0, &mut n)?;
        }
        _ => return Err(FErr::bad("only files and folders can be restored")),
    }
    // Restored means durable: the user is told so only now.
    fs.fsync(dir.ino)?;
    Ok(json!({"files": n, "kept_in": kept}))
}

fn restore_dir(scope: &Scope, src: &Attr, dst: u64, depth: usize, n: &mut u64) -> FResult<()> {
    if depth > MAX_DEPTH {
        return Err(FErr::bad("folders nested too deep"));
    }
    let fs = scope.fs();
    fs.access(src.ino, tarn_fs::R_OK | 1, scope.cred())?;
    for (name, a) in entries(fs, src.ino)? {
        if hidden(&name) {
            continue;
        }
        match a.kind {
            FileKind::Regular => {
                match fs.lookup(dst, &name, scope.cred()) {
                    // A folder has the name now: kept, as a file that
                    // took a folder's name is (below).
                    Ok(d) if d.kind == FileKind::Directory => continue,
                    Ok(_) => {}
                    Err(e) if e.errno() == libc::ENOENT => {}
                    Err(e) => return Err(e.into()),
                }
                copy_file_over(scope, &a, fs, dst, &name)?;
                *n += 1;
            }
            FileKind::Directory => {
                let d = match fs.lookup(dst, &name, scope.cred()) {
                    Ok(d) if d.kind == FileKind::Directory => d,
                    Ok(_) => continue, // a file has the name now: kept
                    Err(e) if e.errno() == libc::ENOENT => {
                        fs.mkdir(dst, &name, a.mode & 0o7777, 0o022, scope.cred())?
                    }
                    Err(e) => return Err(e.into()),
                };
                restore_dir(scope, &a, d.ino, depth + 1, n)?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Removes a file, or a folder with everything in it.
fn remove_tree(scope: &Scope, dir: u64, name: &[u8], depth: usize) -> FResult<()> {
    if depth > MAX_DEPTH {
        return Err(FErr::bad("folders nested too deep"));
    }
    let fs = scope.fs();
    let a = fs.lookup(dir, name, scope.cred())?;
    if a.kind == FileKind::Directory {
        for (n, _) in entries(fs, a.ino)? {
            remove_tree(scope, a.ino, &n, depth + 1)?;
        }
        fs.rmdir(dir, name, scope.cred())?;
    } else {
        fs.unlink(dir, name, scope.cred())?;
    }
    Ok(())
}

/// `POST /api/files/op`: mkdir, rename (also a move), delete, restore.
pub(crate) fn operation(
    scope: &Scope,
    body: &Value,
    safety: &dyn Fn() -> FResult<String>,
) -> FResult<Value> {
    let s = |k: &str| body.get(k).and_then(Value::as_str).unwrap_or("");
    let comps = json_components(s("path"))?;
    match s("op") {
        "mkdir" => {
            scope.need_modify()?;
            let (dir, name) = scope.parent(&comps)?;
            let name = new_name(&String::from_utf8_lossy(&name))?;
            scope
                .fs()
                .mkdir(dir.ino, &name, 0o777, 0o022, scope.cred())?;
            Ok(json!({}))
        }
        "rename" => {
            scope.need_modify()?;
            let to = json_components(s("to"))?;
            let (from_dir, from_name) = scope.parent(&comps)?;
            let (to_dir, to_name) = scope.parent(&to)?;
            let to_name = new_name(&String::from_utf8_lossy(&to_name))?;
            let a = scope.fs().lookup(from_dir.ino, &from_name, scope.cred())?;
            if a.kind == FileKind::Directory && to.starts_with(&comps) {
                return Err(FErr::bad("a folder cannot move into itself"));
            }
            scope.fs().rename(
                from_dir.ino,
                &from_name,
                to_dir.ino,
                &to_name,
                tarn_fs::RENAME_NOREPLACE,
                scope.cred(),
            )?;
            Ok(json!({}))
        }
        "delete" => {
            scope.need_modify()?;
            let (dir, name) = scope.parent(&comps)?;
            remove_tree(scope, dir.ino, &name, 0)?;
            Ok(json!({}))
        }
        "restore" => restore(scope, &comps, s("snapshot"), safety),
        _ => Err(FErr::bad("op must be mkdir, rename, delete or restore")),
    }
}

/// One upload session (see the module docs).
pub(crate) struct Upload {
    who: Who,
    /// The share at start: its filesystem and credential, to clean up
    /// with (access is decided again at each chunk).
    share: FileShare,
    dir: u64,
    tmp: Vec<u8>,
    tmp_ino: u64,
    name: Vec<u8>,
    size: u64,
    offset: u64,
    replace: bool,
    /// A clash at the end picks `name (2).ext` instead (upload links:
    /// visitors never replace files).
    keep_both: bool,
    busy: bool,
    last: Instant,
}

impl Upload {
    /// The share it was started on.
    pub(crate) fn share_name(&self) -> &str {
        &self.share.name
    }
}

/// Ends idle sessions and removes their temporary files (at each new
/// upload and every [`REAP_EVERY`]).
pub(crate) fn reap(st: &State) {
    let dead: Vec<Upload> = {
        let mut u = st.uploads.lock().unwrap_or_else(|e| e.into_inner());
        let ids: Vec<String> = u
            .iter()
            .filter(|(_, x)| !x.busy && x.last.elapsed() > UPLOAD_IDLE)
            .map(|(k, _)| k.clone())
            .collect();
        ids.iter().filter_map(|k| u.remove(k)).collect()
    };
    for x in dead {
        drop_temp(&x);
    }
}

/// Removes temporaries in folder `dir` that no session owns and that
/// have not changed for [`UPLOAD_IDLE`]: those of sessions a restart
/// (or a crash) forgot. A folder is looked at most every
/// [`SWEEP_EVERY`].
fn sweep(st: &State, scope: &Scope, dir: u64) {
    let key = (Arc::as_ptr(&scope.share.fs) as *const () as usize, dir);
    {
        let mut seen = st.swept.lock().unwrap_or_else(|e| e.into_inner());
        if seen.get(&key).is_some_and(|t| t.elapsed() < SWEEP_EVERY) {
            return;
        }
        if seen.len() >= 10_000 {
            seen.clear();
        }
        seen.insert(key, Instant::now());
    }
    let Ok(list) = entries(scope.fs(), dir) else {
        return;
    };
    let live: Vec<Vec<u8>> = st
        .uploads
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .filter(|u| u.dir == dir)
        .map(|u| u.tmp.clone())
        .collect();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    for (name, a) in list {
        let old = now - a.mtime.sec > UPLOAD_IDLE.as_secs() as i64;
        if hidden(&name) && old && a.kind == FileKind::Regular && !live.contains(&name) {
            let _ = scope.fs().unlink(dir, &name, scope.cred());
        }
    }
}

fn drop_temp(x: &Upload) {
    let _ = x.share.fs.unlink(x.dir, &x.tmp, &x.share.cred);
}

/// `POST …/upload`: starts a session for `{path, name, size, replace}`.
pub(crate) fn upload_start(st: &State, scope: &Scope, body: &Value) -> FResult<Value> {
    reap(st);
    if !(scope.add || scope.modify) || !scope.share.writable {
        return Err(FErr::forbidden("you may not add files here"));
    }
    let comps = json_components(body.get("path").and_then(Value::as_str).unwrap_or(""))?;
    let name = new_name(body.get("name").and_then(Value::as_str).unwrap_or(""))?;
    let size = body
        .get("size")
        .and_then(Value::as_u64)
        .ok_or_else(|| FErr::bad("size: the file's length in bytes"))?;
    let replace = body
        .get("replace")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if replace {
        scope.need_modify()?;
    }
    if scope.add && !scope.modify && !comps.is_empty() {
        return Err(FErr::forbidden(
            "an upload link adds files to its folder only",
        ));
    }
    let dir = scope.walk(&comps)?;
    if dir.kind != FileKind::Directory {
        return Err(FErr::bad("uploads go into a folder"));
    }
    sweep(st, scope, dir.ino);
    let fs = scope.fs();
    if !replace && !scope.add {
        match fs.lookup(dir.ino, &name, scope.cred()) {
            Ok(_) => {
                return Err(FErr::new(
                    StatusCode::CONFLICT,
                    "exists",
                    "a file of that name is there (send replace: true)",
                ))
            }
            Err(e) if e.errno() == libc::ENOENT => {}
            Err(e) => return Err(e.into()),
        }
    }
    let free = fs.statfs(dir.ino)?;
    if size > free.bavail.saturating_mul(u64::from(free.bsize)) {
        return Err(FErr::new(
            StatusCode::INSUFFICIENT_STORAGE,
            "no_space",
            "the dataset has no room for this file",
        ));
    }
    {
        let u = st.uploads.lock().unwrap_or_else(|e| e.into_inner());
        if u.len() >= MAX_UPLOADS
            || u.values()
                .filter(|x| x.who.account() == scope.who.account())
                .count()
                >= UPLOADS_PER_OWNER
        {
            return Err(FErr::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_uploads",
                "too many unfinished uploads; finish or cancel some",
            ));
        }
    }
    let id = random_hex(16).ok_or_else(|| {
        FErr::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "no randomness",
        )
    })?;
    let tmp = format!("{UPLOAD_PREFIX}{id}").into_bytes();
    let t = fs.create(
        dir.ino,
        &tmp,
        0o666,
        0o022,
        libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
        scope.cred(),
    )?;
    let _ = fs.release(t.ino);
    st.uploads.lock().unwrap_or_else(|e| e.into_inner()).insert(
        id.clone(),
        Upload {
            who: scope.who.clone(),
            share: scope.share.clone(),
            dir: dir.ino,
            tmp,
            tmp_ino: t.ino,
            name,
            size,
            offset: 0,
            replace,
            keep_both: scope.add && !scope.modify,
            busy: false,
            last: Instant::now(),
        },
    );
    Ok(json!({"id": id, "offset": 0, "size": size}))
}

/// Where session `id` stands (its owner only).
pub(crate) fn upload_status(st: &State, who: &Who, id: &str) -> FResult<Value> {
    let u = st.uploads.lock().unwrap_or_else(|e| e.into_inner());
    match u.get(id) {
        Some(x) if x.who == *who => Ok(json!({"offset": x.offset, "size": x.size, "busy": x.busy})),
        _ => Err(no_upload()),
    }
}

fn no_upload() -> FErr {
    FErr::new(
        StatusCode::NOT_FOUND,
        "no_upload",
        "no such upload (finished, cancelled or expired)",
    )
}

/// Cancels session `id` and removes its temporary file.
pub(crate) fn upload_cancel(st: &State, who: &Who, id: &str) -> FResult<Value> {
    let x = {
        let mut u = st.uploads.lock().unwrap_or_else(|e| e.into_inner());
        match u.get(id) {
            Some(x) if x.who == *who && !x.busy => u.remove(id),
            Some(x) if x.who == *who => {
                return Err(FErr::new(
                    StatusCode::CONFLICT,
                    "busy",
                    "a chunk of this upload is arriving",
                ))
            }
            _ => None,
        }
    };
    let x = x.ok_or_else(no_upload)?;
    drop_temp(&x);
    Ok(json!({}))
}

/// A claimed session: given back (not busy, at the offset reached) when
/// dropped, however the chunk's handling ends; or ended, with its
/// temporary file removed.
struct Claim {
    st: Arc<State>,
    id: String,
    offset: u64,
    end: bool,
    done: bool,
}

impl Drop for Claim {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut u = self.st.uploads.lock().unwrap_or_else(|e| e.into_inner());
        if self.end {
            if let Some(x) = u.remove(&self.id) {
                drop(u);
                drop_temp(&x);
            }
        } else if let Some(x) = u.get_mut(&self.id) {
            x.busy = false;
            x.offset = self.offset;
            x.last = Instant::now();
        }
    }
}

/// `PUT …/upload/ID` with `Upload-Offset`: writes a chunk as it arrives
/// and, with the last byte, puts the file in place. The work runs as a
/// task of its own: a client that goes away (hyper then drops the
/// request's future) cannot leave the session half-handled.
pub(crate) async fn upload_put(
    st: &Arc<State>,
    scope: Scope,
    id: &str,
    headers: &HeaderMap,
    body: Incoming,
) -> FResult<Value> {
    let (st2, id2, h2) = (st.clone(), id.to_string(), headers.clone());
    tokio::spawn(async move { put_chunk(st2, scope, id2, h2, body).await })
        .await
        .unwrap_or_else(|_| {
            Err(FErr::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the upload failed",
            ))
        })
}

async fn put_chunk(
    st: Arc<State>,
    scope: Scope,
    id: String,
    headers: HeaderMap,
    mut body: Incoming,
) -> FResult<Value> {
    let claimed: Option<u64> = headers
        .get("upload-offset")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok());
    let replace_now = headers
        .get("upload-replace")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim() == "true");
    if replace_now {
        scope.need_modify()?;
    }
    let (fs, cred, dir, tmp, tmp_ino, size, name, replace, keep_both, mut claim) = {
        let mut u = st.uploads.lock().unwrap_or_else(|e| e.into_inner());
        let x = match u.get_mut(&id) {
            Some(x) if x.who == scope.who => x,
            _ => return Err(no_upload()),
        };
        if x.share.name != scope.share.name || !scope.share.writable {
            return Err(FErr::forbidden("you may no longer add files here"));
        }
        if x.busy {
            return Err(FErr::new(
                StatusCode::CONFLICT,
                "busy",
                "a chunk of this upload is arriving",
            ));
        }
        if claimed != Some(x.offset) {
            return Err(FErr::new(
                StatusCode::CONFLICT,
                "offset",
                format!("Upload-Offset must be {}", x.offset),
            ));
        }
        x.busy = true;
        x.replace |= replace_now;
        (
            scope.share.fs.clone(),
            scope.share.cred.clone(),
            x.dir,
            x.tmp.clone(),
            x.tmp_ino,
            x.size,
            x.name.clone(),
            x.replace,
            x.keep_both,
            Claim {
                st: st.clone(),
                id: id.clone(),
                offset: x.offset,
                end: false,
                done: false,
            },
        )
    };
    let mut offset = claim.offset;
    // The temporary must still be ours and as long as we think; if it is
    // gone or changed, the session ends (nothing of it can be trusted).
    let check = {
        let (fs, cred, tmp) = (fs.clone(), cred.clone(), tmp.clone());
        blocking(move || -> FResult<()> {
            let gone = |why: &str| {
                FErr::new(
                    StatusCode::CONFLICT,
                    "changed",
                    format!("the upload's temporary file {why}; start again"),
                )
            };
            let a = match fs.lookup(dir, &tmp, &cred) {
                Ok(a) => a,
                Err(e) if e.errno() == libc::ENOENT => return Err(gone("is gone")),
                Err(e) => return Err(e.into()),
            };
            if a.ino != tmp_ino || a.kind != FileKind::Regular || a.size != offset {
                return Err(gone("was changed by someone else"));
            }
            fs.open(tmp_ino, libc::O_WRONLY, &cred)?;
            Ok(())
        })
        .await
    };
    if let Err(e) = check {
        claim.end = e.code == "changed";
        return Err(e);
    }
    let write = |data: Vec<u8>, at: u64| {
        let (fs, cred) = (fs.clone(), cred.clone());
        blocking(move || -> FResult<()> {
            let mut done = 0;
            while done < data.len() {
                done += fs.write(tmp_ino, at + done as u64, &data[done..], false, &cred)?;
            }
            Ok(())
        })
    };
    let mut buf: Vec<u8> = Vec::with_capacity(WRITE_BATCH);
    let mut outcome: FResult<()> = Ok(());
    loop {
        let frame = match tokio::time::timeout(CHUNK_IDLE, body.frame()).await {
            Ok(Some(Ok(f))) => f,
            Ok(None) => break,
            // Cut or stalled: keep what arrived, the client resumes.
            Ok(Some(Err(_))) | Err(_) => {
                outcome = Err(FErr::bad("the chunk was cut short; resume at the offset"));
                break;
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if offset + (buf.len() + data.len()) as u64 > size {
            outcome = Err(FErr::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_long",
                "more bytes than the upload's size",
            ));
            break;
        }
        buf.extend_from_slice(&data);
        if buf.len() >= WRITE_BATCH {
            let n = buf.len() as u64;
            if let Err(e) = write(std::mem::take(&mut buf), offset).await {
                outcome = Err(e);
                break;
            }
            offset += n;
            claim.offset = offset;
        }
    }
    if !buf.is_empty() {
        let n = buf.len() as u64;
        match write(buf, offset).await {
            Ok(()) => offset += n,
            Err(e) => outcome = outcome.and(Err(e)),
        }
        claim.offset = offset;
    }
    if outcome.is_err() || offset < size {
        let f = fs.clone();
        let _ = blocking(move || Ok(f.release(tmp_ino))).await;
        outcome?;
        return Ok(json!({"offset": offset, "size": size, "done": false}));
    }
    let placed = {
        let (fs, cred) = (fs.clone(), cred.clone());
        blocking(move || place(&*fs, &cred, dir, &tmp, tmp_ino, &name, replace, keep_both)).await
    };
    match placed {
        Ok(final_name) => {
            // Placed: the session is over (its temporary is the file now).
            claim.done = true;
            st.uploads
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
            let mut v = json!({"offset": offset, "size": size, "done": true});
            if !keep_both {
                // A visitor of an upload link is not told which names
                // were taken.
                v["name"] = Value::String(String::from_utf8_lossy(&final_name).into());
            }
            Ok(v)
        }
        // The bytes stay: the session waits, whole, for a retry (with
        // Upload-Replace: true when the name was taken meanwhile).
        Err(e) => Err(e),
    }
}

/// Makes a complete upload's temporary durable under its name.
#[allow(clippy::too_many_arguments)]
fn place(
    fs: &dyn DynFs,
    cred: &Cred,
    dir: u64,
    tmp: &[u8],
    tmp_ino: u64,
    name: &[u8],
    replace: bool,
    keep_both: bool,
) -> FResult<Vec<u8>> {
    let _ = fs.release(tmp_ino);
    let flags = if replace {
        0
    } else {
        tarn_fs::RENAME_NOREPLACE
    };
    let mut candidate = name.to_vec();
    for n in 2..1000 {
        match fs.rename(dir, tmp, dir, &candidate, flags, cred) {
            Ok(()) => {
                // One sync makes the data and the rename durable together.
                fs.fsync(dir)?;
                return Ok(candidate);
            }
            Err(e) if e.errno() == libc::EEXIST && keep_both => {
                candidate = numbered(name, n);
            }
            Err(e) if e.errno() == libc::EEXIST => {
                return Err(FErr::new(
                    StatusCode::CONFLICT,
                    "exists",
                    "a file of that name appeared meanwhile; send the last chunk again \
                     with Upload-Replace: true to replace it",
                ))
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(FErr::new(
        StatusCode::CONFLICT,
        "exists",
        "too many files of that name",
    ))
}

/// `photo.jpg` → `photo (2).jpg`.
fn numbered(name: &[u8], n: u32) -> Vec<u8> {
    let s = String::from_utf8_lossy(name);
    let out = match s.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() => format!("{stem} ({n}).{ext}"),
        _ => format!("{s} ({n})"),
    };
    out.into_bytes()
}

/// The upload sessions' table.
pub(crate) type Uploads = std::sync::Mutex<HashMap<String, Upload>>;

/// Runs a blocking file operation off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> FResult<T> + Send + 'static,
) -> FResult<T> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|_| {
        Err(FErr::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the operation failed",
        ))
    })
}

/// Query flags of a file URL (`?list`, `?zip`, …).
pub(crate) fn flag(query: Option<&str>, name: &str) -> bool {
    query
        .unwrap_or("")
        .split('&')
        .any(|kv| kv.split('=').next() == Some(name))
}

/// Answers a file request for `scope` at `comps` with the method and
/// the query's view (`list`, `versions`, or the bytes).
pub(crate) async fn serve_path(
    st: &Arc<State>,
    scope: Scope,
    comps: Vec<Vec<u8>>,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Resp {
    let q = |n| flag(query, n);
    let r = if q("thumb") {
        let (st2, immutable) = (st.clone(), q("v"));
        let (s2, c2) = (scope.clone(), comps.clone());
        let made = match blocking(move || crate::thumbs::cached(&st2.thumbs, &s2, &c2)).await {
            Ok(Some(jpeg)) => Ok((jpeg, true)),
            Err(e) => Err(e),
            // Waits for a turn here, on the runtime, not on one of its few
            // blocking threads (a grid of new photos asks for many).
            Ok(None) => match st.thumbs.makers.acquire().await {
                Ok(_turn) => {
                    let st2 = st.clone();
                    blocking(move || crate::thumbs::thumbnail(&st2.thumbs, &scope, &comps)).await
                }
                Err(_) => Err(FErr::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "stopping",
                    "the server is stopping",
                )),
            },
        };
        made.map(|(jpeg, cached)| {
            let mut r = http::Response::new(crate::full(jpeg));
            let h = r.headers_mut();
            let cache = if immutable {
                // The URL names the version: keep it for good.
                "private, max-age=31536000, immutable"
            } else {
                "private, no-cache"
            };
            for (k, v) in [
                ("content-type", "image/jpeg"),
                ("cache-control", cache),
                ("x-content-type-options", "nosniff"),
                ("x-thumbnail", if cached { "cached" } else { "made" }),
            ] {
                h.insert(k, http::HeaderValue::from_static(v));
            }
            r
        })
    } else if q("list") {
        blocking(move || list(&scope, &comps))
            .await
            .map(|v| answer(st, StatusCode::OK, v, &[]))
    } else if q("versions") {
        blocking(move || versions(&scope, &comps))
            .await
            .map(|v| answer(st, StatusCode::OK, v, &[]))
    } else {
        let (h, dl, zips) = (headers.clone(), q("download"), st.zips.clone());
        blocking(move || download(scope, &comps, &h, dl, &zips)).await
    };
    r.unwrap_or_else(|e| e.answer(st))
}

/// `Method` names the file pages use, for the router.
pub(crate) fn is_write(m: &Method) -> bool {
    !(m == Method::GET || m == Method::HEAD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_hold_plain_names_only() {
        assert_eq!(
            url_components("/a/b%20c/").ok().unwrap(),
            vec![b"a".to_vec(), b"b c".to_vec()]
        );
        for bad in [
            "/a/../b",
            "/..",
            "/a/%2e%2e/b",
            "/a%2Fb",
            "/a%2fb",
            "/a/%00",
            "/.snapshot/x",
            "/a/./b",
            "/a/%zz",
            "/a/%2",
        ] {
            assert!(url_components(bad).is_err(), "{bad}");
        }
        assert!(json_components("a/../b").is_err());
        assert!(json_components("a/./b").is_err());
        assert_eq!(json_components("/a//b/").ok().unwrap().len(), 2);
        assert!(new_name(".tarn-upload-x").is_err());
        assert!(new_name("a/b").is_err());
        assert!(new_name("").is_err());
        assert!(new_name("ok.txt").is_ok());
    }

    #[test]
    fn ranges() {
        let mut h = HeaderMap::new();
        assert_eq!(range(&h, 10), Ok(None));
        h.insert(header::RANGE, "bytes=2-4".parse().unwrap());
        assert_eq!(range(&h, 10), Ok(Some((2, 5))));
        h.insert(header::RANGE, "bytes=8-".parse().unwrap());
        assert_eq!(range(&h, 10), Ok(Some((8, 10))));
        h.insert(header::RANGE, "bytes=-3".parse().unwrap());
        assert_eq!(range(&h, 10), Ok(Some((7, 10))));
        h.insert(header::RANGE, "bytes=5-100".parse().unwrap());
        assert_eq!(range(&h, 10), Ok(Some((5, 10))));
        h.insert(header::RANGE, "bytes=10-".parse().unwrap());
        assert_eq!(range(&h, 10), Err(()));
        h.insert(header::RANGE, "bytes=1-2,4-5".parse().unwrap());
        assert_eq!(range(&h, 10), Ok(None));
        // Ranges that do not parse or run backwards are ignored, not
        // refused (RFC 9110, 14.2).
        for ignored in [
            "bytes=5-2",
            "bytes=x-3",
            "bytes=2-y",
            "bytes=-z",
            "items=1-2",
        ] {
            h.insert(header::RANGE, ignored.parse().unwrap());
            assert_eq!(range(&h, 10), Ok(None), "{ignored}");
        }
        h.insert(header::RANGE, "bytes=-0".parse().unwrap());
        assert_eq!(range(&h, 10), Err(()));
    }

    /// A resumed download is ranged only while the file is the one whose
    /// tag the client holds.
    #[test]
    fn if_range_needs_the_current_tag() {
        let mut h = HeaderMap::new();
        assert!(if_range_holds(&h, "\"1-2.000000003-4\""));
        h.insert(header::IF_RANGE, "\"1-2.000000003-4\"".parse().unwrap());
        assert!(if_range_holds(&h, "\"1-2.000000003-4\""));
        assert!(!if_range_holds(&h, "\"1-2.000000005-4\""));
        h.insert(
            header::IF_RANGE,
            "Tue, 01 Dec 2026 10:00:00 GMT".parse().unwrap(),
        );
        assert!(!if_range_holds(&h, "\"1-2.000000003-4\""));
    }

    #[test]
    fn names_for_downloads_and_clashes() {
        assert_eq!(numbered(b"photo.jpg", 2), b"photo (2).jpg".to_vec());
        assert_eq!(numbered(b"README", 3), b"README (3)".to_vec());
        assert_eq!(numbered(b".bashrc", 2), b".bashrc (2)".to_vec());
        let d = disposition("attachment", "é \"x\".txt".as_bytes());
        assert!(d.contains("filename=\"_ _x_.txt\""), "{d}");
        assert!(d.contains("UTF-8''%C3%A9%20%22x%22.txt"), "{d}");
        assert_eq!(media_type(b"a.JPG"), ("image/jpeg", true));
        assert!(!media_type(b"page.html").1);
        assert!(!media_type(b"x.svg").1);
    }
}
