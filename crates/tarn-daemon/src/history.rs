//! The daemon's bounded history of what it did: throughput, IOPS and
//! latency per pool and per protocol, and the cache hit rate, for the
//! dashboard's charts (`stats.history`).
//!
//! A thread samples the cumulative counters every [`FINE`] (10 s) and
//! keeps the last hour of samples; every [`COARSE`] (5 min) a sample also
//! goes into a second ring that keeps a day. A point of the history is
//! the difference between two consecutive samples over their distance,
//! so nothing is averaged twice and a gap (the daemon was busy, a pool
//! was imported) is one longer interval, not a lie. Counters that went
//! down (`tarn pool clear`, a pool exported and imported) make no point
//! for that pool in that interval. Memory is bounded: 360 + 288
//! samples, each a few numbers per pool and protocol.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tarn_api::params::{HistoryPoint, PoolRates, ProtocolRates};

use crate::pools::Pools;

/// Time between fine samples (`TARN_HISTORY_TICK_MS` for tests).
pub const FINE: Duration = Duration::from_secs(10);
/// Time between coarse samples.
pub const COARSE: Duration = Duration::from_secs(300);
/// Fine samples kept: an hour.
const FINE_KEEP: usize = 361;
/// Coarse samples kept: a day.
const COARSE_KEEP: usize = 289;

/// Cumulative counters of one pool at one instant.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolCounters {
    /// Device reads, writes, bytes.
    pub read_ops: u64,
    /// Device writes.
    pub write_ops: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Reads timed, and their total time in seconds.
    pub read_timed: (u64, f64),
    /// Writes timed, and their total time.
    pub write_timed: (u64, f64),
}

/// Cumulative counters of one protocol.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProtoCounters {
    /// Requests answered.
    pub requests: u64,
    /// Their total time in seconds.
    pub secs: f64,
    /// Requests answered with an error.
    pub errors: u64,
}

/// Everything at one instant.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    /// Unix seconds (with a fraction).
    pub t: f64,
    /// Per pool.
    pub pools: BTreeMap<String, PoolCounters>,
    /// Per protocol.
    pub protocols: BTreeMap<String, ProtoCounters>,
    /// Cache hits and misses.
    pub cache: (u64, u64),
}

fn mean_ms(now: (u64, f64), then: (u64, f64)) -> Option<f64> {
    let n = now.0.checked_sub(then.0)?;
    (n > 0).then(|| (now.1 - then.1).max(0.0) / n as f64 * 1e3)
}

/// The point between two samples (None if they are not in order).
pub fn point(a: &Sample, b: &Sample) -> Option<HistoryPoint> {
    let secs = b.t - a.t;
    if secs <= 0.0 {
        return None;
    }
    let per_sec = |now: u64, then: u64| now.checked_sub(then).map(|d| d as f64 / secs);
    let pools = b
        .pools
        .iter()
        .filter_map(|(name, now)| {
            let then = a.pools.get(name)?;
            Some(PoolRates {
                pool: name.clone(),
                read_iops: per_sec(now.read_ops, then.read_ops)?,
                write_iops: per_sec(now.write_ops, then.write_ops)?,
                read_bytes_per_sec: per_sec(now.read_bytes, then.read_bytes)?,
                write_bytes_per_sec: per_sec(now.write_bytes, then.write_bytes)?,
                read_latency_ms: mean_ms(now.read_timed, then.read_timed),
                write_latency_ms: mean_ms(now.write_timed, then.write_timed),
            })
        })
        .collect();
    let protocols = b
        .protocols
        .iter()
        .filter_map(|(name, now)| {
            let then = a.protocols.get(name)?;
            Some(ProtocolRates {
                protocol: name.clone(),
                requests_per_sec: per_sec(now.requests, then.requests)?,
                latency_ms: mean_ms((now.requests, now.secs), (then.requests, then.secs)),
                errors: now.errors.checked_sub(then.errors)?,
            })
        })
        .collect();
    let hits = b.cache.0.checked_sub(a.cache.0);
    let misses = b.cache.1.checked_sub(a.cache.1);
    let cache_hit_ratio = match (hits, misses) {
        (Some(h), Some(m)) if h + m > 0 => Some(h as f64 / (h + m) as f64),
        _ => None,
    };
    Some(HistoryPoint {
        t: b.t as u64,
        secs,
        pools,
        protocols,
        cache_hit_ratio,
    })
}

/// The two rings.
#[derive(Debug, Default)]
pub struct Rings {
    fine: VecDeque<Sample>,
    coarse: VecDeque<Sample>,
}

impl Rings {
    /// Adds a sample; it also goes to the day ring when the last one
    /// there is [`COARSE`] old (or `coarse_every` in tests).
    pub fn push(&mut self, s: Sample, coarse_every: f64) {
        if self
            .coarse
            .back()
            // A clock set back: sample again from the new time, rather
            // than wait for the clock to pass the old one.
            .is_none_or(|last| s.t - last.t >= coarse_every || s.t < last.t)
        {
            self.coarse.push_back(s.clone());
            if self.coarse.len() > COARSE_KEEP {
                self.coarse.pop_front();
            }
        }
        self.fine.push_back(s);
        if self.fine.len() > FINE_KEEP {
            self.fine.pop_front();
        }
    }

    /// The points of the last hour (or day).
    pub fn points(&self, day: bool) -> Vec<HistoryPoint> {
        let ring = if day { &self.coarse } else { &self.fine };
        ring.iter()
            .zip(ring.iter().skip(1))
            .filter_map(|(a, b)| point(a, b))
            .collect()
    }
}

