//! The device layer's kept threads, seen from outside in a process of
//! their own: a caller that runs batch after batch (a streaming reader)
//! finds the workers of its last batch free again, so the threads do not
//! creep up towards the cap.

use tarn_vdev::workers::run_all;

/// Threads of this process named as the device layer names its workers.
fn kept_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(|t| t.ok())
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim_end() == "tarn-vdev")
                })
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn batch_after_batch_reuses_the_same_threads() {
    let data: Vec<u64> = (0..4096).collect();
    for round in 0..3000u64 {
        let jobs: Vec<Box<dyn FnOnce() -> u64 + Send + '_>> = (0..3)
            .map(|j| {
                let part = &data[j * 1024..(j + 1) * 1024];
                Box::new(move || part.iter().sum::<u64>() + round) as Box<_>
            })
            .collect();
        let got: u64 = run_all(jobs).into_iter().flatten().sum();
        assert_eq!(got, data[..3072].iter().sum::<u64>() + 3 * round);
    }
    // The first job of each batch runs on the caller: two workers serve
    // every batch.
    let n = kept_threads();
    assert!(n >= 1, "the workers are named and counted");
    assert!(n <= 2, "{n} worker threads for batches of three jobs");
}
