//! tarn-stats: latency histograms cheap enough to keep on every I/O.
//!
//! A [`Histogram`] is a fixed array of atomic bucket counters plus a
//! running count and sum: recording one observation is a few relaxed
//! atomic additions, no lock and no allocation, so the device layer can
//! time every read and write and the servers every request. The buckets
//! are fixed at construction (Prometheus's model: cumulative counts per
//! upper bound), and [`Histogram::snapshot`] reads them for the metrics
//! endpoint. A snapshot taken while others record may be off by the
//! observations in flight (each counter is read once, not all at one
//! instant); counts never go down, which is all a scraper needs.
//!
//! This crate sits under every other crate of tarn and depends on none.

#![warn(missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Upper bounds (microseconds) for device and request latencies: 50 µs to
/// 10 s, about three per decade.
pub const LATENCY_US: &[u64] = &[
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 10_000_000,
];

/// Upper bounds (microseconds) for transaction group syncs: 1 ms to 5 min.
pub const SYNC_US: &[u64] = &[
    1_000,
    5_000,
    10_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    30_000_000,
    60_000_000,
    300_000_000,
];

/// A latency histogram with fixed buckets.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [u64],
    /// One counter per bound, and one for above the last.
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum_ns: AtomicU64,
}

/// What a histogram held when it was read.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// (upper bound in seconds, observations at or below it), cumulative,
    /// ending with `f64::INFINITY`.
    pub buckets: Vec<(f64, u64)>,
    /// Observations.
    pub count: u64,
    /// Their sum, in seconds.
    pub sum_secs: f64,
}

impl Histogram {
    /// An empty histogram with these upper bounds (microseconds,
    /// ascending), e.g. [`LATENCY_US`].
    pub fn new(bounds: &'static [u64]) -> Histogram {
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
        }
    }

    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        // Compared in nanoseconds: 50.9 µs is above the 50 µs bound.
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let i = self.bounds.partition_point(|b| b.saturating_mul(1000) < ns);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Records the time since `start`.
    pub fn since(&self, start: Instant) {
        self.observe(start.elapsed());
    }

    /// The counts so far.
    pub fn snapshot(&self) -> Snapshot {
        let mut cumulative = 0;
        let mut buckets = Vec::with_capacity(self.buckets.len());
        for (i, b) in self.buckets.iter().enumerate() {
            cumulative += b.load(Ordering::Relaxed);
            let bound = self
                .bounds
                .get(i)
                .map_or(f64::INFINITY, |us| *us as f64 / 1e6);
            buckets.push((bound, cumulative));
        }
        Snapshot {
            // The count is the last cumulative bucket, so the two agree
            // even while others record.
            count: cumulative,
            buckets,
            sum_secs: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }

    /// Forgets everything (`tarn pool clear` clears the counters).
    pub fn clear(&self) {
        for b in self.buckets.iter() {
            b.store(0, Ordering::Relaxed);
        }
        self.count.store(0, Ordering::Relaxed);
        self.sum_ns.store(0, Ordering::Relaxed);
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new(LATENCY_US)
    }
}

/// Requests of one kind (a protocol's procedure or method): how many,
/// how many failed, and how long they took.
#[derive(Debug, Default)]
pub struct RequestStats {
    /// Time from the request's arrival to its answer.
    pub latency: Histogram,
    /// Requests answered with an error.
    pub errors: AtomicU64,
}

impl RequestStats {
    /// Records a request that started at `start`.
    pub fn record(&self, start: Instant, ok: bool) {
        self.latency.since(start);
        if !ok {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn observations_land_in_their_bucket() {
        let h = Histogram::new(LATENCY_US);
        h.observe(Duration::from_micros(50)); // on a bound: that bucket
        h.observe(Duration::from_nanos(50_900));
        h.observe(Duration::from_secs(60)); // above the last bound
        let s = h.snapshot();
        assert_eq!(s.count, 3);
        assert_eq!(s.buckets[0], (50e-6, 1));
        assert_eq!(s.buckets[1], (100e-6, 2));
        assert_eq!(s.buckets[LATENCY_US.len() - 1].1, 2);
        assert_eq!(s.buckets.last(), Some(&(f64::INFINITY, 3)));
        assert!((s.sum_secs - 60.0001009).abs() < 1e-9, "{}", s.sum_secs);
        h.clear();
        assert_eq!(h.snapshot().count, 0);
    }

    proptest! {
        /// Buckets are cumulative, end at the count, and hold each
        /// observation at the first bound not below it.
        #[test]
        fn snapshots_are_cumulative(us in proptest::collection::vec(0u64..20_000_000, 0..200)) {
            let h = Histogram::new(LATENCY_US);
            for u in &us {
                h.observe(Duration::from_micros(*u));
            }
            let s = h.snapshot();
            prop_assert_eq!(s.count, us.len() as u64);
            prop_assert!(s.buckets.windows(2).all(|w| w[0].1 <= w[1].1 && w[0].0 < w[1].0));
            for (bound, n) in &s.buckets {
                let want = us.iter().filter(|u| (**u as f64) / 1e6 <= *bound).count() as u64;
                prop_assert_eq!(*n, want);
            }
        }
    }
}
