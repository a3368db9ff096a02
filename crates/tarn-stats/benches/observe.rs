//! What timing one I/O costs: `Instant::now()` twice and one
//! `Histogram::observe`, from one thread and from two at once (the
//! atomics contended). Prints nanoseconds per observation; not a test.

use std::sync::Arc;
use std::time::Instant;

use tarn_stats::{Histogram, LATENCY_US};

fn per_op(threads: usize, n: u64) -> f64 {
    let h = Arc::new(Histogram::new(LATENCY_US));
    let t0 = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let h = h.clone();
            std::thread::spawn(move || {
                for _ in 0..n {
                    let start = Instant::now();
                    h.since(start);
                }
            })
        })
        .collect();
    for t in handles {
        let _ = t.join();
    }
    let ns = t0.elapsed().as_nanos() as f64 / (n as f64);
    assert_eq!(h.snapshot().count, n * threads as u64);
    ns
}

fn main() {
    let n = 5_000_000;
    println!("timed observation, 1 thread:  {:.1} ns", per_op(1, n));
    println!(
        "timed observation, 2 threads: {:.1} ns (each)",
        per_op(2, n)
    );
}
