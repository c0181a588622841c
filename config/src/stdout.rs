//! What Warden's binaries print on stdout goes through here: when the reader goes away
//! (`warden-agent --check-config | head`), the process ends quietly with status 0, as
//! if the output had been read to its end, instead of panicking like `println!`.
//!
//! Rust ignores SIGPIPE, so a write to a pipe nobody reads fails with `BrokenPipe`;
//! [`outln!`](crate::outln) and [`out!`](crate::out) are `println!` and `print!` that
//! treat it as the end of the program. Any other write error (a full disk) is reported
//! on stderr and ends the process with [`EXIT_IO`]. Both exits go through
//! `std::process::exit`, which flushes stdout but runs no destructors; a program with
//! something to clean up first writes with [`print_or_mark`] instead and stops when
//! stdout is [`gone`].

use std::fmt;
use std::io::{self, Write as _};
use std::sync::atomic::{AtomicBool, Ordering};

/// Exit status when stdout cannot be written for another reason than a reader that went
/// away (EX_IOERR in sysexits.h).
pub const EXIT_IO: i32 = 74;

/// Exit status when the reader of stdout went away: success, as if it had read it all
/// (what `ripgrep` does; a shell's `pipefail` does not see a failure).
pub const EXIT_CLOSED: i32 = 0;

/// Whether `e` says the reader of stdout went away.
pub fn is_closed(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::BrokenPipe
}

/// End the process after a failed write to stdout: quietly with [`EXIT_CLOSED`] when
/// the reader went away, with a message on stderr and [`EXIT_IO`] otherwise.
pub fn exit_on_error(e: &io::Error) -> ! {
    if is_closed(e) {
        std::process::exit(EXIT_CLOSED);
    }
    // Nothing more can be said if stderr is gone too.
    let _ = writeln!(io::stderr(), "cannot write to stdout: {e}");
    std::process::exit(EXIT_IO);
}

/// Set once a write through [`print_or_mark`] has failed.
static GONE: AtomicBool = AtomicBool::new(false);

fn write(args: fmt::Arguments<'_>, newline: bool) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_fmt(args)?;
    if newline {
        out.write_all(b"\n")?;
    }
    Ok(())
}

/// Write `args` to stdout (see the module's doc for a failed write).
pub fn print(args: fmt::Arguments<'_>) {
    if let Err(e) = write(args, false) {
        exit_on_error(&e);
    }
}

/// Write `args` and a newline to stdout under one lock.
pub fn print_line(args: fmt::Arguments<'_>) {
    if let Err(e) = write(args, true) {
        exit_on_error(&e);
    }
}

/// Write `args` (and a newline when `newline`) to stdout unless it is [`gone`]; a failed
/// write marks it gone and returns, for the caller to stop at its next check. A reader
/// that went away is not reported; another error is, on stderr, once.
pub fn print_or_mark(args: fmt::Arguments<'_>, newline: bool) {
    if gone() {
        return;
    }
    if let Err(e) = write(args, newline)
        && !GONE.swap(true, Ordering::Relaxed)
        && !is_closed(&e)
    {
        let _ = writeln!(io::stderr(), "cannot write to stdout: {e}");
    }
}

/// Whether a write through [`print_or_mark`] has failed: nothing more is written, and the
/// program should stop as if it had finished.
pub fn gone() -> bool {
    GONE.load(Ordering::Relaxed)
}

/// `println!` for command output: a closed stdout ends the process quietly
/// ([`stdout`](crate::stdout)).
#[macro_export]
macro_rules! outln {
    () => {
        $crate::stdout::print_line(::std::format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::stdout::print_line(::std::format_args!($($arg)*))
    };
}

/// `print!` for command output: a closed stdout ends the process quietly
/// ([`stdout`](crate::stdout)).
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::stdout::print(::std::format_args!($($arg)*))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_broken_pipe_counts_as_the_reader_gone() {
        assert!(is_closed(&io::Error::from(io::ErrorKind::BrokenPipe)));
        assert!(!is_closed(&io::Error::from(io::ErrorKind::StorageFull)));
        assert!(!is_closed(&io::Error::other("x")));
    }
}
