//! The CPU expert executor's threads: a persistent pool whose workers wait for the next job
//! by spinning for a while before they sleep.
//!
//! A hybrid decode step hands the executor one small job per offloaded layer (a few experts,
//! about a millisecond of reads on a 16-core host), separated by the GPU's routing round
//! trip. A pool whose workers sleep as soon as they are idle (rayon's) wakes them again for
//! every job, one futex at a time: on the development machine that cost 0.3 ms a job with
//! two threads (`examples/cpu_experts` with `SPARSA_CE_GAP_US`), a quarter of the job. Here
//! the workers spin on the job counter for [`Pool::new`]'s `spin` after their last job, so a
//! decode step's jobs find them awake, and sleep after that (an idle process burns nothing).
//! On CPU adapters, whose own threads run the "GPU", the pool is made with no spin.
//!
//! [`Pool::run`] spreads the tasks `0..n` over the workers and the calling thread, which
//! takes tasks too, and returns once every task is done; tasks go by an atomic counter, so
//! a worker that is late (descheduled) takes fewer. [`Pool::spawn`] runs a job on the pool's
//! leader thread without waiting for it: a hybrid round's CPU part, which the host does not
//! wait for while it records what follows. A panicking task does not hang the pool: the
//! run finishes its other tasks and then panics in the caller with the task's message.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Something a thread of the pool waits for: a counter that moves on (a new job, a new
/// spawned job, or the pool's end), watched by spinning for `spin`, then asleep.
struct Signal {
    epoch: AtomicU64,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

impl Signal {
    fn new() -> Signal {
        Signal {
            epoch: AtomicU64::new(0),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        }
    }

    /// Moves the counter on and wakes the sleepers.
    fn raise(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        // A waiter counts itself a sleeper (SeqCst) before its last look at the counter, so
        // either it sees the new value or this sees it and wakes it under the lock.
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _held = lock(&self.lock);
            self.wake.notify_all();
        }
    }

    /// Waits until the counter differs from `seen` and returns its value: spinning for
    /// `spin`, then asleep.
    fn wait(&self, seen: u64, spin: Duration) -> u64 {
        if !spin.is_zero() {
            let t0 = Instant::now();
            let mut i = 0u32;
            loop {
                let e = self.epoch.load(Ordering::Acquire);
                if e != seen {
                    return e;
                }
                i = i.wrapping_add(1);
                if i.is_multiple_of(256) && t0.elapsed() >= spin {
                    break;
                }
                std::hint::spin_loop();
            }
        }
        let mut held = lock(&self.lock);
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        loop {
            let e = self.epoch.load(Ordering::SeqCst);
            if e != seen {
                self.sleepers.fetch_sub(1, Ordering::SeqCst);
                return e;
            }
            held = self.wake.wait(held).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// A lock whose holder cannot leave its data half-changed (the pool's locks guard plain
/// handoffs), taken even if a holder panicked.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One [`Pool::run`]: tasks `0..n` of `f`, claimed one at a time.
struct Job {
    n: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    /// The first panic's message.
    panic: Mutex<Option<String>>,
    /// Valid while `done < n`: the caller of [`Pool::run`] holds it until then, and a task
    /// is only called after it was claimed (`next`), so before `done` reaches `n`.
    f: *const (dyn Fn(usize) + Sync),
}

// SAFETY: `f` is only called while the run that owns it waits (see the field), and the
// closure it points to is Sync.
unsafe impl Send for Job {}
unsafe impl Sync for Job {}

impl Job {
    /// Tasks `0..n` of `f`, none claimed yet.
    fn new(n: usize, f: *const (dyn Fn(usize) + Sync)) -> Job {
        Job {
            n,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            panic: Mutex::new(None),
            f,
        }
    }

    /// A job with no tasks (a pool's spare).
    fn idle() -> Job {
        fn nothing(_: usize) {}
        Job::new(0, &nothing as &(dyn Fn(usize) + Sync))
    }

    /// Claims and runs tasks until none is left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::AcqRel);
            if i >= self.n {
                return;
            }
            // SAFETY: task i was claimed below n, so the run still waits (see `f`).
            let f = unsafe { &*self.f };
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(i))) {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a task panicked".into());
                lock(&self.panic).get_or_insert(msg);
            }
            self.done.fetch_add(1, Ordering::Release);
        }
    }
}

