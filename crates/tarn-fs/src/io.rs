//! Opening, reading, writing and syncing files; open counts and the
//! unlinked-but-open files they keep alive.

use crate::file::{self, MAX_FILE_SIZE};
use crate::fs::{attr_of, err, lock, open_mask, wants_atime, Fs, LastWrite, Place, MAX_READ};
use crate::inode::{self, Tx};
use crate::perm;
use crate::store::Backend;
use crate::types::*;
use crate::{FsError, Result};
use tarn_dataset::read_data::ReadData;
use tarn_dataset::readahead;

/// Files whose last write is remembered (see `Fs::write_iov`); past it
/// one is forgotten for each new one (a hint lost, nothing else).
const LAST_WRITES: usize = 4096;

impl<B: Backend> Fs<B> {
    /// Opens `ino` with open(2) `flags` (checks permissions; `O_TRUNC`
    /// empties a regular file). Counts the open so an unlinked file keeps
    /// its data until [`Fs::release`].
    pub fn open(&self, ino: u64, flags: i32, cred: &Cred) -> Result<Attr> {
        let mask = open_mask(flags);
        let local = match self.place(ino)? {
            Place::Live(l) => l,
            Place::SnapDir => {
                if mask & W_OK != 0 {
                    return err(libc::EROFS, "snapshots are read-only");
                }
                return self.snapdir_attr();
            }
            Place::Snap(..) => {
                if mask & W_OK != 0 {
                    return err(libc::EROFS, "snapshots are read-only");
                }
                return self.read_on(ino, |tx, slot, l| {
                    let i = tx.get(l)?;
                    if i.kind == FileKind::Symlink {
                        return err(libc::ELOOP, "is a symlink");
                    }
                    perm::check(&i, cred, mask)?;
                    Ok(attr_of(slot, tx.info.guid, &i))
                });
            }
        };
        self.inc_open(local);
        let trunc = flags & libc::O_TRUNC != 0;
        let check = |tx: &mut Tx| {
            let mut i = tx.get(local)?;
            if i.is_dir() && mask & W_OK != 0 {
                return err(libc::EISDIR, "is a directory");
            }
            if i.kind == FileKind::Symlink {
                return err(libc::ELOOP, "is a symlink");
            }
            perm::check(&i, cred, mask)?;
            // Opening a file (not a FIFO, socket or device) for writing on a
            // read-only dataset fails at open, as on a read-only mount.
            let writes_data = i.kind == FileKind::Regular || i.is_dir();
            if mask & W_OK != 0 && writes_data && tx.info.readonly {
                return err(libc::EROFS, "the dataset is read-only");
            }
            if trunc && i.kind == FileKind::Regular {
                Self::open_truncate(tx, &mut i, cred)?;
            }
            Ok(attr_of(0, tx.info.guid, &i))
        };
        let r = if trunc {
            self.write_txn(check)
        } else {
            self.read_on(local, |tx, _, _| check(tx))
        };
        if r.is_err() {
            // Undo the count (and free the inode if it became an orphan).
            let _ = self.release(local);
        }
        r
    }

    /// Opens directory `ino` for reading (needs read permission).
    pub fn opendir(&self, ino: u64, cred: &Cred) -> Result<Attr> {
        let a = self.getattr(ino)?;
        if a.kind != FileKind::Directory {
            return err(libc::ENOTDIR, "not a directory");
        }
        if let Place::Live(l) = self.place(ino)? {
            self.inc_open(l);
            let r = self.read_on(l, |tx, _, l| perm::check(&tx.get(l)?, cred, R_OK));
            if let Err(e) = r {
                let _ = self.release(l);
                return Err(e);
            }
        } else if let Place::Snap(..) = self.place(ino)? {
            self.read_on(ino, |tx, _, l| perm::check(&tx.get(l)?, cred, R_OK))?;
        }
        Ok(a)
    }

