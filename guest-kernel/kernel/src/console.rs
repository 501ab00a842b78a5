//! Serial console output and the debug-exit port, for ring 0's own messages.
//!
//! Byte-at-a-time `out` to COM1: each byte is one VM exit, which is fine for the few lines ring
//! 0 ever prints (boot failures and exception reports).

use kore_guest_abi::ports;

fn outb(port: u16, v: u8) {
    // SAFETY: port output to the VMM's UART has no memory effects.
    unsafe {
        core::arch::asm!("out dx, al", in("dx") port, in("al") v, options(nomem, nostack, preserves_flags))
    };
}

/// Writes bytes to the serial console.
pub fn write(s: &[u8]) {
    for &b in s {
        outb(ports::SERIAL_COM1, b);
    }
}

/// Writes `v` as 16 hex digits.
pub fn hex(v: u64) {
    let mut buf = [0u8; 16];
    for (i, b) in buf.iter_mut().enumerate() {
        let nib = (v >> (60 - 4 * i)) & 0xf;
        *b = if nib < 10 { b'0' + nib as u8 } else { b'a' + nib as u8 - 10 };
    }
    write(&buf);
}

/// Writes `v` in decimal.
pub fn dec(mut v: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    write(&buf[i..]);
}

/// Ends the VM with `status` through the debug-exit port.
pub fn exit(status: u32) -> ! {
    // SAFETY: the debug-exit port ends the VM; nothing runs after it.
    unsafe {
        core::arch::asm!("out dx, eax", in("dx") ports::DEBUG_EXIT, in("eax") status, options(nomem, nostack))
    };
    loop {
        // SAFETY: halting with interrupts off parks the CPU if the VMM did not stop it.
        unsafe { core::arch::asm!("cli", "hlt", options(nomem, nostack)) };
    }
}

/// Prints `msg` and ends the VM with `status`.
pub fn fail(msg: &[u8], status: u32) -> ! {
    write(msg);
    exit(status)
}
