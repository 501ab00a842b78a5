//! `memcpy`, `memmove`, `memset`, `memcmp`, `bcmp`: the static image has no libc, and the
//! prebuilt `compiler_builtins` for this target leaves these to libc. `rep movsb`/`stosb` are
//! fast on CPUs with ERMSB and run natively in ring 3.

/// Copies `n` bytes forward.
///
/// # Safety
/// The C contract: valid, non-overlapping ranges.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller guarantees the ranges; rep movsb copies exactly n bytes forward.
    unsafe {
        core::arch::asm!("rep movsb", inout("rcx") n => _, inout("rdi") dst => _, inout("rsi") src => _,
            options(nostack, preserves_flags))
    };
    dst
}

/// Copies `n` bytes between possibly overlapping ranges.
///
/// # Safety
/// The C contract: valid ranges.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memmove(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dst as usize).wrapping_sub(src as usize) >= n {
        // Forward copy is safe: dst is below src or past its end.
        // SAFETY: forwarded contract.
        return unsafe { memcpy(dst, src, n) };
    }
    // SAFETY: backward copy with DF set, then cleared again as the ABI requires.
    unsafe {
        core::arch::asm!("std", "rep movsb", "cld", inout("rcx") n => _,
            inout("rdi") dst.wrapping_add(n).wrapping_sub(1) => _,
            inout("rsi") src.wrapping_add(n).wrapping_sub(1) => _, options(nostack))
    };
    dst
}

/// Fills `n` bytes with `c`.
///
/// # Safety
/// The C contract: a valid range.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memset(dst: *mut u8, c: i32, n: usize) -> *mut u8 {
    // SAFETY: the caller guarantees the range.
    unsafe {
        core::arch::asm!("rep stosb", inout("rcx") n => _, inout("rdi") dst => _, in("al") c as u8,
            options(nostack, preserves_flags))
    };
    dst
}

/// Compares `n` bytes.
///
/// # Safety
/// The C contract: valid ranges.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut i = 0;
    while i < n {
        // SAFETY: i < n, inside both ranges.
        let (x, y) = unsafe { (*a.add(i), *b.add(i)) };
        if x != y {
            return x as i32 - y as i32;
        }
        i += 1;
    }
    0
}

/// Equality test of `n` bytes (0 when equal).
///
/// # Safety
/// The C contract: valid ranges.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: forwarded contract.
    unsafe { memcmp(a, b, n) }
}
