//! Shared by the kernel tests: a small deterministic random source.
#![allow(dead_code)]

/// Xorshift64: reproducible inputs for the agreement tests.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A float in [-1, 1).
    pub fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

use std::collections::BTreeSet;

use kore_engine::simd::Path;

/// Whether this CPU and OS can run `path` by std's own feature detection
/// (not the engine's), so a detection bug in the engine cannot make an
/// agreement test skip a path unnoticed. AMX (whose std detection is not
/// stable) is read from CPUID here; its OS grant only the engine asks for.
fn std_detects(path: Path) -> bool {
    use std::is_x86_feature_detected as has;
    let avx2 = has!("avx2") && has!("fma") && has!("f16c");
    let avx512 = avx2 && has!("avx512f") && has!("avx512bw") && has!("avx512vl");
    let vnni = avx512 && has!("avx512vnni") && has!("avx512vbmi");
    match path {
        Path::Generic => true,
        Path::Avx2 => avx2,
        Path::Avx512 => avx512,
        Path::Avx512Vnni => vnni,
        // CPUID.7.0:EDX bits 22 (AMX-BF16) and 24 (AMX-TILE).
        Path::Amx => {
            vnni && core::arch::x86_64::__cpuid_count(7, 0).edx & 0x0140_0000 == 0x0140_0000
        }
    }
}

/// The kernel paths one agreement test runs, and a record of the paths it
/// did run: [`Paths::finish`] fails the test when a path this CPU supports
/// was not exercised, prints what ran and what was skipped (and why), and
/// fails when a path named in `KORE_REQUIRE_KERNELS` (comma-separated path
/// names: what CI knows its machine has) is not among those that ran.
pub struct Paths {
    test: &'static str,
    want: Vec<Path>,
    ran: BTreeSet<&'static str>,
}

impl Paths {
    /// Every supported path (the engine's detection, checked against std's);
    /// with `simd_only` the generic twin itself is left out.
    pub fn new(test: &'static str, simd_only: bool) -> Paths {
        let mut want = Vec::new();
        for p in Path::ALL {
            let (engine, std) = (p.supported(), std_detects(p));
            // The AMX tile state needs the OS's grant, which std does not see.
            let grant_refused = p == Path::Amx && std && !engine;
            assert!(
                engine == std || grant_refused,
                "{test}: the engine says {} is {}supported, std's detection disagrees",
                p.name(),
                if engine { "" } else { "not " }
            );
            if grant_refused {
                eprintln!("{test}: amx is on this CPU but the OS refused the tile state");
            }
            if engine && !(simd_only && p == Path::Generic) {
                want.push(p);
            }
        }
        Paths { test, want, ran: BTreeSet::new() }
    }

    /// The paths to run.
    pub fn list(&self) -> Vec<Path> {
        self.want.clone()
    }

    /// Records that `path` was exercised.
    pub fn ran(&mut self, path: Path) {
        self.ran.insert(path.name());
    }

    /// Checks the record (see [`Paths`]).
    pub fn finish(self) {
        let want: BTreeSet<&str> = self.want.iter().map(|p| p.name()).collect();
        let skipped: Vec<&str> =
            Path::ALL.iter().map(|p| p.name()).filter(|p| !want.contains(p)).collect();
        eprintln!(
            "{}: ran paths [{}]; not on this CPU: [{}]",
            self.test,
            self.ran.iter().copied().collect::<Vec<_>>().join(", "),
            skipped.join(", ")
        );
        let missed: Vec<&&str> = want.difference(&self.ran).collect();
        assert!(missed.is_empty(), "{}: supported paths never exercised: {missed:?}", self.test);
        if let Ok(req) = std::env::var("KORE_REQUIRE_KERNELS") {
            for name in req.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                assert!(
                    Path::from_name(name).is_some(),
                    "KORE_REQUIRE_KERNELS names no kernel path: {name}"
                );
                assert!(
                    self.ran.contains(name),
                    "{}: KORE_REQUIRE_KERNELS asks for {name}, which did not run here",
                    self.test
                );
            }
        }
    }
}
