//! Space accounting: `used`, `referenced`, `available`, quotas and
//! reservations, and the `list` view of a dataset.
//!
//! # Theory
//!
//! **Accounting.** Per dataset: `referenced` (every block the tree
//! reaches), `unique` (blocks born after `prev_snap_txg`: what destroying
//! the head would free) and the deadlist summaries. Tree nodes count like
//! data. Snapshots record `written`, the head's unique space when they
//! were taken. Everything is in allocated bytes (parity and copies
//! included), like ZFS; `compressratio` uses logical and physical sizes.
//!
//! **Checks per write.** Every block a transaction stages asks whether
//! its dataset may grow ([`Dir::check_room`]): the quotas above it, and
//! the pool's room less what other datasets hold reserved and have not
//! used. A dataset's `used` is computed from the records (what its tree
//! reaches but shares with no origin, its snapshots' deadlists, its
//! children's `used`), which walks
//! every record; asked per write, a pool with a thousand snapshots ran
//! 4k writes at a twentieth of their rate. `used` changes only when the
//! directory does (a sync, an administrative operation), so the figures
//! the checks need are kept in a [`SpaceMemo`] that every change drops:
//! the directory's lock hands it out through a guard that notes a
//! mutable borrow (`DirGuard` in `dsl`), and while a holder may change
//! it nothing is kept. The open txg's own bytes (`pending`) are read
//! fresh each time.
//!
//! **Counting each byte once.** `pending` is what a dataset's open and
//! syncing txgs staged; a transaction publishes it when it ends, so each
//! block's check also adds what its own transaction staged before it
//! (`unpublished`). The sync adds a txg's blocks to the records' use
//! before the txg commits: from then on they leave `pending`
//! (`Dir::applied`) until `committed` drops the syncing overlay. A parent
//! counts a child as the larger of its use and its reservation, so the
//! part of a write that a dataset's own unused reservation absorbs is not
//! counted again against the quotas above it (it is against its own).
//! The same absorption applies to the pool's room for other datasets:
//! staged blocks already have their rooms (the pool's free space is
//! short of them), so a reservation's unused part is less what its
//! dataset has staged into it, or a thick volume's writes would count
//! twice against everyone else until their txg commits.

use std::cell::RefCell;
use std::collections::HashMap;

use tarn_pool::Cx;

use crate::dsl::Dir;
use crate::props;
use crate::record::{DatasetInfo, DsRec, Sums, VolSpec, DEFLATE_BLOCK};
use crate::DsError;

impl Dir {
    pub(crate) fn snapshots_of(&self, head: u64) -> Vec<u64> {
        let mut v: Vec<&DsRec> = self
            .recs
            .values()
            .filter(|r| r.head == Some(head))
            .collect();
        v.sort_by_key(|r| (r.created_txg, r.id));
        v.into_iter().map(|r| r.id).collect()
    }

    pub(crate) fn children_of(&self, id: u64) -> Vec<u64> {
        self.recs
            .values()
            .filter(|r| r.parent == Some(id) && !r.is_snapshot())
            .map(|r| r.id)
            .collect()
    }

    /// (by dataset, by snapshots, by children) of a filesystem.
    pub(crate) fn used_parts(&self, id: u64) -> (Sums, Sums, Sums) {
        let Some(r) = self.recs.get(&id) else {
            return Default::default();
        };
        let from = self.origin_txg(id);
        let mut snaps = self.dead_from(id, from);
        let chain = self.snapshots_of(id);
        for s in &chain {
            snaps.add(self.dead_from(*s, from));
        }
        let by_ds = self.head_used(r, &chain);
        let mut children = Sums::default();
        for c in self.children_of(id) {
            let u = self.used(c);
            let res = self.inflate(self.prop_u64(c, "reservation").unwrap_or(0));
            children.add(Sums {
                asize: u.asize.max(res),
                ..u
            });
        }
        (by_ds, snaps, children)
    }

