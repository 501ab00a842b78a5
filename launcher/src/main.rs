//! `kore-launch`: the binary; everything lives in the library (`src/lib.rs`).

fn main() {
    kore_launch::main();
}
