//! kore-engine's worker pool over the vCPUs: `Parallel::run` is kore-rt's `smp::parallel`
//! (CPU 0 runs worker 0, the other vCPUs spin briefly, then halt until the next job's IPI).

use core::sync::atomic::{AtomicBool, Ordering};

use kore_engine::pool::Parallel;
use kore_rt::smp;

/// All vCPUs as engine workers.
#[derive(Debug, Clone, Copy, Default)]
pub struct VcpuPool;

/// A job of this pool is running (set by CPU 0 around `smp::parallel`).
static RUNNING: AtomicBool = AtomicBool::new(false);

impl Parallel for VcpuPool {
    fn workers(&self) -> usize {
        kore_rt::cpu_count().clamp(1, smp::MAX_CPUS)
    }

    fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        // Only CPU 0 starts jobs, and never from inside one: `smp::parallel` holds its call
        // lock for the whole job, so a nested call (against the `Parallel` contract, but cheap
        // to survive) would spin forever. Nested calls, on any CPU, run every part in place
        // so the split stays complete.
        if kore_rt::cpu_id() == 0 && !RUNNING.swap(true, Ordering::Acquire) {
            smp::parallel(f);
            RUNNING.store(false, Ordering::Release);
        } else {
            let n = self.workers();
            for w in 0..n {
                f(w, n);
            }
        }
    }
}

/// The pool the model runs on (a static, so the model can borrow it for its whole life).
pub static POOL: VcpuPool = VcpuPool;