    /// What a head holds that was born in it: every block its tree
    /// reaches (`referenced`) but those it still shares with its origin
    /// snapshot (ZFS's `usedbydataset`). Blocks it shares with its own
    /// snapshots count here, not in `unique` (which is what was born
    /// since the last snapshot, `written`): a snapshot moves nothing out
    /// of a dataset's use until the head lets go of a block. The shared
    /// part of a clone is its origin's `referenced` less the origin's
    /// blocks the clone has let go of since, which its deadlists (the
    /// head's and its snapshots') hold in the buckets below the origin's
    /// txg (a block born at or before it sorts below it).
    fn head_used(&self, r: &DsRec, chain: &[u64]) -> Sums {
        let Some(o) = r.origin.and_then(|o| self.recs.get(&o)) else {
            return r.referenced;
        };
        let below = o.created_txg;
        let mut shared = o.referenced;
        for m in chain.iter().copied().chain([r.id]) {
            if let Some(m) = self.recs.get(&m) {
                for s in m.dead.range(..below).map(|(_, s)| *s) {
                    shared.sub(s);
                }
            }
        }
        let mut own = r.referenced;
        own.sub(shared);
        own
    }

    pub(crate) fn used(&self, id: u64) -> Sums {
        match self.recs.get(&id) {
            Some(r) if r.is_snapshot() => self.snap_used(id),
            Some(_) => {
                let (a, b, c) = self.used_parts(id);
                a.plus(b).plus(c)
            }
            None => Sums::default(),
        }
    }

    pub(crate) fn ancestors_and_self(&self, id: u64) -> Vec<u64> {
        let mut out = Vec::new();
        let mut cur = Some(id);
        while let Some(c) = cur {
            out.push(c);
            cur = self.recs.get(&c).and_then(|r| r.parent);
        }
        out
    }

    /// Bytes charged in the open txg to `id` and its descendants.
    pub(crate) fn pending(&self, id: u64) -> u64 {
        self.pending
            .iter()
            .filter(|(l, _)| self.ancestors_and_self(**l).contains(&id))
            .map(|(l, p)| {
                let applied = self.applied.get(l).copied().unwrap_or(0);
                p.load(std::sync::atomic::Ordering::Relaxed)
                    .saturating_sub(applied)
            })
            .sum()
    }

    /// Allocated bytes in the space a user counts: raidz parity and padding
    /// taken out at the ratio of a 128 KiB block, as `zfs list` does, so a
    /// 1 GiB file shows as about 1G used and quotas mean what they say.
    pub(crate) fn deflate(&self, raw: u64) -> u64 {
        let per = self.alloc_per_block.max(1);
        ((raw as u128 * DEFLATE_BLOCK as u128) / per as u128) as u64
    }

    /// The inverse of [`Dsl::deflate`], rounded up.
    pub(crate) fn inflate(&self, user: u64) -> u64 {
        let per = self.alloc_per_block.max(1);
        u64::try_from((user as u128 * per as u128).div_ceil(DEFLATE_BLOCK as u128))
            .unwrap_or(u64::MAX)
    }

    /// `used(d).asize`, kept in the memo while the directory is unchanged.
    /// What a quota of `id` counts: its use with everything under it and
    /// what is staged for it, in user bytes.
    pub(crate) fn user_used(&self, id: u64) -> u64 {
        self.deflate(self.used_asize(id).saturating_add(self.pending(id)))
    }

    fn used_asize(&self, d: u64) -> u64 {
        // Its own statement: the borrow ends before `keep` borrows mutably.
        let got = self.memo.used.borrow().get(&d).copied();
        kept_or(
            got,
            || self.used(d).asize,
            |v| self.memo.keep(|| self.memo.used.borrow_mut().insert(d, v)),
            || format!("kept used of dataset {d}"),
        )
    }

    /// The filesystems and volumes with a reservation, kept in the memo
    /// while the directory is unchanged (most pools have few or none).
    fn reserved_ids(&self) -> Vec<u64> {
        let compute = || {
            let mut v: Vec<u64> = self
                .recs
                .values()
                .filter(|r| !r.is_snapshot() && self.prop_u64(r.id, "reservation").unwrap_or(0) > 0)
                .map(|r| r.id)
                .collect();
            v.sort_unstable();
            v
        };
        // Its own statement: the borrow ends before `keep` borrows mutably.
        let got = self.memo.reserved.borrow().clone();
        if let Some(v) = got {
            debug_assert_eq!(v, compute(), "kept reserved datasets");
            return v;
        }
        let v = compute();
        self.memo
            .keep(|| *self.memo.reserved.borrow_mut() = Some(v.clone()));
        v
    }

