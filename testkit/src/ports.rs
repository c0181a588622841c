//! Ports for processes that bind later: blocks of loopback ports below the kernel's
//! ephemeral range, where no outgoing connection takes them in the meantime.

use std::fs;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// The lowest port [`port_block`] hands out.
const LOW: u32 = 20_000;

/// Where the kernel starts picking source ports (Linux's default is 32768).
fn ephemeral_start() -> u32 {
    fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768)
}

/// The first of `n` consecutive loopback ports below the kernel's ephemeral range, none
/// of which anything listens on now. A port that a job binds only later (a restarted
/// run's rendezvous) comes from here: a port inside the ephemeral range may by then be
/// the source port of any outgoing connection on the host (gloo opens dozens), and the
/// bind fails with `EADDRINUSE`. Blocks handed out in one process never overlap.
pub fn port_block(n: u16) -> u16 {
    let high = ephemeral_start();
    let n32 = u32::from(n.max(1));
    assert!(
        high > LOW + 4 * n32,
        "the ephemeral port range starts at {high}: no room below it for a block of {n} ports"
    );
    let span = high - LOW - n32;
    // Separate test processes start at different places; within one, blocks follow on.
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(2_654_435_761) % span,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..span / n32 {
        let start = LOW + NEXT.fetch_add(n32, Ordering::SeqCst) % span;
        let free = (0..n32).all(|i| {
            u16::try_from(start + i).is_ok_and(|p| TcpListener::bind(("127.0.0.1", p)).is_ok())
        });
        if free {
            return u16::try_from(start).expect("below the ephemeral range");
        }
    }
    panic!("no {n} free consecutive ports between {LOW} and {high}");
}

/// A loopback port that nothing listens on now, for a process to bind soon: the one port
/// of a [`port_block`], so that it stays free however long that process takes to start.
pub fn free_port() -> u16 {
    port_block(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_lie_below_the_ephemeral_range_and_do_not_overlap() {
        let a = port_block(8);
        let b = port_block(8);
        let high = ephemeral_start();
        for p in [a, b] {
            assert!(
                (LOW..high - 8).contains(&u32::from(p)),
                "{p} against {high}"
            );
        }
        assert!(a.abs_diff(b) >= 8, "{a} and {b} overlap");
        // Every port of a block is free to listen on.
        for p in a..a + 8 {
            TcpListener::bind(("127.0.0.1", p)).expect("a port of the block");
        }
    }
}
