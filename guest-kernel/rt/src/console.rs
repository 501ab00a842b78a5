//! Serial console output from ring 3 (the TSS I/O bitmap allows COM1 at CPL 3), and `println!`.

use core::fmt;

use kore_guest_abi::ports;
use kore_sync::SpinLock;

static LOCK: SpinLock<()> = SpinLock::new(());

fn out_bytes(s: &[u8]) {
    for &b in s {
        // SAFETY: COM1 output has no memory effects; ring 3 may use the port (boot ABI).
        unsafe {
            core::arch::asm!("out dx, al", in("dx") ports::SERIAL_COM1, in("al") b, options(nomem, nostack, preserves_flags))
        };
    }
}

/// Writes bytes to the console (whole, not interleaved with other vCPUs' writes).
pub fn write(s: &[u8]) {
    let _g = LOCK.lock();
    out_bytes(s);
}

/// Writes without taking the lock (panic path: the lock may be held by the panicking CPU).
pub(crate) fn write_unlocked(s: &[u8]) {
    out_bytes(s);
}

/// A `fmt::Write` sink for the console.
pub struct Console;

impl fmt::Write for Console {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        out_bytes(s.as_bytes());
        Ok(())
    }
}

#[doc(hidden)]
pub fn _print(args: fmt::Arguments<'_>) {
    let _g = LOCK.lock();
    let _ = fmt::write(&mut Console, args);
}

/// Prints to the serial console.
#[macro_export]
macro_rules! print {
    ($($a:tt)*) => { $crate::console::_print(format_args!($($a)*)) };
}

/// Prints a line to the serial console.
#[macro_export]
macro_rules! println {
    () => { $crate::print!("\n") };
    ($($a:tt)*) => { $crate::console::_print(format_args!("{}\n", format_args!($($a)*))) };
}