    /// What each dataset of `reserved` holds reserved and has not used
    /// (user bytes), the open and syncing txgs' staged bytes included.
    /// Those bytes have their rooms already, so the pool's free space is
    /// short of them; counting them again as unused reservation would
    /// charge a thick volume's writes twice against every other dataset
    /// until they commit. A write flows up from its dataset: each
    /// reservation on the way absorbs what it has left, and only the rest
    /// grows the next one up (a parent counts a child as the larger of
    /// its use and its reservation).
    fn unused_reserved_now(&self, reserved: &[u64]) -> HashMap<u64, u64> {
        let mut left: HashMap<u64, u64> = reserved
            .iter()
            .map(|d| (*d, self.unused_reservation(*d)))
            .collect();
        for (l, p) in &self.pending {
            let applied = self.applied.get(l).copied().unwrap_or(0);
            let staged = p
                .load(std::sync::atomic::Ordering::Relaxed)
                .saturating_sub(applied);
            let mut v = self.deflate(staged);
            let mut cur = Some(*l);
            while let (Some(c), true) = (cur, v > 0) {
                if let Some(u) = left.get_mut(&c) {
                    let take = v.min(*u);
                    *u -= take;
                    v -= take;
                }
                cur = self.recs.get(&c).and_then(|r| r.parent);
            }
        }
        left
    }

    /// The reservation (user bytes) that lets a volume of `spec` be
    /// filled whole with `copies` copies of each block: every block's
    /// allocation with its parity and padding at this block size (a 16K
    /// block on raidz costs more than its nominal share), plus an
    /// allowance for the tree that points at the blocks (a 160-byte
    /// pointer and its key per block, in nodes stored with metadata
    /// copies). ZFS sizes a zvol's refreservation the same way.
    pub(crate) fn thick_reservation(&self, cx: &Cx<'_>, spec: VolSpec, copies: u8) -> u64 {
        let blocks = spec.size / spec.block.max(1) as u64;
        let per_block = self.deflate(cx.alloc_cost(spec.block as u64, copies.clamp(1, 3)));
        const TREE_PER_BLOCK: u64 = 512;
        blocks.saturating_mul(per_block.saturating_add(TREE_PER_BLOCK))
    }

    /// Unused part of a dataset's reservation, in user bytes.
    pub(crate) fn unused_reservation(&self, d: u64) -> u64 {
        match self.prop_u64(d, "reservation") {
            Some(r) if r > 0 => r.saturating_sub(self.deflate(self.used_asize(d))),
            _ => 0,
        }
    }

    /// Room in the pool for `id` in user bytes: the pool's writable space
    /// less what other datasets hold reserved and have not used.
    pub(crate) fn pool_room(&self, cx: &Cx<'_>, id: u64) -> u64 {
        let rs = self.prop_u64(id, "recordsize").unwrap_or(128 * 1024);
        let pool = self.deflate(cx.writable(rs));
        let reserved = self.reserved_ids();
        if reserved.is_empty() {
            return pool;
        }
        let own = self.ancestors_and_self(id);
        let others: u64 = self
            .unused_reserved_now(&reserved)
            .into_iter()
            .filter(|(d, _)| !own.contains(d))
            .map(|(_, u)| u)
            .fold(0u64, u64::saturating_add);
        pool.saturating_sub(others)
    }

