//! A small blocking NFSv3 client over TCP: what `tarn bench --client
//! nfs://…` needs to measure a share from a client machine without a
//! kernel NFS client (MOUNT, LOOKUP, CREATE, REMOVE, READ, WRITE, COMMIT,
//! GETATTR).
//!
//! Calls are pipelined: [`Client::send_read`] and [`Client::send_write`]
//! return at once with the call's xid, and [`Client::recv`] takes the
//! next reply, whichever call it answers (the server answers in
//! completion order). A benchmark keeps N calls in flight per connection
//! this way, as a kernel client with read-ahead and write-behind does.
//! Replies are checked as far as the client relies on them: an RPC that
//! was not accepted, an NFS error status, or a reply that does not decode
//! is an [`ClientError`], never a panic; a reply body larger than the
//! bound given at connect is refused before it is read.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::proto::{mountproc, nfsproc, MOUNT_PROG, NFS_PROG};
use crate::record;
use crate::rpc::{encode_call, Auth, AuthSys};
use crate::xdr::{Reader, Writer, XdrError};

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The connection failed or was closed.
    #[error("NFS connection: {0}")]
    Io(std::io::Error),
    /// The server answered with something that does not decode.
    #[error("NFS reply does not decode: {0}")]
    Garbage(String),
    /// The server did not accept the call (`accept_stat` or a denial).
    #[error("NFS call refused by the server (RPC status {0})")]
    Refused(u32),
    /// The procedure failed with this `nfsstat3` / `mountstat3`.
    #[error("{what} failed: {}", status_name(*status))]
    Status {
        /// Which call.
        what: &'static str,
        /// The status.
        status: u32,
    },
}

impl From<std::io::Error> for ClientError {
    fn from(e: std::io::Error) -> Self {
        ClientError::Io(e)
    }
}

/// An `nfsstat3` (or `mountstat3`, whose common values are the same) in
/// words.
pub fn status_name(status: u32) -> String {
    let name = match status {
        1 => "not permitted (NFS3ERR_PERM)",
        2 => "no such file or export (NFS3ERR_NOENT)",
        5 => "I/O error (NFS3ERR_IO)",
        13 => "permission denied (NFS3ERR_ACCES; a root client is squashed unless the share says otherwise)",
        17 => "exists (NFS3ERR_EXIST)",
        20 => "not a directory (NFS3ERR_NOTDIR)",
        21 => "is a directory (NFS3ERR_ISDIR)",
        27 => "file too large (NFS3ERR_FBIG)",
        28 => "no space left (NFS3ERR_NOSPC)",
        30 => "read-only (NFS3ERR_ROFS)",
        69 => "over quota (NFS3ERR_DQUOT)",
        70 => "stale file handle (NFS3ERR_STALE)",
        10008 => "server busy, try again (NFS3ERR_JUKEBOX)",
        _ => return format!("NFS status {status}"),
    };
    name.to_string()
}

impl From<XdrError> for ClientError {
    fn from(e: XdrError) -> Self {
        ClientError::Garbage(e.to_string())
    }
}

/// A file handle.
pub type Fh = Vec<u8>;

/// Largest file handle (RFC 1813: 64 bytes).
const FHSIZE: usize = 64;
/// `stable_how` UNSTABLE.
pub const UNSTABLE: u32 = 0;
/// `stable_how` FILE_SYNC.
pub const FILE_SYNC: u32 = 2;

/// What a reply carried, for the calls a benchmark pipelines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The call it answers.
    pub xid: u32,
    /// The reply body after the RPC header (the procedure's result).
    pub body: Vec<u8>,
}

/// One TCP connection to an NFSv3 server.
pub struct Client {
    s: TcpStream,
    auth: Auth,
    xid: u32,
    max_reply: usize,
}

