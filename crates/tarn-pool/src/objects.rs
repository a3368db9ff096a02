//! Raw objects: named byte arrays stored directly in the pool's meta tree,
//! split into records of the pool's `recordsize`. They predate datasets and
//! serve drills, crash tests and benchmarks; each dirty record holds its
//! room from the moment it is accepted (see `ext::Reservation`), and sync
//! step 2 writes them.

use std::ops::Bound;

use serde::{Deserialize, Serialize};
use tarn_block::pipeline::Missed;
use tarn_block::BlockPtr;

use crate::pool::{now_unix, Pool, State};
use crate::store::HoldGuard;
use crate::sync::parallel_map;
use crate::PoolError;

/// Prefix of raw-object directory entries: prefix + name.
pub(crate) const P_OBJDIR: u8 = 0x10;
/// Prefix of raw-object records: prefix + object id (BE) + record index (BE).
pub(crate) const P_RECORD: u8 = 0x20;

/// A raw object's directory entry (JSON in the meta tree).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct ObjEntry {
    pub id: u64,
    pub size: u64,
    pub recordsize: u32,
    pub mtime_unix: u64,
}

/// What the API reports about a raw object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectInfo {
    /// Object name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// The txg that holds this state (the open txg when not yet synced).
    pub txg: u64,
}

pub(crate) fn record_key(id: u64, blk: u64) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[0] = P_RECORD;
    k[1..9].copy_from_slice(&id.to_be_bytes());
    k[9..17].copy_from_slice(&blk.to_be_bytes());
    k
}

pub(crate) fn objdir_key(name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + name.len());
    k.push(P_OBJDIR);
    k.extend_from_slice(name.as_bytes());
    k
}

fn check_object_name(name: &str) -> Result<(), PoolError> {
    if name.is_empty() || name.len() > 255 || name.contains('\0') {
        return Err(PoolError::Invalid(format!(
            "invalid object name {name:?}: 1-255 bytes, no NUL"
        )));
    }
    Ok(())
}

impl Pool {
    fn lookup_object(&self, st: &mut State, name: &str) -> Result<Option<ObjEntry>, PoolError> {
        let State { meta, .. } = st;
        let v = meta.get(&self.read_store(), &objdir_key(name))?;
        match v {
            None => Ok(None),
            Some(v) => {
                let e: ObjEntry = serde_json::from_slice(&v).map_err(|e| {
                    PoolError::Corrupt(format!("directory entry of object '{name}': {e}"))
                })?;
                if !e.recordsize.is_power_of_two() || e.recordsize < 512 {
                    return Err(PoolError::Corrupt(format!(
                        "directory entry of object '{name}': record size {}",
                        e.recordsize
                    )));
                }
                Ok(Some(e))
            }
        }
    }

    fn store_object(&self, st: &mut State, name: &str, e: &ObjEntry) -> Result<(), PoolError> {
        let json = serde_json::to_vec(e).map_err(|e| PoolError::Internal(e.to_string()))?;
        let State { meta, .. } = st;
        meta.insert(&self.read_store(), &objdir_key(name), &json)?;
        Ok(())
    }

    /// Reads one record's current bytes (dirty or on disk); `None` for a hole.
    fn load_record(
        &self,
        st: &mut State,
        obj: &str,
        id: u64,
        blk: u64,
        rs: u64,
    ) -> Result<Option<Vec<u8>>, PoolError> {
        if let Some(d) = st.dirty.get(&(id, blk)) {
            return Ok(Some(d.clone()));
        }
        let State { meta, .. } = st;
        let v = meta.get(&self.read_store(), &record_key(id, blk))?;
        let Some(v) = v else { return Ok(None) };
        let bp = BlockPtr::decode(&v)?;
        match self.read_data(&bp) {
            Ok(d) => Ok(Some(d.to_vec())),
            Err(e) => {
                let what = format!("object {obj} at offset {}", blk * rs);
                st.ms.damaged.insert(what.clone());
                st.ms_dirty = true;
                Err(PoolError::Damaged(format!("{what}: {e}")))
            }
        }
    }