    /// What `id` may still write (user bytes): its room in the pool, capped
    /// by every quota above it.
    pub(crate) fn available(&self, cx: &Cx<'_>, id: u64) -> u64 {
        let mut avail = self.pool_room(cx, id);
        // An ancestor counts the whole reservations of `id` and of the
        // datasets between them already (a child counts as the larger of
        // its use and its reservation): writes into their unused parts do
        // not grow the ancestor's use.
        let mut below = 0u64;
        for a in self.ancestors_and_self(id) {
            if let Some(q) = self.prop_u64(a, "quota") {
                let used = self.user_used(a);
                avail = avail.min(q.saturating_add(below).saturating_sub(used));
            }
            below = below.saturating_add(self.unused_reservation(a));
        }
        avail
    }

    /// The first of `datasets` whose quota `more` user bytes would pass:
    /// its name, quota and use. `relief`: per dataset, the part of `more`
    /// (and of the pending bytes it counts) that unused reservations below
    /// it absorb, which it counts already (see [`Dir::available`]).
    fn past_quota(
        &self,
        datasets: impl IntoIterator<Item = u64>,
        more: u64,
        relief: &[(u64, u64)],
    ) -> Option<(String, u64, u64)> {
        datasets.into_iter().find_map(|a| {
            let q = self.prop_u64(a, "quota")?;
            let used = self.user_used(a);
            let absorbed = relief.iter().find(|(d, _)| *d == a).map_or(0, |(_, r)| *r);
            (used.saturating_add(more).saturating_sub(absorbed) > q).then(|| {
                let name = self.recs.get(&a).map(|r| r.name.clone());
                (name.unwrap_or_default(), q, used)
            })
        })
    }

    /// Checks that `id`, with what is under it, fits the quotas of its new
    /// ancestors once moved below `new_parent` (a move must not leave a
    /// dataset over its quota, as ZFS refuses too). Quotas it was already
    /// under count it already.
    pub(crate) fn check_move_quota(&self, id: u64, new_parent: u64) -> Result<(), DsError> {
        let before = self.ancestors_and_self(id);
        // A parent counts a child's reservation where it exceeds its use
        // (`used_parts`), so the reservation moves with it.
        let reserved = self.inflate(self.prop_u64(id, "reservation").unwrap_or(0));
        let moved = self.deflate(
            self.used_asize(id)
                .max(reserved)
                .saturating_add(self.pending(id)),
        );
        let new_ones = self
            .ancestors_and_self(new_parent)
            .into_iter()
            .filter(|a| !before.contains(a));
        match self.past_quota(new_ones, moved, &[]) {
            Some((an, q, used)) => Err(DsError::Quota(format!(
                "moving it under '{an}' would take that dataset past its quota of {} ({} used, \
                 {} to move)",
                props::human_bytes(q),
                props::human_bytes(used),
                props::human_bytes(moved)
            ))),
            None => Ok(()),
        }
    }

    /// Checks that `cost` more allocated bytes may be written to `id`;
    /// `unpublished`: room the calling transaction took before, which the
    /// pending figures do not count yet (quotas only: the pool's free
    /// space has it out already).
    pub(crate) fn check_room(
        &self,
        cx: &Cx<'_>,
        id: u64,
        cost: u64,
        unpublished: u64,
    ) -> Result<(), DsError> {
        let user_cost = self.deflate(cost).max(1);
        let quota_cost = self.deflate(cost.saturating_add(unpublished)).max(1);
        let path = self.ancestors_and_self(id);
        // A dataset counts each child as the larger of its use and its
        // reservation, and the pending bytes below it in full. So what
        // the datasets on the way up (`id` first) hold beyond their
        // committed use (pending and this write) is, up to their unused
        // reservations, counted twice by every dataset above them: once
        // in the reservation, once as pending. Each level's reservation
        // takes what the levels below it did not.
        let mut relief = Vec::with_capacity(path.len());
        let mut below = 0u64;
        for &d in &path {
            relief.push((d, below));
            let unused = self.unused_reservation(d);
            if unused > 0 {
                let entering = self
                    .deflate(self.pending(d))
                    .saturating_add(quota_cost)
                    .saturating_sub(below);
                below = below.saturating_add(unused.min(entering));
            }
        }
        if let Some((an, q, _)) = self.past_quota(path, quota_cost, &relief) {
            return Err(DsError::Quota(format!(
                "dataset '{an}' is at its quota of {}",
                props::human_bytes(q)
            )));
        }
        if self.pool_room(cx, id) < user_cost {
            let name = self.recs.get(&id).map_or("", |r| r.name.as_str());
            return Err(DsError::NoSpace(format!(
                "no room in pool '{}' for dataset '{name}'",
                self.pool_name
            )));
        }
        Ok(())
    }

