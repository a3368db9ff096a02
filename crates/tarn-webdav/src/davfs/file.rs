//! An open file as dav-server sees it: [`TarnFile`], the position, the
//! read-ahead parts and the gathering of an upload's frames.
//!
//! **Reads.** `Fs::read_data` returns up to [`IO_CHUNK`] as the cached
//! blocks' own bytes; they go to the response body part by part, never
//! copied. The parts not yet asked for wait in `ahead`, which always
//! starts at `pos`: anything else that moves `pos` (a write, a seek to
//! elsewhere) empties it, so it needs no position of its own.
//!
//! **Writes.** The request body's frames are kept as they came, at
//! `buf_off`; frames under [`SMALL_FRAME`] are copied together first (a
//! chunked upload may come a byte at a time, and a frame kept per byte
//! would pin a buffer each). Whenever the pending bytes reach an
//! [`IO_CHUNK`] boundary of the file, everything up to it is written with
//! one `Fs::write_iov` (one transaction, whole records written whole);
//! so at most about one chunk waits, plus the last frame, whatever the
//! file size. Every read, seek, `metadata` and `flush` writes what is
//! pending first, so they see the file as the client sent it.
//!
//! **Open count.** The file was opened (counted) by the filesystem's
//! `open`; dropping a [`TarnFile`] releases it, on the blocking pool when
//! a runtime is there, so the open count that keeps an unlinked file
//! alive drops once the last WebDAV user is done with it.

use std::collections::VecDeque;
use std::fmt;
use std::io::SeekFrom;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use dav_server::fs::{DavFile, DavMetaData, FsError, FsFuture, FsResult};
use futures_util::future::FutureExt;
use tarn_fs::Cred;

use super::{blocking, map_err, Meta, IO_CHUNK};
use crate::api::FsApi;

/// An open file. Reads take the blocks' bytes from `Fs::read_data` (≤
/// [`IO_CHUNK`] each) and hand them to the response body as they are,
/// without a copy; the parts of one read not yet asked for wait in
/// `ahead`. Writes keep the request body's frames as they came (small ones
/// gathered, see [`SMALL_FRAME`]) and write them with `Fs::write_iov` once
/// they reach the next [`IO_CHUNK`] boundary
/// of the file, so an upload costs one transaction per MiB, whole records
/// are written whole, and no byte is copied before `Fs` stores it; at most
/// ~2 MiB wait in memory whatever the file size.
pub(crate) struct TarnFile {
    fs: Arc<dyn FsApi>,
    ino: u64,
    cred: Cred,
    pos: u64,
    append: bool,
    writable: bool,
    /// Frames to write at `buf_off` (or at end of file if `append`),
    /// then the bytes of small frames gathered in `small`.
    pending: VecDeque<Bytes>,
    small: BytesMut,
    /// Bytes in `pending` and `small`.
    pending_len: usize,
    buf_off: u64,
    /// Bytes read but not yet returned, starting at `pos` (anything that
    /// moves `pos` otherwise, a write or a seek, empties it).
    ahead: VecDeque<Bytes>,
    released: bool,
}

impl fmt::Debug for TarnFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TarnFile")
            .field("ino", &self.ino)
            .field("pos", &self.pos)
            .field("pending", &self.pending_len)
            .finish()
    }
}

impl TarnFile {
    pub(super) fn new(
        fs: Arc<dyn FsApi>,
        ino: u64,
        cred: Cred,
        append: bool,
        writable: bool,
    ) -> TarnFile {
        TarnFile {
            fs,
            ino,
            cred,
            pos: 0,
            append,
            writable,
            pending: VecDeque::new(),
            small: BytesMut::new(),
            pending_len: 0,
            buf_off: 0,
            ahead: VecDeque::new(),
            released: false,
        }
    }

    /// Writes the frames `data` (pending bytes starting at `off`) in
    /// transactions of at most [`IO_CHUNK`] that end on its boundaries.
    fn write_out(
        fs: &dyn FsApi,
        ino: u64,
        mut off: u64,
        data: Vec<Bytes>,
        append: bool,
        cred: &Cred,
    ) -> FsResult<()> {
        let mut frames: VecDeque<Bytes> = data.into();
        while !frames.is_empty() {
            let chunk = IO_CHUNK as u64;
            let room = if append { chunk } else { chunk - off % chunk } as usize;
            let step = take_bytes(&mut frames, room);
            let iov: Vec<&[u8]> = step.iter().map(|b| &b[..]).collect();
            let len: usize = iov.iter().map(|b| b.len()).sum();
            let n = fs
                .write_iov(ino, off, &iov, append, cred)
                .map_err(map_err)?;
            if n != len {
                return Err(FsError::GeneralFailure);
            }
            off += n as u64;
        }
        Ok(())
    }

    /// Writes the first `n` pending bytes (all of them if `n` is None).
    async fn flush_pending(&mut self, n: Option<usize>) -> FsResult<()> {
        let n = n.unwrap_or(self.pending_len).min(self.pending_len);
        if n == 0 {
            return Ok(());
        }
        self.seal_small();
        let data = take_bytes(&mut self.pending, n);
        self.pending_len -= n;
        let (fs, ino, off, append, cred) = (
            self.fs.clone(),
            self.ino,
            self.buf_off,
            self.append,
            self.cred.clone(),
        );
        self.buf_off += n as u64;
        blocking(move || Self::write_out(fs.as_ref(), ino, off, data, append, &cred)).await
    }

