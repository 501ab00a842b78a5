//! kore-appliance: the Kore ring-3 image that runs the model pack the VMM preloaded.
//!
//! Boot: find the pack's files in the boot info, read `pack.toml`, parse the weights'
//! safetensors header in place, build kore-engine's `Model` over the weights where they lie
//! (zero copy), load the tokenizer, then announce readiness (console line
//! `kore-appliance: ready ...` and a write of [`READY_MARKER`] to the VMM's marker port).
//!
//! Command line (space-separated `key=value`); without `selftest` the appliance serves the
//! chat protocol (kore-service, `docs/protocol.md`) on vsock port [`SERVICE_PORT`]:
//! - `port=P`: serve on vsock port P instead;
//! - `context=N`: limit the context (prompt + generated tokens) to N, never above the model's;
//! - `kv_tokens=N`: KV positions the running sequences share (requests beyond wait);
//! - `sessions_mib=M`: the prefix cache's memory budget; `cache_pack=HEX`: the pack identity
//!   of the prefix cache's files, exchanged with the host on vsock port 1026 (`cache.rs`);
//! - `kernels=generic|avx2|avx512|avx512vnni`: force kore-engine's kernel path (default: the
//!   best the CPU level allows); `kv=f32|f16`: the KV cache type; `deltanet_chunked_min=N`:
//!   DeltaNet's chunked form from N tokens (the launcher passes its `KORE_*` engine options);
//! - `bench=N [bench_prompt=P] [bench_mib=M]`: run kore-engine's benchmark (P prompt tokens,
//!   default 128; N decode steps; read bandwidth over M MiB, default 64), print
//!   `kore-appliance: bench {json}` and exit 0;
//! - `selftest=N`: generate N greedy tokens from a prompt, print
//!   `kore-appliance: selftest prompt_ids=[..] ids=[..]` and exit 0 (no vsock needed);
//!   `prompt_ids=1,2,3` sets the prompt (default: the tokenizer's ids of [`SELFTEST_TEXT`]).
//!
//! Exit statuses: 0 done, 2 bad command line, 3 unusable pack, 4 generation failed,
//! 5 no usable vsock device / device error.
#![no_std]
#![no_main]

extern crate alloc;

mod bench;
mod cache;
mod cmdline;
mod pool;
mod selftest;
mod serve;

use kore_guest_pack::Pack;
use kore_rt::{clock, println};
use kore_tokenizer::Tokenizer;

use crate::cmdline::Cmdline;

kore_rt::main!(main);

/// Byte written to the marker port when the appliance is ready (`R`). Ring 3 may only use the
/// marker port itself (the next port is ring-0 only), so the write is one byte wide.
pub const READY_MARKER: u8 = b'R';
/// The vsock port of the chat service.
pub const SERVICE_PORT: u32 = 1025;
/// The self-test's default prompt.
pub const SELFTEST_TEXT: &str = "ROMEO.\nBut soft, what light";

/// Exit statuses.
pub mod exit {
    /// The command line could not be read.
    pub const BAD_CMDLINE: u32 = 2;
    /// The pack is missing or unusable.
    pub const BAD_PACK: u32 = 3;
    /// The engine failed while generating.
    pub const ENGINE: u32 = 4;
    /// No usable vsock device, or the device failed.
    pub const DEVICE: u32 = 5;
}

