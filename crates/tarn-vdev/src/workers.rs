//! Threads kept for the device layer's parallel work: the children of a
//! merged read or of a window of writes, each on its own thread.
//!
//! # Why not `std::thread::scope`
//!
//! A scope starts a thread for every job and ends it after: a `clone`, a
//! stack mapped and unmapped (the unmapping interrupts every other core to
//! flush its TLB), and a wake-up through the scheduler. A cold 1 MiB volume
//! read on raidz1 of four is four such threads, and on a two-core machine
//! that was a third of the daemon's CPU in a streaming read (2.9 s of CPU
//! per GiB with them, 1.9 s with the same reads done on one thread). The
//! threads here are started once and wait on a condition variable for the
//! next job: no CPU and no wake-ups while nothing is asked of them.
//!
//! # Borrowing
//!
//! [`run_all`] takes jobs that borrow from its caller (a window's stripe
//! buffers, the plan of a read), as a scope's threads may. That is sound
//! because `run_all` does not return or unwind, and so the borrowed data
//! cannot be dropped, until every job handed to a worker has finished:
//! each is counted on a latch before it exists and carries a `Done` that
//! counts it down exactly once, after the job has run and dropped what it
//! borrows, or when the job is dropped unrun (a job that panics is caught
//! and yields `None`, as a scoped thread that panicked yields an error at
//! its join); and a guard that waits for the latch is dropped on return
//! and on unwinding alike. The latch and the result slots are
//! reference-counted, so a worker never touches memory of a caller that
//! has returned.
//!
//! A worker counts itself idle before it lets its job's `Done` go, so a
//! caller that runs batch after batch (a streaming reader) finds its last
//! batch's workers free, and the number of threads stays what its batches
//! need instead of creeping towards the cap.
//!
//! # No deadlock
//!
//! A job may itself call `run_all` (nothing does today, but nothing should
//! have to know). A job is only queued when a worker has been set aside
//! for it: an idle one, or a new one while there are fewer than
//! [`MAX_WORKERS`]. Beyond that the submitting thread runs the job itself.
//! So every queued job has a worker that will take some queued job, and a
//! job never waits for a queue that nobody serves.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};

/// Most threads the device layer keeps. A pool of many devices under many
/// concurrent readers uses a few dozen; past this, jobs run on the thread
/// that asked for them.
pub const MAX_WORKERS: usize = 64;

/// A job with its borrows erased (see the module docs for why that
/// holds). It gives back its [`Done`], which its worker drops once it has
/// counted itself idle again: a caller woken by the count finds the worker
/// free for its next jobs.
type Job = Box<dyn FnOnce() -> Done + Send + 'static>;

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    /// Workers waiting for a job and not yet set aside for one.
    idle: usize,
    /// Workers started.
    started: usize,
}

#[derive(Default)]
struct Workers {
    state: Mutex<State>,
    ready: Condvar,
}

fn workers() -> &'static Arc<Workers> {
    static WORKERS: OnceLock<Arc<Workers>> = OnceLock::new();
    WORKERS.get_or_init(Arc::default)
}

impl Workers {
    /// Sets a worker aside for one job: an idle one, or a new one while
    /// there are fewer than [`MAX_WORKERS`]. False when none is to be had.
    fn claim(self: &Arc<Self>) -> bool {
        {
            let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            if st.idle > 0 {
                st.idle -= 1;
                return true;
            }
            if st.started >= MAX_WORKERS {
                return false;
            }
            st.started += 1;
        }
        // Started outside the lock, which finishing workers and other
        // callers need meanwhile.
        let me = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("tarn-vdev".into())
            .spawn(move || me.work());
        if spawned.is_err() {
            self.state
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .started -= 1;
        }
        spawned.is_ok()
    }

    /// Queues a job for the worker [`Workers::claim`] set aside.
    fn push(&self, job: Job) {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .jobs
            .push_back(job);
        self.ready.notify_one();
    }

    /// A worker's life: take a job, run it, and wait for the next one.
    fn work(&self) {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            match st.jobs.pop_front() {
                Some(job) => {
                    drop(st);
                    // Jobs catch their own panics; this keeps the worker
                    // alive should one escape anyway (its `Done` has then
                    // been dropped while unwinding).
                    let done = catch_unwind(AssertUnwindSafe(job));
                    st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                    st.idle += 1;
                    drop(st);
                    drop(done);
                    st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                }
                None => {
                    st = self.ready.wait(st).unwrap_or_else(PoisonError::into_inner);
                }
            }
        }
    }
}