    /// Moves the gathered small frames to the end of `pending`.
    fn seal_small(&mut self) {
        if !self.small.is_empty() {
            self.pending.push_back(self.small.split().freeze());
        }
    }

    async fn add(&mut self, data: Bytes) -> FsResult<()> {
        if !self.writable {
            return Err(FsError::Forbidden);
        }
        self.ahead.clear();
        if data.is_empty() {
            return Ok(());
        }
        if self.pending_len == 0 {
            self.buf_off = self.pos;
        }
        self.pos = self
            .pos
            .checked_add(data.len() as u64)
            .ok_or(FsError::TooLarge)?;
        self.pending_len += data.len();
        // Small frames (a chunked body can come a byte at a time) are
        // gathered, so the frames kept stay few and each holds its share
        // of the connection's buffers.
        if data.len() < SMALL_FRAME {
            self.small.extend_from_slice(&data);
            if self.small.len() >= SMALL_FRAME {
                self.seal_small();
            }
        } else {
            self.seal_small();
            self.pending.push_back(data);
        }
        // Write up to the last IO_CHUNK boundary the pending bytes reach.
        let chunk = IO_CHUNK as u64;
        let n = if self.append {
            self.pending_len / IO_CHUNK * IO_CHUNK
        } else {
            let end = self.buf_off + self.pending_len as u64;
            (end / chunk * chunk).saturating_sub(self.buf_off) as usize
        };
        if n > 0 {
            self.flush_pending(Some(n)).await?;
        }
        Ok(())
    }
}

/// Frames smaller than this are copied together (see `TarnFile::add`).
const SMALL_FRAME: usize = 16 << 10;

/// Takes the first `n` bytes of `frames` (fewer if they hold fewer),
/// splitting a frame without copying it.
fn take_bytes(frames: &mut VecDeque<Bytes>, mut n: usize) -> Vec<Bytes> {
    let mut out = Vec::new();
    while n > 0 {
        let Some(mut f) = frames.pop_front() else {
            break;
        };
        if f.len() > n {
            frames.push_front(f.split_off(n));
        }
        n -= f.len();
        out.push(f);
    }
    out
}

impl Drop for TarnFile {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.released = true;
        let (fs, ino) = (self.fs.clone(), self.ino);
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(move || {
                    let _ = fs.release(ino);
                });
            }
            Err(_) => {
                let _ = fs.release(ino);
            }
        }
    }
}

impl DavFile for TarnFile {
    fn metadata(&mut self) -> FsFuture<'_, Box<dyn DavMetaData>> {
        async move {
            self.flush_pending(None).await?;
            let (fs, ino) = (self.fs.clone(), self.ino);
            let a = blocking(move || fs.getattr(ino).map_err(map_err)).await?;
            let m: Box<dyn DavMetaData> = Box::new(Meta(a));
            Ok(m)
        }
        .boxed()
    }

    fn write_buf(&mut self, mut buf: Box<dyn Buf + Send>) -> FsFuture<'_, ()> {
        async move {
            let n = buf.remaining();
            self.add(buf.copy_to_bytes(n)).await
        }
        .boxed()
    }

    fn write_bytes(&mut self, buf: Bytes) -> FsFuture<'_, ()> {
        async move { self.add(buf).await }.boxed()
    }

    fn read_bytes(&mut self, count: usize) -> FsFuture<'_, Bytes> {
        async move {
            self.flush_pending(None).await?;
            if self.ahead.is_empty() {
                let size = count.min(IO_CHUNK) as u32;
                let (fs, ino, pos) = (self.fs.clone(), self.ino, self.pos);
                let data = blocking(move || fs.read_data(ino, pos, size).map_err(map_err)).await?;
                self.ahead = data
                    .into_parts()
                    .into_iter()
                    .map(Bytes::from_owner)
                    .collect();
            }
            // One part at a time: a short read is fine, the caller asks
            // again for the rest.
            let mut b = self.ahead.pop_front().unwrap_or_default();
            if b.len() > count {
                self.ahead.push_front(b.split_off(count));
            }
            self.pos += b.len() as u64;
            Ok(b)
        }
        .boxed()
    }

    fn seek(&mut self, pos: SeekFrom) -> FsFuture<'_, u64> {
        async move {
            self.flush_pending(None).await?;
            let new = match pos {
                SeekFrom::Start(n) => Some(n),
                SeekFrom::Current(d) => self.pos.checked_add_signed(d),
                SeekFrom::End(d) => {
                    let (fs, ino) = (self.fs.clone(), self.ino);
                    let a = blocking(move || fs.getattr(ino).map_err(map_err)).await?;
                    a.size.checked_add_signed(d)
                }
            };
            let new = new.ok_or(FsError::GeneralFailure)?;
            if new != self.pos {
                self.ahead.clear();
            }
            self.pos = new;
            Ok(self.pos)
        }
        .boxed()
    }

    fn flush(&mut self) -> FsFuture<'_, ()> {
        async move { self.flush_pending(None).await }.boxed()
    }
}
