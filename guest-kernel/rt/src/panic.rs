//! The panic handler: print the message on the console, exit with `status::PANIC`.

use core::fmt::Write;

use kore_guest_abi::status;

use crate::console::{write_unlocked, Console};

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    write_unlocked(b"\nkore-rt: panic on cpu ");
    let _ = writeln!(Console, "{}: {}", crate::cpu_id(), info);
    crate::kcall::exit(status::PANIC)
}
