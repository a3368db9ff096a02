//! How a dataset record is stored in the pool's meta tree: as one JSON
//! value under its key (`record::ds_key`), or, when that would exceed the
//! meta tree's largest value, with its deadlist summary (`DsRec::dead`)
//! stored apart.
//!
//! # Why
//!
//! A record's `dead` map has one entry per snapshot interval in which a
//! block it freed was born, so it grows with the snapshots a filesystem
//! keeps and the rewrites between them (a volume of a VM snapshotted every
//! hour for a week, then rewritten) with no command of the user making it
//! grow. Stored inline it passes the meta tree's value limit near 170
//! intervals, and a value the tree refuses fails the sync, which stops the
//! pool. Everything else in a record is bounded by the commands that set
//! it ([`check_record_size`]).
//!
//! # Format
//!
//! A record whose JSON fits is stored whole, as always. One that does not
//! is stored with `dead` emptied, and the `dead` map's own JSON in pieces
//! of up to [`PIECE`] bytes under `S` + record id + piece number (u16, big
//! endian), the pool marked with format feature [`LARGE_RECORDS`] so a
//! tarn that does not know this refuses the pool instead of reading the
//! records without their summaries. The sync that writes a record writes
//! both forms' keys in the same txg (and deletes what the other form left),
//! so a crash leaves one form or the other, never a mix. The meta tree
//! scan that finds the blocks a record references reads the record's own
//! key only; the pieces reference no block.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;

use tarn_pool::{PoolError, SyncCx};

use crate::record::{ds_key, hex, DsRec, Sums};
use crate::DsError;

/// Prefix of the pieces of a deadlist summary stored apart.
pub(crate) const P_DEAD_SUMMARY: u8 = b'S';

/// The largest value the meta tree holds: a record's JSON up to this is
/// stored whole, and a summary stored apart is cut in pieces of this size.
pub(crate) const PIECE: usize = tarn_tree::MAX_VALUE;

/// The format feature of a pool with a deadlist summary stored apart.
pub(crate) const LARGE_RECORDS: &str = "large_records";

/// The most bytes of a record without its deadlist summary that a command
/// may make: what stays of [`PIECE`] leaves room for the fields that grow
/// on their own (space figures; a receive's state, with its resume key,
/// up to about 2.6 KiB).
pub(crate) const RECORD_MAX: usize = 5 * 1024;

pub(crate) fn piece_key(id: u64, i: u16) -> Vec<u8> {
    let mut k = vec![P_DEAD_SUMMARY];
    k.extend_from_slice(&id.to_be_bytes());
    k.extend_from_slice(&i.to_be_bytes());
    k
}

fn json<T: serde::Serialize>(v: &T) -> Result<Vec<u8>, PoolError> {
    serde_json::to_vec(v).map_err(|e| PoolError::Internal(e.to_string()))
}

/// Writes `rec`, whose summary has `had` pieces stored apart now (0:
/// none); returns how many it has after.
pub(crate) fn put_record(cx: &mut SyncCx<'_>, rec: &DsRec, had: u16) -> Result<u16, PoolError> {
    let id = rec.id;
    let whole = json(rec)?;
    let (own, pieces) = if whole.len() <= PIECE {
        (whole, Vec::new())
    } else {
        let mut core = rec.clone();
        let dead = std::mem::take(&mut core.dead);
        (json(&core)?, json(&dead)?)
    };
    if own.len() > PIECE {
        return Err(PoolError::Internal(format!(
            "the record of dataset '{}' is {} bytes without its deadlist summary",
            rec.name,
            own.len()
        )));
    }
    let n = u16::try_from(pieces.len().div_ceil(PIECE)).map_err(|_| {
        PoolError::Internal(format!(
            "the deadlist summary of dataset '{}' is {} bytes",
            rec.name,
            pieces.len()
        ))
    })?;
    if n > 0 {
        cx.enable_feature(LARGE_RECORDS);
    }
    cx.meta_put(&ds_key(id), &own)?;
    for (i, piece) in (0..n).zip(pieces.chunks(PIECE)) {
        cx.meta_put(&piece_key(id, i), piece)?;
    }
    for i in n..had {
        cx.meta_delete(&piece_key(id, i))?;
    }
    Ok(n)
}

/// Deletes record `id` and the `had` pieces of its summary.
pub(crate) fn delete_record(cx: &mut SyncCx<'_>, id: u64, had: u16) -> Result<(), PoolError> {
    cx.meta_delete(&ds_key(id))?;
    for i in 0..had {
        cx.meta_delete(&piece_key(id, i))?;
    }
    Ok(())
}

