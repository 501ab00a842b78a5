//! The host CPU's SIMD features that the engine's kernels use.

/// Features found by CPUID on the host (false everywhere off x86-64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuFeatures {
    /// The host is x86-64 (Kore's only architecture).
    pub x86_64: bool,
    /// AVX-512 Foundation.
    pub avx512f: bool,
    /// AVX-512 byte/word.
    pub avx512bw: bool,
    /// AVX-512 vector length extensions.
    pub avx512vl: bool,
    /// AVX-512 VNNI (int8 dot products).
    pub avx512vnni: bool,
    /// AVX-512 BF16.
    pub avx512bf16: bool,
    /// AVX-512 VBMI (byte permutes).
    pub avx512vbmi: bool,
    /// AVX2.
    pub avx2: bool,
    /// FMA3.
    pub fma: bool,
}

impl CpuFeatures {
    /// Detects the running CPU's features.
    pub fn detect() -> CpuFeatures {
        #[cfg(target_arch = "x86_64")]
        {
            CpuFeatures {
                x86_64: true,
                avx512f: std::arch::is_x86_feature_detected!("avx512f"),
                avx512bw: std::arch::is_x86_feature_detected!("avx512bw"),
                avx512vl: std::arch::is_x86_feature_detected!("avx512vl"),
                avx512vnni: std::arch::is_x86_feature_detected!("avx512vnni"),
                avx512bf16: std::arch::is_x86_feature_detected!("avx512bf16"),
                avx512vbmi: std::arch::is_x86_feature_detected!("avx512vbmi"),
                avx2: std::arch::is_x86_feature_detected!("avx2"),
                fma: std::arch::is_x86_feature_detected!("fma"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            CpuFeatures::default()
        }
    }

    /// (name, present) for every feature, in a fixed order.
    pub fn list(&self) -> [(&'static str, bool); 8] {
        [
            ("avx512f", self.avx512f),
            ("avx512bw", self.avx512bw),
            ("avx512vl", self.avx512vl),
            ("avx512vnni", self.avx512vnni),
            ("avx512bf16", self.avx512bf16),
            ("avx512vbmi", self.avx512vbmi),
            ("avx2", self.avx2),
            ("fma", self.fma),
        ]
    }

    /// The kore-engine kernel path this CPU runs when it is presented as
    /// `level` (the same rule as `kore_engine::simd::best`): `avx512vnni`,
    /// `avx512`, `avx2` or `generic`. `GuestCpu::Host` is also the native path.
    pub fn kernel_path(&self, level: kore_vmm::GuestCpu) -> &'static str {
        use kore_vmm::GuestCpu;
        let avx2 = self.avx2 && self.fma && level != GuestCpu::X86_64V2;
        let avx512 =
            avx2 && self.avx512f && self.avx512bw && self.avx512vl && level == GuestCpu::Host;
        match () {
            _ if avx512 && self.avx512vnni && self.avx512vbmi => "avx512vnni",
            _ if avx512 => "avx512",
            _ if avx2 => "avx2",
            _ => "generic",
        }
    }

    /// Names of the missing features.
    pub fn missing(&self) -> Vec<&'static str> {
        self.list().iter().filter(|(_, present)| !present).map(|(name, _)| *name).collect()
    }
}