    /// Ends one open of `ino` (from `open`, `create` or `opendir`); the
    /// last release of an unlinked inode frees it.
    pub fn release(&self, ino: u64) -> Result<()> {
        let local = match self.place(ino) {
            Ok(Place::Live(l)) => l,
            _ => return Ok(()),
        };
        {
            let mut open = lock(&self.open);
            match open.get_mut(&local) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    return Ok(());
                }
                Some(_) => {
                    open.remove(&local);
                    // The last close ends the file's sequential readers.
                    self.readahead.forget((0, local));
                }
                None => {}
            }
        }
        self.live.txn(true, &mut |s| {
            let mut tx = Tx::new(s);
            if tx.info.readonly {
                return Ok(());
            }
            match tx.try_get(local)? {
                Some(i) if i.nlink == 0 && self.open_count(local) == 0 => {
                    tx.free(local)?;
                    tx.s.delete(&inode::orphan_key(local))?;
                }
                _ => {}
            }
            Ok(())
        })
    }

    /// Same as [`Fs::release`], for directories.
    pub fn releasedir(&self, ino: u64) -> Result<()> {
        self.release(ino)
    }

    /// Reads up to `size` bytes (at most [`MAX_READ`]) at `offset`: short
    /// at end of file; holes read as zeros. Refreshes atime by relatime
    /// rules.
    pub fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        Ok(self.read_data(ino, offset, size)?.to_vec())
    }

    /// [`Fs::read`] without assembling the bytes: they come as ranges of
    /// the blocks that hold them, shared with the block cache, so a front
    /// end can write them to a socket with no copy at all.
    pub fn read_data(&self, ino: u64, offset: u64, size: u32) -> Result<ReadData> {
        self.read_data_with(ino, offset, size, true)
    }

    /// [`Fs::read_data`] that leaves atime alone, whatever the dataset
    /// says: what a read-only mount of a writable dataset reads with
    /// (reading through it must not write).
    pub fn read_data_without_atime(&self, ino: u64, offset: u64, size: u32) -> Result<ReadData> {
        self.read_data_with(ino, offset, size, false)
    }

    fn read_data_with(&self, ino: u64, offset: u64, size: u32, atime: bool) -> Result<ReadData> {
        if let Place::SnapDir = self.place(ino)? {
            return err(libc::EISDIR, "is a directory");
        }
        // The blocks are found under the dataset's lock and read after it
        // is released, so reads of one dataset overlap (see `file`).
        let (plan, touch, ahead) = self.read_on(ino, |tx, slot, l| {
            let i = tx.get(l)?;
            match i.kind {
                FileKind::Regular => {}
                FileKind::Directory => return err(libc::EISDIR, "is a directory"),
                _ => return err(libc::EINVAL, "not a regular file"),
            }
            let len = u64::from(size.min(MAX_READ));
            let plan = file::read_plan(tx, &i, offset, len)?;
            // Read-ahead is advice: a failure to plan it is the next
            // read's to meet, not this one's.
            let ahead = match self.readahead.on_read((slot, l), offset, len, file::rs(&i)) {
                Some(r) => file::prefetch_plan(tx, &i, r).unwrap_or_default(),
                None => Vec::new(),
            };
            Ok((plan, wants_atime(tx, &i), ahead))
        })?;
        if !ahead.is_empty() {
            readahead::submit(ahead);
        }
        let data = plan.run()?;
        if touch && atime {
            self.touch_atime(ino);
        }
        Ok(data)
    }

    /// Best-effort atime refresh after a read (a failure, e.g. ENOSPC,
    /// must not fail the read).
    pub(crate) fn touch_atime(&self, ino: u64) {
        if let Ok(local) = self.live_ino(ino) {
            let _ = self.write_txn(|tx| {
                let mut i = tx.get(local)?;
                if wants_atime(tx, &i) {
                    i.atime = tx.now;
                    tx.put(i);
                }
                Ok(())
            });
        }
    }

    /// Writes `data` at `offset` (or atomically at end of file when
    /// `append`), returning the bytes written. A write by non-root clears
    /// set-id bits, as Linux does.
    pub fn write(
        &self,
        ino: u64,
        offset: u64,
        data: &[u8],
        append: bool,
        cred: &Cred,
    ) -> Result<usize> {
        self.write_iov(ino, offset, &[data], append, cred)
    }

    /// [`Fs::write`] of the slices of `iov` taken as one run of bytes, in
    /// one transaction: a front end that receives a payload in pieces (an
    /// HTTP body's frames) writes them without gathering them first.
    pub fn write_iov(
        &self,
        ino: u64,
        offset: u64,
        iov: &[&[u8]],
        append: bool,
        cred: &Cred,
    ) -> Result<usize> {
        let len: usize = iov.iter().map(|d| d.len()).sum();
        let local = self.live_ino(ino)?;
        let generation = self.live.generation();
        if !self.continues_last_write(ino, offset, len as u64, append, generation) {
            self.warm_for_write(ino, offset, len as u64, append);
        }
        let (end, rs) = self.write_txn(|tx| {
            let mut i = tx.get(local)?;
            match i.kind {
                FileKind::Regular => {}
                FileKind::Directory => return err(libc::EISDIR, "is a directory"),
                _ => return err(libc::EINVAL, "not a regular file"),
            }
            let off = if append { i.size } else { offset };
            file::write(tx, &mut i, off, iov)?;
            let rs = file::rs(&i);
            if len > 0 {
                i.mtime = tx.now;
                i.ctime = tx.now;
                if !cred.is_root() {
                    i.mode = perm::kill_setid(i.mode);
                }
                tx.put(i);
            }
            Ok((off + len as u64, rs))
        })?;
        if let Some(generation) = generation.filter(|_| len > 0) {
            let mut last = lock(&self.last_writes);
            if last.len() >= LAST_WRITES && !last.contains_key(&ino) {
                // Forget one (whichever the map yields first).
                if let Some(&old) = last.keys().next() {
                    last.remove(&old);
                }
            }
            last.insert(
                ino,
                LastWrite {
                    end,
                    rs,
                    generation,
                },
            );
        }
        Ok(len)
    }

    /// True when a write of `len` bytes at `offset` continues the file's
    /// last write inside the record where that one ended, in the same
    /// generation (open txg): that record is in the open txg already, so
    /// warming (a read transaction per write: 6–13% of the daemon's CPU
    /// for 4 KiB sequential writes) would find nothing to read. A wrong
    /// guess costs only speed: the write's transaction reads what it needs.
    fn continues_last_write(
        &self,
        ino: u64,
        offset: u64,
        len: u64,
        append: bool,
        generation: Option<u64>,
    ) -> bool {
        let Some(generation) = generation else {
            return false;
        };
        if append || len == 0 {
            return false;
        }
        let Some(last) = lock(&self.last_writes).get(&ino).copied() else {
            return false;
        };
        last.generation == generation
            && last.end == offset
            && !offset.is_multiple_of(last.rs)
            && offset / last.rs == (offset + len - 1) / last.rs
    }

    /// Reads the records a write covers in part into the block cache
    /// before its transaction. Patching a record that is not in the open
    /// txg needs the old record, and read inside the write's transaction
    /// that disk read would hold the dataset's lock, and with it every
    /// other request on the dataset; read here, the reads of many writers
    /// run at once. Nothing is decided from what is read: a record that
    /// changed since, or a read that failed, is read again (and its error
    /// reported) by the write's transaction.
    fn warm_for_write(&self, ino: u64, offset: u64, len: u64, append: bool) {
        if len == 0 {
            return;
        }
        let readers = self.read_on(ino, |tx, _, l| {
            let i = tx.get(l)?;
            if i.kind != FileKind::Regular {
                return Ok(Vec::new());
            }
            let off = if append { i.size } else { offset };
            file::patch_readers(tx, &i, off, len)
        });
        for read in readers.unwrap_or_default() {
            let _ = read();
        }
    }

    /// `fallocate`: mode 0 only extends the size (a copy-on-write store
    /// cannot reserve blocks ahead of writing them, so nothing is
    /// preallocated); `KEEP_SIZE` alone is accepted and does nothing;
    /// `PUNCH_HOLE | KEEP_SIZE` frees the range. Other modes: EOPNOTSUPP.
    /// A change by anyone but root clears the setuid and setgid bits, as a
    /// write does (the kernel leaves that to the filesystem here).
    pub fn fallocate(
        &self,
        ino: u64,
        offset: u64,
        length: u64,
        mode: u32,
        cred: &Cred,
    ) -> Result<()> {
        let local = self.live_ino(ino)?;
        if length == 0 || offset > i64::MAX as u64 || length > i64::MAX as u64 {
            return err(libc::EINVAL, "bad fallocate range");
        }
        let punch = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
        if mode != 0 && mode != FALLOC_FL_KEEP_SIZE && mode != punch {
            return err(libc::EOPNOTSUPP, "unsupported fallocate mode");
        }
        let end = offset
            .checked_add(length)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or_else(|| FsError::new(libc::EFBIG, "beyond the largest file size"))?;
        self.write_txn(|tx| {
            let mut i = tx.get(local)?;
            match i.kind {
                FileKind::Regular => {}
                FileKind::Directory => return err(libc::EISDIR, "is a directory"),
                _ => return err(libc::ENODEV, "not a regular file"),
            }
            let changes = mode == punch || (mode == 0 && end > i.size);
            if mode == punch {
                file::punch(tx, &mut i, offset, length)?;
            } else if mode == 0 && end > i.size {
                i.size = end;
            }
            if changes {
                i.mtime = tx.now;
                i.ctime = tx.now;
                if !cred.is_root() {
                    i.mode = perm::kill_setid(i.mode);
                }
                tx.put(i);
            }
            Ok(())
        })
    }

    /// Makes every completed change durable (the dataset's txg sync).
    pub fn fsync(&self, ino: u64) -> Result<()> {
        match self.place(ino)? {
            Place::Live(_) => self.live.sync(),
            _ => Ok(()),
        }
    }
}
