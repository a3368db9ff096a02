//! `heap::share_one_heap`: threads started after it allocate from the
//! main arena, the one in the program's break-extended heap, where without
//! it each new thread gets an arena of its own in mapped memory above it.
//! No test harness (see Cargo.toml): the harness's own threads would have
//! made arenas before the call.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn main() {
    use tarn_daemon::heap;
    if std::env::var_os(heap::ARENA_ENV).is_some() {
        // The environment chose; the function rightly leaves it alone.
        assert!(
            !heap::share_one_heap(),
            "{} is set: nothing to do",
            heap::ARENA_ENV
        );
        println!(
            "one_heap: {} set, the environment's choice kept",
            heap::ARENA_ENV
        );
        return;
    }
    assert!(heap::share_one_heap(), "mallopt refused M_ARENA_MAX");
    // Four threads at once, each holding its block while the others
    // allocate (so none can hand its memory to the next): 16 KiB is far
    // below the size malloc maps on its own.
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let block = vec![7u8; 16 << 10];
                barrier.wait();
                // SAFETY: sbrk(0) moves nothing; it returns the current
                // program break.
                let brk = unsafe { libc::sbrk(0) } as usize;
                let at = block.as_ptr() as usize;
                barrier.wait();
                (at, brk, block.iter().map(|&b| b as usize).sum::<usize>())
            })
        })
        .collect();
    for t in threads {
        let (at, brk, sum) = t.join().expect("an allocating thread panicked");
        assert_eq!(sum, 7 << 14);
        assert!(
            at < brk,
            "a new thread's block at {at:#x} lies above the program break {brk:#x}: \
             it came from an arena of its own, not the shared main arena"
        );
    }
    println!("one_heap: ok");
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn main() {
    assert!(!tarn_daemon::heap::share_one_heap());
}