    /// Writes `data` at `offset` of raw object `name`, creating it. With
    /// `sync`, returns only after the txg holding the write has committed.
    pub fn object_write(
        &self,
        name: &str,
        offset: u64,
        data: &[u8],
        sync: bool,
    ) -> Result<ObjectInfo, PoolError> {
        check_object_name(name)?;
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|e| *e <= 1 << 50)
            .ok_or_else(|| {
                PoolError::Invalid(format!(
                    "write beyond the maximum object size at offset {offset}"
                ))
            })?;
        let st = self.lock();
        self.check_usable(&st)?;
        // Throttle once, before anything is looked up: the whole write then
        // happens under the lock, so the directory entry cannot go stale and
        // the write lands in one txg. One call may overshoot the dirty limit
        // by its own size, which its caller bounds.
        let mut st = self.throttle(st)?;
        let existing = self.lookup_object(&mut st, name)?;
        let is_new = existing.is_none();
        let mut entry = match existing {
            Some(e) => e,
            None => {
                let id = st.ms.next_object;
                st.ms.next_object += 1;
                st.ms_dirty = true;
                ObjEntry {
                    id,
                    size: 0,
                    recordsize: st.props.recordsize,
                    mtime_unix: now_unix(),
                }
            }
        };
        let rs = entry.recordsize as u64;
        let mut pos = offset;
        let mut src = data;
        let mut failure = None;
        while !src.is_empty() {
            let blk = pos / rs;
            let in_rec = (pos % rs) as usize;
            let n = (rs as usize - in_rec).min(src.len());
            let key = (entry.id, blk);
            if !st.dirty.contains_key(&key) {
                // The record's room is allocated now, so the sync that
                // writes it cannot run out of space.
                let copies = st.props.copies;
                let reservation = match self.reserve_data(&mut st, rs, copies) {
                    Ok(r) => r,
                    Err(_) => {
                        // What was already accepted stays; report the shortfall.
                        st.sync_requested = true;
                        self.cv.notify_all();
                        failure = Some(PoolError::NoSpace(format!(
                            "pool '{}' has no room for object {name} at offset {pos}",
                            self.name
                        )));
                        break;
                    }
                };
                let base = if in_rec == 0 && n as u64 == rs {
                    Vec::new()
                } else {
                    match self.load_record(&mut st, name, entry.id, blk, rs) {
                        Ok(b) => b.unwrap_or_default(),
                        Err(e) => {
                            self.release_data(&mut st, reservation);
                            failure = Some(e);
                            break;
                        }
                    }
                };
                st.dirty_bytes += rs;
                st.dirty.insert(key, base);
                st.dirty_res.insert(key, reservation);
            }
            let Some(buf) = st.dirty.get_mut(&key) else {
                return Err(PoolError::Internal("dirty record vanished".into()));
            };
            if buf.len() < in_rec + n {
                buf.resize(in_rec + n, 0);
            }
            buf[in_rec..in_rec + n].copy_from_slice(&src[..n]);
            pos += n as u64;
            src = &src[n..];
        }
        // Record what was accepted even when the write stopped part-way, so
        // no record is ever left without its directory entry.
        if failure.is_some() && is_new && pos == offset {
            // Nothing of a new object was accepted: it does not come to be.
            return Err(failure.unwrap_or_else(|| PoolError::Internal("lost error".into())));
        }
        entry.size = entry.size.max(if failure.is_some() { pos } else { end });
        entry.mtime_unix = now_unix();
        if let Err(e) = self.store_object(&mut st, name, &entry) {
            // Records without their directory entry must not commit.
            self.set_fault(format!(
                "object {name}: cannot store its directory entry: {e}"
            ));
            self.cv.notify_all();
            return Err(e);
        }
        if let Some(e) = failure {
            return Err(e);
        }
        if st.dirty_bytes >= self.opts.dirty_sync_bytes {
            self.cv.notify_all();
        }
        let info = ObjectInfo {
            name: name.to_string(),
            size: entry.size,
            txg: st.txg + 1,
        };
        if sync {
            if let Err(e) = self.sync_locked(&mut st) {
                self.set_fault(format!("txg sync failed: {e}"));
                self.cv.notify_all();
                return Err(e);
            }
            self.cv.notify_all();
            return Ok(ObjectInfo {
                txg: st.txg,
                ..info
            });
        }
        Ok(info)
    }

    /// Reads up to `len` bytes at `offset` of raw object `name`.
    pub fn object_read(&self, name: &str, offset: u64, len: usize) -> Result<Vec<u8>, PoolError> {
        let mut st = self.lock();
        self.check_usable(&st)?;
        let entry = self.lookup_object(&mut st, name)?.ok_or_else(|| {
            PoolError::NotFound(format!("no object '{name}' in pool '{}'", self.name))
        })?;
        if offset >= entry.size {
            return Ok(Vec::new());
        }
        let len = (len as u64).min(entry.size - offset) as usize;
        let rs = entry.recordsize as u64;
        let mut out = vec![0u8; len];
        let mut done = 0usize;
        // Pointers are looked up under the lock, blocks read without it,
        // under a hold on the committed txg.
        let mut to_read: Vec<(usize, usize, usize, BlockPtr, u64)> = Vec::new();
        while done < len {
            let pos = offset + done as u64;
            let blk = pos / rs;
            let in_rec = (pos % rs) as usize;
            let n = (rs as usize - in_rec).min(len - done);
            if let Some(d) = st.dirty.get(&(entry.id, blk)) {
                let have = d.len().saturating_sub(in_rec).min(n);
                if have > 0 {
                    out[done..done + have].copy_from_slice(&d[in_rec..in_rec + have]);
                }
            } else {
                let State { meta, .. } = &mut *st;
                let v = meta.get(&self.read_store(), &record_key(entry.id, blk))?;
                if let Some(v) = v {
                    to_read.push((done, in_rec, n, BlockPtr::decode(&v)?, blk));
                }
            }
            done += n;
        }
        let hold: HoldGuard<'_> = self.holds.hold(st.txg);
        drop(st);
        let mut damaged = Vec::new();
        // Records are independent: read them on the worker threads.
        let blocks = parallel_map(&to_read, self.opts.sync_threads, |(_, _, _, bp, _)| {
            self.read_data(bp)
        })?;
        for ((at, in_rec, n, _, blk), r) in to_read.into_iter().zip(blocks) {
            match r {
                Ok(d) => {
                    let have = d.len().saturating_sub(in_rec).min(n);
                    if have > 0 {
                        out[at..at + have].copy_from_slice(&d[in_rec..in_rec + have]);
                    }
                }
                Err(e) => damaged.push((format!("object {name} at offset {}", blk * rs), e)),
            }
        }
        drop(hold);
        if let Some((what, e)) = damaged.first() {
            let mut st = self.lock();
            for (w, _) in &damaged {
                st.ms.damaged.insert(w.clone());
            }
            st.ms_dirty = true;
            return Err(PoolError::Damaged(format!("{what}: {e}")));
        }
        Ok(out)
    }

    /// Size of a raw object.
    pub fn object_info(&self, name: &str) -> Result<ObjectInfo, PoolError> {
        let mut st = self.lock();
        self.check_usable(&st)?;
        let e = self.lookup_object(&mut st, name)?.ok_or_else(|| {
            PoolError::NotFound(format!("no object '{name}' in pool '{}'", self.name))
        })?;
        Ok(ObjectInfo {
            name: name.to_string(),
            size: e.size,
            txg: st.txg,
        })
    }

    /// Every raw object, by name.
    pub fn object_list(&self) -> Result<Vec<ObjectInfo>, PoolError> {
        let mut st = self.lock();
        self.check_usable(&st)?;
        let txg = st.txg;
        let mut out = Vec::new();
        self.for_each_entry(
            &mut st,
            &[P_OBJDIR],
            Bound::Excluded(&[P_OBJDIR + 1][..]),
            &mut |k, v| {
                let e: ObjEntry = serde_json::from_slice(v)
                    .map_err(|e| PoolError::Corrupt(format!("object directory: {e}")))?;
                out.push(ObjectInfo {
                    name: String::from_utf8_lossy(&k[1..]).into_owned(),
                    size: e.size,
                    txg,
                });
                Ok(true)
            },
        )?;
        Ok(out)
    }

    /// Deletes a raw object; its blocks are freed when the txg commits.
    pub fn object_delete(&self, name: &str) -> Result<(), PoolError> {
        let mut st = self.lock();
        self.check_usable(&st)?;
        let e = self.lookup_object(&mut st, name)?.ok_or_else(|| {
            PoolError::NotFound(format!("no object '{name}' in pool '{}'", self.name))
        })?;
        let dropped: Vec<(u64, u64)> = st
            .dirty
            .range((e.id, 0)..=(e.id, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in dropped {
            st.dirty.remove(&k);
            st.dirty_bytes = st.dirty_bytes.saturating_sub(e.recordsize as u64);
            if let Some(r) = st.dirty_res.remove(&k) {
                self.release_data(&mut st, r);
            }
        }
        let rs = self.read_store();
        let State { meta, frees, .. } = &mut *st;
        let lo = record_key(e.id, 0);
        let hi = record_key(e.id, u64::MAX);
        loop {
            let page = meta.range(
                &rs,
                Bound::Included(&lo[..]),
                Bound::Included(&hi[..]),
                4096,
            )?;
            if page.is_empty() {
                break;
            }
            for (k, v) in page {
                frees.push(BlockPtr::decode(&v)?);
                meta.remove(&rs, &k)?;
            }
        }
        meta.remove(&rs, &objdir_key(name))?;
        let prefix = format!("object {name} at offset ");
        let before = st.ms.damaged.len();
        st.ms.damaged.retain(|d| !d.starts_with(&prefix));
        if st.ms.damaged.len() != before {
            st.ms_dirty = true;
        }
        Ok(())
    }

    /// The committed block pointers of a raw object, by record index: a
    /// diagnostic view (like `zdb`) for drills and tests.
    pub fn object_blocks(&self, name: &str) -> Result<Vec<(u64, BlockPtr)>, PoolError> {
        let mut st = self.lock();
        self.check_usable(&st)?;
        let e = self.lookup_object(&mut st, name)?.ok_or_else(|| {
            PoolError::NotFound(format!("no object '{name}' in pool '{}'", self.name))
        })?;
        let hi = record_key(e.id, u64::MAX);
        let mut out = Vec::new();
        self.for_each_entry(
            &mut st,
            &record_key(e.id, 0),
            Bound::Included(&hi[..]),
            &mut |k, v| {
                let mut blk = [0u8; 8];
                blk.copy_from_slice(
                    k.get(9..17)
                        .ok_or_else(|| PoolError::Corrupt("short record key".into()))?,
                );
                out.push((u64::from_be_bytes(blk), BlockPtr::decode(v)?));
                Ok(true)
            },
        )?;
        Ok(out)
    }

    /// Sync step 2: the dirty records of raw objects, compressed and
    /// checksummed in parallel and written into the room each was given
    /// when it became dirty; the meta tree then points at them.
    pub(crate) fn sync_objects(
        &self,
        st: &mut State,
        missed: &mut Vec<Missed>,
    ) -> Result<(), PoolError> {
        let items: Vec<((u64, u64), Vec<u8>)> = std::mem::take(&mut st.dirty).into_iter().collect();
        let mut res = std::mem::take(&mut st.dirty_res);
        st.dirty_bytes = 0;
        let opts = crate::ext::BlockOpts {
            compression: st.props.compression(),
            checksum: st.props.checksum_alg(),
            copies: st.props.copies,
        };
        let blocks: Vec<(
            &[u8],
            crate::ext::BlockOpts,
            Option<crate::ext::Reservation>,
        )> = items
            .iter()
            .map(|(k, d)| (d.as_slice(), opts, res.remove(k)))
            .collect();
        let written = self.write_data(st, missed, blocks)?;
        let State { meta, frees, .. } = &mut *st;
        let rs = self.read_store();
        for (((id, blk), _), new) in items.iter().zip(written) {
            let key = record_key(*id, *blk);
            let old = match new {
                Some(bp) => meta.insert(&rs, &key, &bp.encode())?,
                None => meta.remove(&rs, &key)?,
            };
            if let Some(old) = old {
                frees.push(BlockPtr::decode(&old)?);
            }
        }
        Ok(())
    }
}