/// Reads the summaries stored apart into their records (loaded before);
/// returns each such record's piece count.
pub(crate) fn load_summaries(
    cx: &mut SyncCx<'_>,
    recs: &mut BTreeMap<u64, DsRec>,
) -> Result<HashMap<u64, u16>, DsError> {
    let hi = vec![P_DEAD_SUMMARY + 1];
    let mut start = Bound::Included(vec![P_DEAD_SUMMARY]);
    let mut found: BTreeMap<u64, (u16, Vec<u8>)> = BTreeMap::new();
    loop {
        let page = cx.meta_range(start.as_ref().map(Vec::as_slice), Bound::Excluded(&hi), 256)?;
        let Some(last) = page.last().map(|(k, _)| k.clone()) else {
            break;
        };
        for (k, v) in page {
            let bad = || DsError::Corrupt(format!("deadlist summary key {}", hex(&k)));
            if k.len() != 11 {
                return Err(bad());
            }
            let id = u64::from_be_bytes(k[1..9].try_into().map_err(|_| bad())?);
            let i = u16::from_be_bytes([k[9], k[10]]);
            let (n, bytes) = found.entry(id).or_default();
            // Keys come in order: piece i is the next one.
            if i != *n {
                return Err(DsError::Corrupt(format!(
                    "deadlist summary of dataset {id}: piece {i} where piece {n} belongs"
                )));
            }
            *n += 1;
            bytes.extend_from_slice(&v);
        }
        start = Bound::Excluded(last);
    }
    let mut counts = HashMap::new();
    for (id, (n, bytes)) in found {
        let dead: BTreeMap<u64, Sums> = serde_json::from_slice(&bytes)
            .map_err(|e| DsError::Corrupt(format!("deadlist summary of dataset {id}: {e}")))?;
        let rec = recs.get_mut(&id).ok_or_else(|| {
            DsError::Corrupt(format!(
                "a deadlist summary of dataset {id}, which has no record"
            ))
        })?;
        if !rec.dead.is_empty() {
            return Err(DsError::Corrupt(format!(
                "dataset {id} has a deadlist summary both in its record and apart"
            )));
        }
        rec.dead = dead;
        counts.insert(id, n);
    }
    Ok(counts)
}

/// Refuses a change that would make `rec` (as changed) too large to
/// store, its deadlist summary and its receive state aside (the latter has
/// a budget of its own, [`check_recv_state_size`]): too many holds or
/// clones, property values too long, a rename to a longer name. Checked
/// before the change.
pub(crate) fn check_record_size(rec: &DsRec) -> Result<(), DsError> {
    let mut core = rec.clone();
    core.dead.clear();
    core.recv = None;
    let n = serde_json::to_vec(&core).map_or(usize::MAX, |v| v.len());
    if n > RECORD_MAX {
        return Err(DsError::Invalid(format!(
            "that would make the record of '{}' {n} bytes, more than the {RECORD_MAX} \
             a dataset record may hold (its holds, clones and property values together)",
            rec.name
        )));
    }
    Ok(())
}

/// The most bytes a receive state may take in a record: what
/// [`RECORD_MAX`] leaves of a stored record, less the field's own name.
const RECV_STATE_MAX: usize = PIECE - RECORD_MAX - 64;

/// Refuses a receive whose state (the stream's names, and the resume
/// point it will hold, a key of up to [`tarn_tree::MAX_KEY`] bytes in hex)
/// would not fit beside a record of [`RECORD_MAX`]. Checked before the
/// receive changes anything.
pub(crate) fn check_recv_state_size(
    name: &str,
    state: &crate::recv::RecvState,
) -> Result<(), DsError> {
    let mut worst = state.clone();
    worst.after = Some("0".repeat(2 * tarn_tree::MAX_KEY));
    let n = serde_json::to_vec(&worst).map_or(usize::MAX, |v| v.len());
    if n > RECV_STATE_MAX {
        return Err(DsError::Invalid(format!(
            "the stream's snapshot and source names are too long to keep in the record \
             of '{name}' while it is received ({n} bytes with the resume point, more than \
             {RECV_STATE_MAX})"
        )));
    }
    Ok(())
}

/// The most bytes the local properties of a new dataset may take in its
/// record (JSON), leaving the rest of [`RECORD_MAX`] to its other fields.
const PROPS_MAX: usize = RECORD_MAX - 1024;

/// Refuses the local properties of a new dataset `name` (created or
/// received) whose values together are too long for its record.
pub(crate) fn check_props_size(
    name: &str,
    props: &BTreeMap<String, String>,
) -> Result<(), DsError> {
    let n = serde_json::to_vec(props).map_or(usize::MAX, |v| v.len());
    if n > PROPS_MAX {
        return Err(DsError::Invalid(format!(
            "the properties of '{name}' take {n} bytes in its record, more than the \
             {PROPS_MAX} they may (property values escape quotes and backslashes)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names of the longest a stream may carry fit beside the longest
    /// resume point; names JSON must escape throughout do not, and are
    /// refused rather than stored in a record too large to write.
    #[test]
    fn receive_states_fit_their_budget_or_are_refused() {
        let state = |name: &str, source: &str| crate::recv::RecvState {
            to_guid: u64::MAX,
            to_name: name.into(),
            from_guid: Some(u64::MAX),
            raw: true,
            resumable: true,
            after: None,
            source: source.into(),
        };
        let long = "n".repeat(255);
        check_recv_state_size("tank/a", &state(&long, &long)).unwrap();
        let quotes = "\"".repeat(255);
        assert!(matches!(
            check_recv_state_size("tank/a", &state(&quotes, &quotes)),
            Err(DsError::Invalid(_))
        ));
    }
}