    pub(crate) fn info(&self, cx: &Cx<'_>, id: u64) -> Option<DatasetInfo> {
        let r = self.recs.get(&id)?;
        let snapshot = r.is_snapshot();
        let (by_ds, by_snaps, by_children) = if snapshot {
            (Sums::default(), Sums::default(), Sums::default())
        } else {
            self.used_parts(id)
        };
        let used = self.used(id);
        let mountpoint = if snapshot || r.volume.is_some() {
            None
        } else {
            Some(self.prop(id, "mountpoint").0)
        };
        Some(DatasetInfo {
            name: r.name.clone(),
            kind: r.kind,
            volsize: r.volume.map(|v| v.size),
            volblocksize: r.volume.map(|v| v.block),
            guid: r.guid,
            creation_unix: r.created_unix,
            createtxg: r.created_txg,
            used: self.deflate(used.asize),
            available: if snapshot {
                None
            } else {
                Some(self.available(cx, id))
            },
            referenced: self.deflate(r.referenced.asize),
            logicalused: if snapshot {
                used.lsize
            } else {
                by_ds.lsize + by_snaps.lsize + by_children.lsize
            },
            logicalreferenced: r.referenced.lsize,
            compressratio: if r.referenced.psize == 0 {
                1.0
            } else {
                ((r.referenced.lsize as f64 / r.referenced.psize as f64) * 100.0).round() / 100.0
            },
            usedbydataset: self.deflate(by_ds.asize),
            usedbysnapshots: self.deflate(by_snaps.asize),
            usedbychildren: self.deflate(by_children.asize),
            written: self.deflate(r.unique.asize),
            origin: r
                .origin
                .and_then(|o| self.recs.get(&o))
                .map(|o| o.name.clone()),
            mountpoint,
            encryption: self.encryption(id).map(|e| e.cipher),
            keystatus: self.encryption(id).map(|e| e.status.name().to_string()),
            encryptionroot: self.encryption(id).map(|e| e.root),
        })
    }
}

/// Space figures of a directory computed from its records, kept until the
/// directory changes (see the module docs): each dataset's `used`
/// (allocated bytes) and which datasets have a reservation.
#[derive(Debug, Default)]
pub(crate) struct SpaceMemo {
    /// Set while a holder of the directory may change it: nothing is kept.
    off: bool,
    used: RefCell<HashMap<u64, u64>>,
    reserved: RefCell<Option<Vec<u64>>>,
}

impl SpaceMemo {
    /// Drops every kept figure and keeps none until [`SpaceMemo::resume`]:
    /// the directory is about to change. Only the directory's guard calls
    /// this and `resume` (a holder of `&mut Dir` must not).
    pub(crate) fn suspend(&mut self) {
        self.off = true;
        self.used.get_mut().clear();
        *self.reserved.get_mut() = None;
    }

    /// The change is over: figures computed from now on may be kept
    /// (none were kept since `suspend`).
    pub(crate) fn resume(&mut self) {
        self.off = false;
    }

    /// Runs `put` (which keeps a figure) unless the memo is suspended.
    fn keep<R>(&self, put: impl FnOnce() -> R) {
        if !self.off {
            put();
        }
    }
}

/// `got` if the memo had it (checked against `compute` in debug builds:
/// a kept figure that differs from the records is a missed suspension),
/// else `compute()`, offered to `keep`.
fn kept_or(
    got: Option<u64>,
    compute: impl Fn() -> u64,
    keep: impl FnOnce(u64),
    what: impl Fn() -> String,
) -> u64 {
    match got {
        Some(v) => {
            debug_assert_eq!(v, compute(), "{}", what());
            v
        }
        None => {
            let v = compute();
            keep(v);
            v
        }
    }
}