/// Counts jobs still running; [`run_all`] waits for zero.
struct Latch {
    left: Mutex<usize>,
    zero: Condvar,
}

impl Latch {
    fn add(&self) {
        *self.left.lock().unwrap_or_else(PoisonError::into_inner) += 1;
    }

    fn done(&self) {
        let mut left = self.left.lock().unwrap_or_else(PoisonError::into_inner);
        *left -= 1;
        if *left == 0 {
            self.zero.notify_all();
        }
    }

    fn wait(&self) {
        let mut left = self.left.lock().unwrap_or_else(PoisonError::into_inner);
        while *left > 0 {
            left = self.zero.wait(left).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Counts its latch down when dropped: when its job has run, or when the
/// job is dropped unrun, or unwinds.
struct Done(Arc<Latch>);

impl Drop for Done {
    fn drop(&mut self) {
        self.0.done();
    }
}

/// Waits for a latch when dropped, on return and on unwinding alike.
struct WaitFor(Arc<Latch>);

impl Drop for WaitFor {
    fn drop(&mut self) {
        self.0.wait();
    }
}

/// Runs `there` on a kept thread while `here` runs on the calling thread
/// (which need not be `Send`: a sync writes one window here while the
/// next is prepared there); `None` for `there` if it panicked. A panic of
/// `here` is carried on once `there` has finished.
pub fn run_beside<'a, A, B: Send + 'a>(
    here: impl FnOnce() -> A,
    there: impl FnOnce() -> B + Send + 'a,
) -> (A, Option<B>) {
    // The first job of `run_all` runs on this thread: a placeholder, so
    // that `there` is the one handed to a worker.
    let jobs: Vec<Box<dyn FnOnce() -> Option<B> + Send + 'a>> =
        vec![Box::new(|| None), Box::new(move || Some(there()))];
    let mut here_out = None;
    let got = run_all_with(jobs, || here_out = Some(here()));
    let b = got.into_iter().nth(1).flatten().flatten();
    match here_out {
        Some(a) => (a, b),
        // `run_all_with` runs `meanwhile` or carries on its panic.
        None => unreachable_here(),
    }
}

#[cold]
fn unreachable_here() -> ! {
    panic!("run_all_with returned without running its own work")
}

/// Runs `jobs` at once, the first on the calling thread and the others on
/// kept threads, and returns their results in order; a job that panicked
/// gives `None`. Jobs may borrow from the caller (see the module docs).
pub fn run_all<'a, T: Send + 'a>(jobs: Vec<Box<dyn FnOnce() -> T + Send + 'a>>) -> Vec<Option<T>> {
    run_all_with(jobs, || {})
}

/// [`run_all`], running `meanwhile` on the calling thread after its own
/// jobs and before waiting for the others; a panic of `meanwhile` unwinds
/// once every job handed to a worker has finished.
fn run_all_with<'a, T: Send + 'a>(
    jobs: Vec<Box<dyn FnOnce() -> T + Send + 'a>>,
    meanwhile: impl FnOnce(),
) -> Vec<Option<T>> {
    let n = jobs.len();
    let slots: Arc<Vec<Mutex<Option<T>>>> = Arc::new((0..n).map(|_| Mutex::new(None)).collect());
    // Counts the jobs handed to workers; from here on, this function does
    // not return or unwind before they have all finished.
    let latch = Arc::new(Latch {
        left: Mutex::new(0),
        zero: Condvar::new(),
    });
    let waiting = WaitFor(Arc::clone(&latch));
    let pool = workers();
    let mut mine: Vec<Box<dyn FnOnce() + 'a>> = Vec::new();
    let mut handed: Vec<Job> = Vec::new();
    for (i, job) in jobs.into_iter().enumerate() {
        let slots = Arc::clone(&slots);
        let run = move || {
            if let Ok(v) = catch_unwind(AssertUnwindSafe(job)) {
                *slots[i].lock().unwrap_or_else(PoisonError::into_inner) = Some(v);
            }
        };
        if i == 0 {
            mine.push(Box::new(run));
            continue;
        }
        // Counted before it exists: from here on it counts down exactly
        // once, run or dropped.
        latch.add();
        let done = Done(Arc::clone(&latch));
        let wrapped: Box<dyn FnOnce() -> Done + Send + 'a> = Box::new(move || {
            run();
            // The job and what it borrowed are gone; `done` goes last.
            done
        });
        // SAFETY: the box's type only forgets the lifetime `'a` of what the
        // job borrows; its layout is the same. The job counts the latch
        // down (its `Done` dropped) only after it has run and dropped what
        // it borrows, or when it is dropped unrun; and `waiting` (dropped on
        // return and on unwinding) waits for the latch. So nothing the job
        // borrows is dropped while it can still use it, wherever it runs.
        let erased: Job = unsafe {
            std::mem::transmute::<
                Box<dyn FnOnce() -> Done + Send + 'a>,
                Box<dyn FnOnce() -> Done + Send + 'static>,
            >(wrapped)
        };
        handed.push(erased);
    }
    // Claimed and queued with nothing between that can unwind; those no
    // worker can take run here.
    let mut here = Vec::new();
    for job in handed {
        if pool.claim() {
            pool.push(job);
        } else {
            here.push(job);
        }
    }
    for job in mine {
        job();
    }
    for job in here {
        drop(job());
    }
    meanwhile();
    drop(waiting);
    // Every job has finished, so the slots are ours alone.
    match Arc::try_unwrap(slots) {
        Ok(slots) => slots
            .into_iter()
            .map(|m| m.into_inner().unwrap_or_else(PoisonError::into_inner))
            .collect(),
        Err(shared) => shared
            .iter()
            .map(|m| m.lock().unwrap_or_else(PoisonError::into_inner).take())
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn jobs_borrow_from_the_caller_and_come_back_in_order() {
        let data: Vec<u64> = (0..1000).collect();
        for n in [0usize, 1, 2, 7, 130] {
            let jobs: Vec<Box<dyn FnOnce() -> u64 + Send + '_>> = (0..n)
                .map(|i| {
                    let part = &data[i % 10 * 100..(i % 10 + 1) * 100];
                    Box::new(move || part.iter().sum::<u64>() + i as u64) as Box<_>
                })
                .collect();
            let got = run_all(jobs);
            let want: Vec<Option<u64>> = (0..n)
                .map(|i| {
                    Some(data[i % 10 * 100..(i % 10 + 1) * 100].iter().sum::<u64>() + i as u64)
                })
                .collect();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn a_panicking_job_gives_none_and_the_others_finish() {
        let ran = AtomicUsize::new(0);
        let jobs: Vec<Box<dyn FnOnce() -> usize + Send + '_>> = (0..6usize)
            .map(|i| {
                let ran = &ran;
                Box::new(move || {
                    if i % 3 == 1 {
                        panic!("job {i} fails");
                    }
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    ran.fetch_add(1, Ordering::SeqCst);
                    i
                }) as Box<_>
            })
            .collect();
        let got = run_all(jobs);
        assert_eq!(got, vec![Some(0), None, Some(2), Some(3), None, Some(5)]);
        assert_eq!(
            ran.load(Ordering::SeqCst),
            4,
            "every other job ran to its end"
        );
    }

    #[test]
    fn beside_runs_both_and_waits_for_the_other_even_when_here_panics() {
        let mut here_ran = false;
        let (a, b) = run_beside(
            || {
                here_ran = true;
                1
            },
            || 2,
        );
        assert_eq!((a, b, here_ran), (1, Some(2), true));
        let (_, b) = run_beside(|| (), || -> u8 { panic!("there fails") });
        assert_eq!(b, None);
        let there_done = AtomicUsize::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            run_beside(
                || -> () { panic!("here fails") },
                || {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    there_done.store(1, Ordering::SeqCst);
                },
            )
        }));
        assert!(r.is_err(), "here's panic carried on");
        assert_eq!(there_done.load(Ordering::SeqCst), 1, "after there finished");
    }

    #[test]
    fn nested_and_many_callers_at_once_make_progress() {
        // More concurrent work than workers, each job starting more jobs:
        // without the run-it-yourself rule this would wait forever.
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let outer: Vec<Box<dyn FnOnce() -> usize + Send + '_>> = (0..2 * MAX_WORKERS)
                        .map(|_| {
                            let total = &total;
                            Box::new(move || {
                                let inner: Vec<Box<dyn FnOnce() -> usize + Send + '_>> = (0..4)
                                    .map(|_| {
                                        Box::new(move || {
                                            total.fetch_add(1, Ordering::SeqCst);
                                            1usize
                                        }) as Box<_>
                                    })
                                    .collect();
                                run_all(inner).into_iter().flatten().sum()
                            }) as Box<_>
                        })
                        .collect();
                    let got: usize = run_all(outer).into_iter().flatten().sum();
                    assert_eq!(got, 2 * MAX_WORKERS * 4);
                });
            }
        });
        assert_eq!(total.load(Ordering::SeqCst), 8 * 2 * MAX_WORKERS * 4);
        let st = workers().state.lock().unwrap();
        assert!(st.started <= MAX_WORKERS);
    }
}