fn main() -> u32 {
    let t0 = clock::now_ns();
    let raw = core::str::from_utf8(kore_rt::boot_info().cmdline()).unwrap_or("");
    let cmd = match Cmdline::parse(raw) {
        Ok(c) => c,
        Err(e) => {
            println!("kore-appliance: bad command line: {e}");
            return exit::BAD_CMDLINE;
        }
    };
    println!("kore-appliance: cpus={} cmdline={raw:?}", kore_rt::cpu_count());
    // PCI functions the VMM passed (e.g. `kore-launch --vf`): named, not driven yet.
    kore_rt::pci::list("kore-appliance");
    // The CPU level the VMM gave this guest (its XCR0), also where ring 3 sees the host's.
    let xcr0 = kore_rt::boot_info().xcr0;
    if xcr0 != 0 {
        kore_engine::simd::limit_xcr0(xcr0);
    }
    let pack = match Pack::from_files(kore_rt::preloaded_files()) {
        Ok(p) => p,
        Err(e) => {
            println!("kore-appliance: {e}");
            return exit::BAD_PACK;
        }
    };
    let mut model = match pack.model() {
        Ok(m) => m,
        Err(e) => {
            println!("kore-appliance: {e}");
            return exit::BAD_PACK;
        }
    };
    if let Err(e) = model.set_options(&cmd.engine) {
        println!("kore-appliance: kernels: {e}");
        return exit::BAD_CMDLINE;
    }
    // Every heavy op of the forward pass splits its rows over all vCPUs.
    model.set_pool(&pool::POOL);
    let tokenizer = match Tokenizer::from_json(pack.tokenizer_json) {
        Ok(t) => t,
        Err(e) => {
            println!("kore-appliance: tokenizer {}: {e}", pack.manifest.tokenizer_file);
            return exit::BAD_PACK;
        }
    };
    let load_ms = (clock::now_ns() - t0) / 1_000_000;
    println!(
        "kore-appliance: pack {:?} at {:#x}: {} weight bytes, {} layers, vocab {}, context {}, loaded in {load_ms} ms; kernels={} workers={}",
        pack.manifest.name,
        pack.weights_bytes.as_ptr() as usize,
        pack.weights_bytes.len(),
        model.config.num_layers(),
        model.config.vocab_size,
        pack.manifest.context_length,
        model.kernels().name(),
        model.pool().workers(),
    );
    if let Some(n) = cmd.bench {
        return bench::run(&model, n, cmd.bench_prompt.unwrap_or(128), cmd.bench_mib.unwrap_or(64));
    }
    if let Some(n) = cmd.selftest {
        return selftest::run(&model, &tokenizer, n, cmd.prompt_ids.as_deref());
    }
    serve_vsock(&model, tokenizer, &pack, cmd.port.unwrap_or(SERVICE_PORT), &cmd)
}

/// Serves kore-service on vsock `port` until the device fails.
fn serve_vsock<'m>(
    model: &'m kore_engine::Model<'m>,
    tokenizer: Tokenizer,
    pack: &Pack<'_>,
    port: u32,
    cmd: &Cmdline,
) -> u32 {
    // Guest memory is sized by kore-launch (host::sizing) for these: the context limit, the KV
    // positions the running sequences share (requests beyond wait in the queue), kept sessions.
    let settings = kore_appliance::Settings {
        name: pack.manifest.name.clone(),
        eos_token: pack.manifest.eos_token.clone(),
        context: cmd.context,
        kv_tokens: cmd.kv_tokens,
        cache_bytes: cmd.sessions_mib.map(|mib| mib << 20),
        // `{"op":"bench"}` measures with the TSC clock, like `bench=N`.
        bench_clock: Some(clock::now_ns),
        ..kore_appliance::Settings::default()
    };
    // With `cache_pack=`, checkpoints go to and come from the host's disk tier (cache.rs).
    let (link, store) = match cmd.cache_pack {
        Some(pack) => {
            let (link, store) = cache::Link::new();
            (Some(link), Some(kore_appliance::Store { store: alloc::boxed::Box::new(store), pack }))
        }
        None => (None, None),
    };
    let mut svc = kore_appliance::service(
        model,
        Some(alloc::sync::Arc::new(tokenizer)),
        &settings,
        serve::TscClock,
        store,
    );
    let mut dev = match kore_rt::vsock::open() {
        Ok(d) => d,
        Err(e) => {
            println!("kore-appliance: no usable vsock device: {e:?}");
            return exit::DEVICE;
        }
    };
    let cid = dev.sockets.cid();
    let e = serve::run(&mut dev, &mut svc, port, link, || {
        announce_ready(&alloc::format!("vsock cid={cid} port={port}"))
    });
    println!("kore-appliance: vsock device failed: {e:?}");
    exit::DEVICE
}

/// Tells the VMM/launcher the appliance is ready (console line + marker port write).
pub fn announce_ready(what: &str) {
    println!("kore-appliance: ready {what}");
    // SAFETY: the marker port is in ring 3's I/O bitmap (boot ABI); the write has no memory
    // effects in the guest.
    unsafe {
        core::arch::asm!("out dx, al", in("dx") kore_rt::abi::ports::MARKER, in("al") READY_MARKER,
            options(nomem, nostack, preserves_flags))
    };
}
