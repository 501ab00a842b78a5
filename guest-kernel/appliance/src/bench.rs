//! `bench=N`: kore-engine's benchmark in the guest (the same code `kore-launch bench --native`
//! runs on the host), printed as one JSON object on the console.

use alloc::vec;

use kore_engine::bench::{self, BenchOptions};
use kore_engine::Model;
use kore_rt::{clock, println};

use crate::exit;

/// Measures read bandwidth over `mib` MiB, then prefill of `prompt` tokens and `decode` steps.
pub fn run(model: &Model<'_>, decode: usize, prompt: usize, mib: usize) -> u32 {
    let now = || clock::now_ns();
    let mut buf = vec![0u64; (mib.max(1) << 20) / 8];
    let gbps = bench::read_bandwidth(model.pool(), &mut buf, &now, 3);
    drop(buf);
    let opts =
        BenchOptions { prompt_tokens: prompt, decode_tokens: decode, ..BenchOptions::default() };
    let r = match bench::run(model, gbps, &now, &opts, &mut |line| {
        println!("kore-appliance: bench {line}")
    }) {
        Ok(r) => r,
        Err(e) => {
            println!("kore-appliance: bench failed: {e}");
            return exit::ENGINE;
        }
    };
    println!(
        "kore-appliance: bench {{\"measured_read_gbps\":{:.3},\"prefill_tok_per_s\":{:.3},\"decode_tok_per_s\":{:.3},\"step_ms\":{:.4},\"weight_bytes_per_step\":{},\"achieved_gbps\":{:.3},\"bandwidth_fraction\":{:.4},\"tokens_per_step\":{:.3},\"threads\":{},\"kernels\":\"{}\"}}",
        r.measured_read_gbps,
        r.prefill_tok_per_s,
        r.decode_tok_per_s,
        r.step_ms,
        r.weight_bytes_per_step,
        r.achieved_gbps,
        r.bandwidth_fraction,
        r.tokens_per_step,
        r.threads,
        r.kernels
    );
    0
}
