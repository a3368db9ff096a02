//! The union of an overlay's deleted key ranges, so that "does a deleted
//! range cover this key?" costs a map lookup, not a walk over every range.
//!
//! # Theory
//!
//! Every unlink of a file deletes the range of its data keys, so one txg
//! of `rm -rf` over 100,000 files holds 100,000 ranges, and every lookup
//! and every merged listing entry asks whether one of them covers a key.
//! Asked of a list, that made deleting many files quadratic.
//!
//! The cover keeps the union of the ranges as disjoint half-open spans
//! `[lo, hi)` keyed by `lo`, `hi` absent for "no end". A key is covered
//! when the span with the greatest `lo` not above it reaches past it. The
//! ranges arrive with any mix of bounds; in byte-string order the smallest
//! key above `k` is `k` followed by a zero byte, so `> k` is `>= k·00` and
//! `<= k` is `< k·00`, and every range becomes one half-open span.
//!
//! Spans that overlap or touch are merged when a range is added, so the
//! map never holds two spans that one key could fall into. Each addition
//! returns what it changed (the span it inserted, the spans it absorbed);
//! a failed transaction takes its ranges back newest first, so putting the
//! absorbed spans back restores the cover exactly.

use std::collections::BTreeMap;
use std::ops::Bound;

/// Disjoint spans `[lo, hi)` of deleted keys; `None` is "no end".
#[derive(Debug, Default)]
pub(crate) struct Cover {
    spans: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

/// What one [`Cover::add`] changed, to take back with [`Cover::undo`].
#[derive(Debug, Default)]
pub(crate) struct Added {
    /// Start of the span it inserted (none for an empty range).
    span: Option<Vec<u8>>,
    /// Spans it merged into that one.
    absorbed: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

fn successor(k: &[u8]) -> Vec<u8> {
    let mut s = Vec::with_capacity(k.len() + 1);
    s.extend_from_slice(k);
    s.push(0);
    s
}

/// `a < b` where `None` is "no end".
fn below(a: &[u8], b: Option<&[u8]>) -> bool {
    b.is_none_or(|b| a < b)
}

fn later_end(a: Option<Vec<u8>>, b: &Option<Vec<u8>>) -> Option<Vec<u8>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if a >= *b { a } else { b.clone() }),
        _ => None,
    }
}

impl Cover {
    /// Adds the keys inside `start..end`.
    pub(crate) fn add(&mut self, start: &Bound<Vec<u8>>, end: &Bound<Vec<u8>>) -> Added {
        let mut added = Added::default();
        let mut lo = match start {
            Bound::Included(k) => k.clone(),
            Bound::Excluded(k) => successor(k),
            Bound::Unbounded => Vec::new(),
        };
        let mut hi = match end {
            Bound::Included(k) => Some(successor(k)),
            Bound::Excluded(k) => Some(k.clone()),
            Bound::Unbounded => None,
        };
        if !below(&lo, hi.as_deref()) {
            return added;
        }
        // A span starting at or before `lo` that reaches it absorbs the new one.
        let before = self
            .spans
            .range::<[u8], _>((Bound::Unbounded, Bound::Included(lo.as_slice())))
            .next_back()
            .filter(|(_, phi)| phi.as_deref().is_none_or(|p| p >= lo.as_slice()))
            .map(|(plo, _)| plo.clone());
        if let Some(plo) = before {
            if let Some(phi) = self.spans.remove(&plo) {
                hi = later_end(hi, &phi);
                added.absorbed.push((plo.clone(), phi));
            }
            lo = plo;
        }
        // Spans starting inside the new one (or where it ends) join it.
        loop {
            let next = self
                .spans
                .range::<[u8], _>((Bound::Included(lo.as_slice()), Bound::Unbounded))
                .next()
                .filter(|(slo, _)| hi.as_deref().is_none_or(|h| slo.as_slice() <= h))
                .map(|(slo, _)| slo.clone());
            let Some(slo) = next else { break };
            if let Some(shi) = self.spans.remove(&slo) {
                hi = later_end(hi, &shi);
                added.absorbed.push((slo, shi));
            }
        }
        added.span = Some(lo.clone());
        self.spans.insert(lo, hi);
        added
    }

    /// Takes back the last addition not yet taken back.
    pub(crate) fn undo(&mut self, added: Added) {
        if let Some(lo) = added.span {
            self.spans.remove(&lo);
        }
        self.spans.extend(added.absorbed);
    }