impl Client {
    /// Connects as `uid`/`gid` (AUTH_SYS); replies above `max_reply`
    /// bytes are refused.
    pub fn connect(
        addr: impl ToSocketAddrs,
        uid: u32,
        gid: u32,
        max_reply: usize,
    ) -> Result<Client, ClientError> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(120)))?;
        let machine = std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().as_bytes().to_vec())
            .unwrap_or_else(|_| b"tarn-bench".to_vec());
        Ok(Client {
            s,
            auth: Auth::Sys(AuthSys {
                stamp: 0,
                machine,
                uid,
                gid,
                gids: vec![gid],
            }),
            // Start the xids where another connection of this process is
            // unlikely to be (they are per connection anyway).
            xid: std::process::id().wrapping_mul(0x9e37_79b9),
            max_reply,
        })
    }

    fn send(
        &mut self,
        prog: u32,
        proc_: u32,
        args: &[u8],
        payload: &[u8],
    ) -> Result<u32, ClientError> {
        self.xid = self.xid.wrapping_add(1);
        let mut w = encode_call(self.xid, prog, 3, proc_, &self.auth);
        w.fixed(args);
        let head = w.into_bytes();
        let pad = (4 - payload.len() % 4) % 4;
        let len = head.len() + payload.len() + pad;
        let hdr = record::header(len);
        let zeros = [0u8; 3];
        let mut bufs = [
            std::io::IoSlice::new(&hdr),
            std::io::IoSlice::new(&head),
            std::io::IoSlice::new(payload),
            std::io::IoSlice::new(&zeros[..pad]),
        ];
        write_all_vectored(&mut self.s, &mut bufs)?;
        Ok(self.xid)
    }

    /// The next reply, whichever call it answers.
    pub fn recv(&mut self) -> Result<Reply, ClientError> {
        let mut rec = Vec::new();
        loop {
            let mut h = [0u8; 4];
            self.s.read_exact(&mut h)?;
            let word = u32::from_be_bytes(h);
            let len = (word & 0x7fff_ffff) as usize;
            if rec.len() + len > self.max_reply {
                return Err(ClientError::Garbage(format!(
                    "a reply of more than {} bytes",
                    self.max_reply
                )));
            }
            let at = rec.len();
            rec.resize(at + len, 0);
            self.s.read_exact(&mut rec[at..])?;
            if word & 0x8000_0000 != 0 {
                break;
            }
        }
        let mut r = Reader::new(&rec);
        let xid = r.u32()?;
        if r.u32()? != 1 {
            return Err(ClientError::Garbage("not a REPLY".into()));
        }
        if r.u32()? != 0 {
            return Err(ClientError::Refused(r.u32().unwrap_or(u32::MAX)));
        }
        let _flavor = r.u32()?;
        let _verf = r.opaque(400)?;
        let stat = r.u32()?;
        if stat != 0 {
            return Err(ClientError::Refused(stat));
        }
        let at = rec.len() - r.remaining();
        rec.drain(..at);
        Ok(Reply { xid, body: rec })
    }

    fn call(&mut self, prog: u32, proc_: u32, args: &[u8]) -> Result<Vec<u8>, ClientError> {
        let xid = self.send(prog, proc_, args, &[])?;
        let r = self.recv()?;
        if r.xid != xid {
            return Err(ClientError::Garbage(format!(
                "a reply to call {} while waiting for {xid}",
                r.xid
            )));
        }
        Ok(r.body)
    }

    /// MOUNT's MNT of `path` (an export, e.g. `/photos`): its root handle.
    pub fn mount(&mut self, path: &str) -> Result<Fh, ClientError> {
        let mut a = Writer::new();
        a.opaque(path.as_bytes());
        let body = self.call(MOUNT_PROG, mountproc::MNT, &a.into_bytes())?;
        let mut r = Reader::new(&body);
        status(&mut r, "MOUNT")?;
        Ok(r.opaque(FHSIZE)?.to_vec())
    }

    /// LOOKUP of `name` in `dir`: its handle, or `None` if it does not
    /// exist.
    pub fn lookup(&mut self, dir: &[u8], name: &str) -> Result<Option<Fh>, ClientError> {
        let mut a = Writer::new();
        a.opaque(dir).opaque(name.as_bytes());
        let body = self.call(NFS_PROG, nfsproc::LOOKUP, &a.into_bytes())?;
        let mut r = Reader::new(&body);
        match r.u32()? {
            0 => Ok(Some(r.opaque(FHSIZE)?.to_vec())),
            2 => Ok(None),
            s => Err(ClientError::Status {
                what: "LOOKUP",
                status: s,
            }),
        }
    }

    /// CREATE (UNCHECKED: an existing file is truncated to size 0) of
    /// `name` in `dir` with `mode`: its handle.
    pub fn create(&mut self, dir: &[u8], name: &str, mode: u32) -> Result<Fh, ClientError> {
        let mut a = Writer::new();
        a.opaque(dir).opaque(name.as_bytes());
        // UNCHECKED; sattr3: mode set, uid and gid not, size 0, times not.
        a.u32(0).bool(true).u32(mode).bool(false).bool(false);
        a.bool(true).u64(0).u32(0).u32(0);
        let body = self.call(NFS_PROG, nfsproc::CREATE, &a.into_bytes())?;
        let mut r = Reader::new(&body);
        status(&mut r, "CREATE")?;
        match r.option(|r| r.opaque(FHSIZE).map(<[u8]>::to_vec))? {
            Some(fh) => Ok(fh),
            // The server may leave the handle out: look it up.
            None => self.lookup(dir, name)?.ok_or(ClientError::Status {
                what: "CREATE",
                status: 2,
            }),
        }
    }

    /// REMOVE of `name` in `dir`.
    pub fn remove(&mut self, dir: &[u8], name: &str) -> Result<(), ClientError> {
        let mut a = Writer::new();
        a.opaque(dir).opaque(name.as_bytes());
        let body = self.call(NFS_PROG, nfsproc::REMOVE, &a.into_bytes())?;
        status(&mut Reader::new(&body), "REMOVE")
    }

    /// GETATTR: the file's size.
    pub fn size(&mut self, fh: &[u8]) -> Result<u64, ClientError> {
        let mut a = Writer::new();
        a.opaque(fh);
        let body = self.call(NFS_PROG, nfsproc::GETATTR, &a.into_bytes())?;
        let mut r = Reader::new(&body);
        status(&mut r, "GETATTR")?;
        // fattr3: type, mode, nlink, uid, gid, then size.
        r.fixed(20)?;
        Ok(r.u64()?)
    }

    /// Sends a READ of `count` bytes at `off`; its reply comes from
    /// [`Client::recv`] and decodes with [`read_reply`].
    pub fn send_read(&mut self, fh: &[u8], off: u64, count: u32) -> Result<u32, ClientError> {
        let mut a = Writer::new();
        a.opaque(fh).u64(off).u32(count);
        self.send(NFS_PROG, nfsproc::READ, &a.into_bytes(), &[])
    }

    /// Sends a WRITE of `data` at `off` (`stable`: [`UNSTABLE`] or
    /// [`FILE_SYNC`]); its reply decodes with [`write_reply`].
    pub fn send_write(
        &mut self,
        fh: &[u8],
        off: u64,
        data: &[u8],
        stable: u32,
    ) -> Result<u32, ClientError> {
        let mut a = Writer::new();
        a.opaque(fh).u64(off).u32(data.len() as u32).u32(stable);
        a.u32(data.len() as u32);
        self.send(NFS_PROG, nfsproc::WRITE, &a.into_bytes(), data)
    }

    /// COMMIT of the whole file: what UNSTABLE writes wrote is durable
    /// when it returns.
    pub fn commit(&mut self, fh: &[u8]) -> Result<(), ClientError> {
        let mut a = Writer::new();
        a.opaque(fh).u64(0).u32(0);
        let body = self.call(NFS_PROG, nfsproc::COMMIT, &a.into_bytes())?;
        status(&mut Reader::new(&body), "COMMIT")
    }
}

