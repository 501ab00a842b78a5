//! kore-engine's worker pool over the vCPUs: `Parallel::run` is kore-rt's `smp::parallel`
//! (CPU 0 runs worker 0, the other vCPUs spin briefly, then halt until the next job's IPI).

use kore_engine::pool::Parallel;
use kore_rt::smp;

/// All vCPUs as engine workers.
#[derive(Debug, Clone, Copy, Default)]
pub struct VcpuPool;

impl Parallel for VcpuPool {
    fn workers(&self) -> usize {
        kore_rt::cpu_count().clamp(1, smp::MAX_CPUS)
    }

    fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        if kore_rt::cpu_id() == 0 {
            smp::parallel(f);
        } else {
            // Called from a worker (nested): run every part here so the split stays complete.
            let n = self.workers();
            for w in 0..n {
                f(w, n);
            }
        }
    }
}

/// The pool the model runs on (a static, so the model can borrow it for its whole life).
pub static POOL: VcpuPool = VcpuPool;