    /// True when an added range covers `key`.
    pub(crate) fn covers(&self, key: &[u8]) -> bool {
        self.spans
            .range::<[u8], _>((Bound::Unbounded, Bound::Included(key)))
            .next_back()
            .is_some_and(|(_, hi)| below(key, hi.as_deref()))
    }

    /// Spans kept: never more than the ranges added.
    #[cfg(test)]
    pub(crate) fn spans(&self) -> usize {
        self.spans.len()
    }
}

#[cfg(test)]
mod tests {
    use super::super::in_range;
    use super::*;
    use proptest::prelude::*;

    fn bound(kind: u8, k: Vec<u8>) -> Bound<Vec<u8>> {
        match kind % 3 {
            0 => Bound::Included(k),
            1 => Bound::Excluded(k),
            _ => Bound::Unbounded,
        }
    }

    /// Short keys over a tiny alphabet, so that ranges overlap, touch,
    /// nest and differ only by a trailing zero byte.
    fn key() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(0u8..3, 0..4)
    }

    proptest! {
        /// The cover answers exactly as asking every range would, for any
        /// mix of bounds, and keeps its spans disjoint.
        #[test]
        fn covers_what_the_ranges_cover(
            ranges in prop::collection::vec((0u8..3, key(), 0u8..3, key()), 0..12),
            probes in prop::collection::vec(key(), 0..40),
        ) {
            let ranges: Vec<_> = ranges
                .into_iter()
                .map(|(a, lo, b, hi)| {
                    // Unbounded rarely, so most cases keep finite spans.
                    let a = if a == 2 && lo.len() % 2 == 0 { 0 } else { a };
                    let b = if b == 2 && hi.len() % 2 == 0 { 1 } else { b };
                    (bound(a, lo), bound(b, hi))
                })
                .collect();
            let mut c = Cover::default();
            for r in &ranges {
                c.add(&r.0, &r.1);
            }
            prop_assert!(c.spans() <= ranges.len());
            let mut all: Vec<Vec<u8>> = probes;
            for r in &ranges {
                for b in [&r.0, &r.1] {
                    if let Bound::Included(k) | Bound::Excluded(k) = b {
                        all.push(k.clone());
                        all.push(successor(k));
                    }
                }
            }
            for k in &all {
                let want = ranges.iter().any(|r| in_range(r, k));
                prop_assert_eq!(c.covers(k), want, "key {:?} ranges {:?} spans {:?}", k, ranges, c.spans);
            }
            // Disjoint and not touching: each span ends before the next starts.
            let spans: Vec<_> = c.spans.iter().collect();
            for w in spans.windows(2) {
                let end = w[0].1.as_deref();
                prop_assert!(end.is_some_and(|e| e < w[1].0.as_slice()), "spans {:?}", c.spans);
            }
        }
    }

    proptest! {
        /// Taking additions back newest first restores the cover exactly:
        /// the same spans as adding only the ranges kept.
        #[test]
        fn undo_restores_the_spans(
            ranges in prop::collection::vec((0u8..2, key(), 0u8..2, key()), 0..12),
            keep in 0usize..12,
        ) {
            let ranges: Vec<_> = ranges
                .into_iter()
                .map(|(a, lo, b, hi)| (bound(a, lo), bound(b, hi)))
                .collect();
            let keep = keep.min(ranges.len());
            let mut c = Cover::default();
            let mut undo = Vec::new();
            for r in &ranges {
                undo.push(c.add(&r.0, &r.1));
            }
            for a in undo.drain(keep..).rev() {
                c.undo(a);
            }
            let mut fresh = Cover::default();
            for r in &ranges[..keep] {
                fresh.add(&r.0, &r.1);
            }
            prop_assert_eq!(&c.spans, &fresh.spans);
        }
    }

    #[test]
    fn one_range_per_file_stays_one_span_each() {
        let mut c = Cover::default();
        for ino in 0u32..1000 {
            let lo = [ino.to_be_bytes().as_slice(), &[1]].concat();
            let hi = [ino.to_be_bytes().as_slice(), &[2]].concat();
            c.add(&Bound::Included(lo), &Bound::Excluded(hi));
        }
        assert_eq!(c.spans(), 1000);
        assert!(c.covers(&[0, 0, 1, 0, 1, 7]));
        assert!(!c.covers(&[0, 0, 1, 0, 2]));
        assert!(!c.covers(&[0, 0, 1, 0]));
    }
}