fn status(r: &mut Reader, what: &'static str) -> Result<(), ClientError> {
    match r.u32()? {
        0 => Ok(()),
        s => Err(ClientError::Status { what, status: s }),
    }
}

fn skip_post_op_attr(r: &mut Reader) -> Result<(), ClientError> {
    if r.bool()? {
        r.fixed(84)?;
    }
    Ok(())
}

/// A READ reply: the bytes that came, and whether the file ends there.
pub fn read_reply(body: &[u8]) -> Result<(&[u8], bool), ClientError> {
    let mut r = Reader::new(body);
    status(&mut r, "READ")?;
    skip_post_op_attr(&mut r)?;
    let count = r.u32()? as usize;
    let eof = r.bool()?;
    let data = r.opaque(usize::MAX)?;
    if data.len() != count {
        return Err(ClientError::Garbage(format!(
            "READ says {count} bytes and carries {}",
            data.len()
        )));
    }
    Ok((data, eof))
}

/// A WRITE reply: how many bytes were written.
pub fn write_reply(body: &[u8]) -> Result<u32, ClientError> {
    let mut r = Reader::new(body);
    status(&mut r, "WRITE")?;
    if r.bool()? {
        r.fixed(24)?;
    }
    skip_post_op_attr(&mut r)?;
    Ok(r.u32()?)
}

fn write_all_vectored(
    s: &mut TcpStream,
    mut bufs: &mut [std::io::IoSlice<'_>],
) -> std::io::Result<()> {
    while !bufs.is_empty() {
        match s.write_vectored(bufs) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => std::io::IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_replies_decode_and_lie_detected() {
        let mut w = Writer::new();
        w.u32(0).bool(false).u32(5).bool(true).opaque(b"hello");
        assert_eq!(read_reply(&w.into_bytes()).unwrap(), (&b"hello"[..], true));
        let mut w = Writer::new();
        w.u32(0).bool(false).u32(6).bool(true).opaque(b"hello");
        assert!(
            read_reply(&w.into_bytes()).is_err(),
            "count and data differ"
        );
        let mut w = Writer::new();
        w.u32(13);
        assert!(matches!(
            read_reply(&w.into_bytes()),
            Err(ClientError::Status { status: 13, .. })
        ));
        assert!(read_reply(&[0, 0]).is_err(), "short");
    }

    #[test]
    fn write_replies_decode() {
        let mut w = Writer::new();
        w.u32(0)
            .bool(true)
            .fixed(&[0; 24])
            .bool(false)
            .u32(4096)
            .u32(0)
            .fixed(&[1; 8]);
        assert_eq!(write_reply(&w.into_bytes()).unwrap(), 4096);
        let mut w = Writer::new();
        w.u32(28);
        assert!(write_reply(&w.into_bytes()).is_err());
    }
}