type Spawned = Box<dyn FnOnce() + Send>;

struct Shared {
    /// Raised for each new run (and at the end).
    jobs: Signal,
    job: Mutex<Option<Arc<Job>>>,
    /// Raised for each spawned job (and at the end).
    spawns: Signal,
    spawned: Mutex<VecDeque<Spawned>>,
    stop: AtomicBool,
    spin: Duration,
}

/// The executor's threads (see the module).
pub struct Pool {
    shared: Arc<Shared>,
    /// One run at a time (the leader's and a direct caller's take turns); it holds one job
    /// per thread, made with the pool, which runs reuse: a worker holds at most one job at a
    /// time (the one it works on), so of the workers' count + 1 jobs one is always free, and
    /// a run allocates nothing.
    running: Mutex<Vec<Arc<Job>>>,
    threads: usize,
    handles: Vec<JoinHandle<()>>,
}

impl Pool {
    /// A pool whose runs take `threads` threads, the caller's among them (`threads − 1`
    /// workers), plus a leader thread for [`Pool::spawn`]; idle threads spin for `spin`
    /// before they sleep. `threads` must be at least 1.
    pub fn new(threads: usize, spin: Duration) -> std::io::Result<Pool> {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            jobs: Signal::new(),
            job: Mutex::new(None),
            spawns: Signal::new(),
            spawned: Mutex::new(VecDeque::new()),
            stop: AtomicBool::new(false),
            spin,
        });
        // Thread 0 is the leader, the others are the workers.
        let mut handles = Vec::with_capacity(threads);
        for i in 0..threads {
            let s = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("sparsa-experts-{i}"))
                .spawn(move || if i == 0 { leader(&s) } else { worker(&s) });
            match h {
                Ok(h) => handles.push(h),
                Err(e) => {
                    stop(&shared, handles);
                    return Err(e);
                }
            }
        }
        Ok(Pool {
            shared,
            running: Mutex::new((0..threads).map(|_| Arc::new(Job::idle())).collect()),
            threads,
            handles,
        })
    }

    /// The threads a run takes (the caller's among them).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f(i)` for every `i` in `0..n` on the workers and the calling thread; returns
    /// when all are done. A task must not call `run` on the same pool (it would wait for
    /// itself). Panics (after the other tasks finished) if a task panicked.
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        if n == 0 {
            return;
        }
        let mut jobs = lock(&self.running);
        // SAFETY: only the lifetime is erased; `job.f` is not called after this run
        // returns (see `Job::f`), and the run waits below until every task is done.
        let f: *const (dyn Fn(usize) + Sync + '_) = f;
        let f: *const (dyn Fn(usize) + Sync + 'static) = unsafe { std::mem::transmute(f) };
        // A job no worker holds (one that took it lets go once it finds no task left).
        let free = jobs.iter_mut().position(|j| Arc::get_mut(j).is_some());
        let slot = free.unwrap_or_else(|| {
            jobs.push(Arc::new(Job::idle()));
            jobs.len() - 1
        });
        *Arc::get_mut(&mut jobs[slot]).expect("a job no one else holds") = Job::new(n, f);
        let job = jobs[slot].clone();
        // One task, or no workers: the caller alone.
        let shared = self.threads > 1 && n > 1;
        if shared {
            *lock(&self.shared.job) = Some(job.clone());
            self.shared.jobs.raise();
        }
        job.work();
        let mut i = 0u32;
        while job.done.load(Ordering::Acquire) < n {
            i = i.wrapping_add(1);
            if i.is_multiple_of(1024) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        if shared {
            lock(&self.shared.job).take();
        }
        let failed = lock(&job.panic).take();
        drop(job);
        drop(jobs);
        if let Some(msg) = failed {
            panic!("{msg}");
        }
    }

    /// Runs `job` on the pool's leader thread, after the jobs spawned before it, without
    /// waiting for it. The job may [`Pool::run`].
    pub fn spawn(&self, job: impl FnOnce() + Send + 'static) {
        lock(&self.shared.spawned).push_back(Box::new(job));
        self.shared.spawns.raise();
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        stop(&self.shared, std::mem::take(&mut self.handles));
    }
}

/// Ends the threads of `handles` and waits for them (not for the calling thread itself: a
/// spawned job may hold the pool's last owner, and then the leader drops it).
fn stop(shared: &Shared, handles: Vec<JoinHandle<()>>) {
    shared.stop.store(true, Ordering::SeqCst);
    shared.jobs.raise();
    shared.spawns.raise();
    let me = std::thread::current().id();
    for h in handles {
        if h.thread().id() != me {
            let _ = h.join();
        }
    }
}

fn worker(s: &Shared) {
    let mut seen = 0;
    loop {
        seen = s.jobs.wait(seen, s.spin);
        if s.stop.load(Ordering::SeqCst) {
            return;
        }
        let job = lock(&s.job).clone();
        if let Some(job) = job {
            job.work();
        }
    }
}

fn leader(s: &Shared) {
    let mut seen = 0;
    loop {
        seen = s.spawns.wait(seen, s.spin);
        loop {
            let next = lock(&s.spawned).pop_front();
            let Some(job) = next else { break };
            // A spawned job reports its own failures; a panic must not end the leader.
            let _ = catch_unwind(AssertUnwindSafe(job));
        }
        if s.stop.load(Ordering::SeqCst) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    fn pools() -> Vec<Pool> {
        [(1, 0), (3, 0), (4, 2000)]
            .into_iter()
            .map(|(t, us)| Pool::new(t, Duration::from_micros(us)).unwrap())
            .collect()
    }

    #[test]
    fn every_task_runs_once_in_every_run() {
        for pool in pools() {
            for n in [0usize, 1, 2, 7, 64, 1000] {
                let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                for _ in 0..20 {
                    pool.run(n, &|i| {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    });
                }
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 20),
                    "{} threads, {n} tasks",
                    pool.threads()
                );
            }
        }
    }

    #[test]
    fn runs_after_the_workers_slept_still_run() {
        let pool = Pool::new(3, Duration::ZERO).unwrap();
        let sum = AtomicUsize::new(0);
        for round in 0..5 {
            std::thread::sleep(Duration::from_millis(5));
            pool.run(100, &|i| {
                sum.fetch_add(i, Ordering::Relaxed);
            });
            assert_eq!(sum.load(Ordering::Relaxed), (round + 1) * 4950);
        }
    }

    #[test]
    fn a_panicking_task_panics_the_caller_after_the_others_finish() {
        for pool in pools() {
            let done = AtomicUsize::new(0);
            let got = catch_unwind(AssertUnwindSafe(|| {
                pool.run(50, &|i| {
                    if i == 17 {
                        panic!("task seventeen failed");
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                })
            }));
            let msg = got.expect_err("the run returned");
            let msg = msg
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| msg.downcast_ref::<&str>().map(|s| s.to_string()));
            assert_eq!(msg.as_deref(), Some("task seventeen failed"));
            assert_eq!(done.load(Ordering::Relaxed), 49);
            // The pool still works.
            let again = AtomicUsize::new(0);
            pool.run(10, &|_| {
                again.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(again.load(Ordering::Relaxed), 10);
        }
    }

    #[test]
    fn spawned_jobs_run_in_order_and_may_run_the_pool() {
        for pool in pools() {
            let pool = Arc::new(pool);
            let (tx, rx) = std::sync::mpsc::channel();
            for j in 0..4usize {
                let (p, tx) = (pool.clone(), tx.clone());
                pool.spawn(move || {
                    let sum = AtomicUsize::new(0);
                    p.run(10, &|i| {
                        sum.fetch_add(i + j, Ordering::Relaxed);
                    });
                    tx.send((j, sum.load(Ordering::Relaxed))).unwrap();
                });
            }
            let got: Vec<(usize, usize)> = (0..4).map(|_| rx.recv().unwrap()).collect();
            assert_eq!(got, (0..4).map(|j| (j, 45 + 10 * j)).collect::<Vec<_>>());
            // The last Arc of the pool may be the spawned job's: dropping it there must
            // not wait for the leader's own thread.
            drop(pool);
        }
    }
}