/// Reads every counter now.
fn sample(pools: &Pools) -> Sample {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let mut s = Sample {
        t,
        ..Sample::default()
    };
    for p in pools.all_pools() {
        let Some(total) = p.iostat().into_iter().find(|e| e.depth == 0) else {
            continue;
        };
        let c = &total.counters;
        let (devices, _) = p.latencies();
        let sum = |pick: fn(
            &(String, tarn_stats::Snapshot, tarn_stats::Snapshot),
        ) -> &tarn_stats::Snapshot| {
            devices.iter().map(pick).fold((0u64, 0f64), |(n, secs), x| {
                (n + x.count, secs + x.sum_secs)
            })
        };
        s.pools.insert(
            p.name().to_string(),
            PoolCounters {
                read_ops: c.read_ops,
                write_ops: c.write_ops,
                read_bytes: c.read_bytes,
                write_bytes: c.write_bytes,
                read_timed: sum(|d| &d.1),
                write_timed: sum(|d| &d.2),
            },
        );
    }
    for (proto, _op, snap, errors) in pools.servers.request_stats() {
        let e = s.protocols.entry(proto.to_string()).or_default();
        e.requests += snap.count;
        e.secs += snap.sum_secs;
        e.errors += errors;
    }
    // One block cache serves every pool: its counters through any pool.
    if let Some(p) = pools.all_pools().first() {
        let c = p.cache_stats();
        s.cache = (c.data_hits + c.meta_hits, c.data_misses + c.meta_misses);
    }
    s
}

/// The sampling thread and the rings it fills.
pub struct History {
    rings: Arc<Mutex<Rings>>,
    thread: crate::periodic::Periodic,
}

impl History {
    /// Starts sampling `pools` every [`FINE`] (`TARN_HISTORY_TICK_MS`).
    pub fn start(pools: Weak<Pools>) -> std::io::Result<History> {
        let tick = crate::periodic::tick_from_env("TARN_HISTORY_TICK_MS", FINE);
        // The day ring keeps one sample in 30 of the hour ring's.
        let coarse_every = (tick * 30).as_secs_f64();
        let rings = Arc::new(Mutex::new(Rings::default()));
        let r = rings.clone();
        let thread = crate::periodic::Periodic::start("tarn-history", tick, pools, move |p| {
            let s = sample(p);
            r.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(s, coarse_every);
        })?;
        Ok(History { rings, thread })
    }

    /// The points of the last hour (or day).
    pub fn points(&self, day: bool) -> Vec<HistoryPoint> {
        self.rings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .points(day)
    }

    /// Stops sampling.
    pub fn stop(&self) {
        self.thread.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t: f64, ops: u64, timed: (u64, f64), reqs: u64, cache: (u64, u64)) -> Sample {
        let mut s = Sample {
            t,
            cache,
            ..Sample::default()
        };
        s.pools.insert(
            "tank".into(),
            PoolCounters {
                read_ops: ops,
                write_ops: 2 * ops,
                read_bytes: ops * 4096,
                write_bytes: 0,
                read_timed: timed,
                write_timed: (0, 0.0),
            },
        );
        s.protocols.insert(
            "nfs".into(),
            ProtoCounters {
                requests: reqs,
                secs: reqs as f64 * 0.002,
                errors: 0,
            },
        );
        s
    }

    #[test]
    fn points_are_rates_between_samples() {
        let a = at(100.0, 1000, (1000, 1.0), 50, (90, 10));
        let b = at(110.0, 3000, (3000, 3.0), 150, (180, 30));
        let p = point(&a, &b).unwrap();
        assert_eq!((p.t, p.secs), (110, 10.0));
        let pool = &p.pools[0];
        assert_eq!(pool.read_iops, 200.0);
        assert_eq!(pool.write_iops, 400.0);
        assert_eq!(pool.read_bytes_per_sec, 200.0 * 4096.0);
        assert_eq!(pool.read_latency_ms, Some(1.0));
        assert_eq!(pool.write_latency_ms, None, "no writes timed");
        assert_eq!(p.protocols[0].requests_per_sec, 10.0);
        assert!((p.protocols[0].latency_ms.unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(p.cache_hit_ratio, Some(90.0 / 110.0));
        // Counters that went down (a clear) give no point for the pool.
        let cleared = at(120.0, 5, (5, 0.01), 160, (200, 30));
        let p = point(&b, &cleared).unwrap();
        assert!(p.pools.is_empty());
        assert_eq!(p.protocols.len(), 1);
        assert!(point(&b, &a).is_none(), "out of order");
    }

    #[test]
    fn the_rings_are_bounded_and_the_day_ring_is_sparser() {
        let mut r = Rings::default();
        for i in 0..1000u64 {
            r.push(at(i as f64 * 10.0, i, (i, 0.0), i, (i, 0)), 300.0);
        }
        let hour = r.points(false);
        assert_eq!(hour.len(), FINE_KEEP - 1);
        assert!(hour.iter().all(|p| p.secs == 10.0));
        let day = r.points(true);
        assert!(
            day.len() < 40 && day.iter().all(|p| p.secs == 300.0),
            "{}",
            day.len()
        );
        // The clock set back a year: the day ring goes on from the new
        // time (the point across the jump is dropped as out of order).
        let back = 1000.0 * 10.0 - 365.0 * 86_400.0;
        for i in 0..100u64 {
            let t = back + i as f64 * 10.0;
            r.push(at(t, i, (i, 0.0), i, (i, 0)), 300.0);
        }
        let day = r.points(true);
        assert!(
            day.iter().filter(|p| p.secs == 300.0).count() >= day.len() - 1 && day.len() >= 3,
            "{day:?}"
        );
        assert_eq!(r.coarse.back().map(|s| s.t), Some(back + 900.0));
    }
}
