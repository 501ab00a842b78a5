//! `kore-launch`: the binary; everything lives in the library (`src/lib.rs`).

/// Large buffers on transparent hugepages, as in the guest ([`kore_launch::huge_alloc`]).
#[global_allocator]
static ALLOC: kore_launch::huge_alloc::HugeAdvised = kore_launch::huge_alloc::HugeAdvised;

fn main() {
    kore_launch::main();
}
