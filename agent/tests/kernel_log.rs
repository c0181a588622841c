//! The kernel-log collector over real-format input: syslog and dmesg text, `/dev/kmsg`
//! records, and a flood of a million XID lines.

use std::io::Read;
use std::path::{Path, PathBuf};

use warden_agent::dedup::Deduper;
use warden_agent::kernel_log::{KernelLog, record_at_ns};
use warden_model::wire::{EventSeverity, NodeEvent, NodeEventKind};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn run(log: &mut KernelLog) -> Vec<NodeEvent> {
    let mut out = Vec::new();
    loop {
        let stats = log.poll(1_000, 100_000, &mut out).expect("poll");
        if stats.lines == 0 {
            return out;
        }
    }
}

fn kind(e: &NodeEvent) -> NodeEventKind {
    NodeEventKind::from_wire(e.kind)
}

#[test]
fn syslog_lines_from_a_real_ecc_failure() {
    let path = data("kernel-fl-0004.log");
    let mut log = KernelLog::open(&path, Deduper::new("boot-1"), 1_000).expect("open");
    let events = run(&mut log);
    let xids: Vec<(Option<u32>, &str)> = events
        .iter()
        .filter(|e| kind(e) == NodeEventKind::Xid)
        .map(|e| (e.code, e.pci_bus_id.as_str()))
        .collect();
    assert_eq!(xids, [(Some(48), "0000:41:00"), (Some(64), "0000:41:00")]);
    let dbe = &events.iter().find(|e| e.code == Some(48)).expect("xid 48");
    assert!(dbe.severity >= EventSeverity::Error as i32);
    assert_eq!(log.lines_total, 9);
}

#[test]
fn dmesg_lines_from_a_gpu_that_fell_off_the_bus() {
    let path = data("kernel-fl-0065.log");
    let mut map = std::collections::HashMap::new();
    map.insert("0000:ab:00".to_owned(), 5u32);
    let mut log =
        KernelLog::open(&path, Deduper::new("boot-1").with_gpu_map(&map), 1_000).expect("open");
    let events = run(&mut log);
    let x79 = events
        .iter()
        .find(|e| kind(e) == NodeEventKind::Xid && e.code == Some(79))
        .expect("xid 79");
    assert_eq!(x79.severity, EventSeverity::Fatal as i32);
    assert_eq!(
        x79.gpu_index,
        Some(5),
        "PCI address mapped to the GPU index"
    );
    assert!(
        events
            .iter()
            .any(|e| kind(e) == NodeEventKind::FallenOffBus && e.gpu_index == Some(5)),
        "{events:?}"
    );
    assert_eq!(log.xid_counts(), &[(79, Some(5), 1)]);
}

#[test]
fn kmsg_records_are_recognised_and_continuations_ignored() {
    let text = "4,1201,2419087113215,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python, Graphics SM Warp Exception on (GPC 1, TPC 0, SM 1): Illegal Instruction Encoding\n\
                 SUBSYSTEM=pci\n\
                 6,1202,2419087113300,-;mlx5_core 0000:c1:00.0 ib2: Link down\n\
                 3,1203,2419087114000,-;Out of memory: Killed process 9123 (python) total-vm:123456kB, anon-rss:1000kB\n";
    let mut log = KernelLog::from_reader(
        Box::new(std::io::Cursor::new(text.as_bytes().to_vec())),
        Deduper::new("b"),
        "kmsg".into(),
    );
    let events = run(&mut log);
    let kinds: Vec<NodeEventKind> = events.iter().map(kind).collect();
    assert_eq!(
        kinds,
        [
            NodeEventKind::Xid,
            NodeEventKind::Network,
            NodeEventKind::OomKill
        ],
        "{events:?}"
    );
    assert_eq!(events[0].code, Some(13));
}

/// A reader producing `n` XID lines that cycle through `distinct` (code, GPU) pairs,
/// with varying addresses and pids as real floods have, without holding them in memory.
struct Flood {
    n: u64,
    distinct: u64,
    i: u64,
    line: Vec<u8>,
    pos: usize,
}

impl Read for Flood {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut written = 0;
        while written < buf.len() {
            if self.pos == self.line.len() {
                if self.i == self.n {
                    break;
                }
                let k = self.i % self.distinct;
                let code = [
                    13u32, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94,
                ][(k % 15) as usize];
                let bus = 0x18 + (k / 15) as u32 * 0x20;
                self.line = format!(
                    "[{}.{:06}] NVRM: Xid (PCI:0000:{bus:02x}:00): {code}, pid={}, name=python3, Ch 0000{:04x}, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_{} faulted @ 0x7f_{:08x}\n",
                    self.i / 1000,
                    self.i % 1_000_000,
                    1000 + self.i % 977,
                    self.i % 4096,
                    self.i % 7,
                    self.i.wrapping_mul(2_654_435_761) & 0xffff_ffff
                )
                .into_bytes();
                self.pos = 0;
                self.i += 1;
            }
            let take = (self.line.len() - self.pos).min(buf.len() - written);
            buf[written..written + take].copy_from_slice(&self.line[self.pos..self.pos + take]);
            self.pos += take;
            written += take;
        }
        Ok(written)
    }
}

#[test]
fn a_million_line_xid_flood_ships_a_bounded_number_of_events() {
    let n = 1_000_000;
    let flood = Flood {
        n,
        distinct: 29,
        i: 0,
        line: Vec::new(),
        pos: 0,
    };
    let mut log = KernelLog::from_reader(Box::new(flood), Deduper::new("b"), "flood".into());
    let started = std::time::Instant::now();
    let mut shipped = 0usize;
    let mut polls = 0;
    loop {
        let mut out = Vec::new();
        let stats = log.poll(1_000, 200_000, &mut out).expect("poll");
        shipped += out.len();
        polls += 1;
        if stats.lines == 0 {
            break;
        }
        // Repeat counts go out once per poll at most.
        shipped += log.drain_counts().len();
    }
    let took = started.elapsed();
    assert_eq!(log.lines_total, n);
    assert_eq!(log.recognised_total, n);
    assert!(
        log.dedup_mut().distinct() <= 29,
        "{}",
        log.dedup_mut().distinct()
    );
    // 29 first sightings plus at most one count update per event per poll.
    assert!(
        shipped <= 29 * (polls + 1),
        "{shipped} events shipped in {polls} polls"
    );
    let total: u64 = log.xid_counts().iter().map(|c| c.2).sum();
    assert_eq!(total, n, "every sighting counted per code");
    eprintln!(
        "flood: {n} lines in {took:?} ({:.0} lines/s), {shipped} events shipped",
        n as f64 / took.as_secs_f64()
    );
}

#[test]
fn a_flood_of_distinct_lines_stays_within_the_key_bound() {
    // Every line a different GPU address: the key table must not grow past its bound.
    let mut text = String::new();
    for i in 0..20_000u32 {
        text.push_str(&format!(
            "NVRM: Xid (PCI:{:04x}:{:02x}:00): 31, pid=1, name=x, MMU Fault\n",
            i / 256,
            i % 256
        ));
    }
    let mut log = KernelLog::from_reader(
        Box::new(std::io::Cursor::new(text.into_bytes())),
        Deduper::with_max_keys("b", 512),
        "distinct".into(),
    );
    let events = run(&mut log);
    assert_eq!(log.lines_total, 20_000);
    assert!(log.dedup_mut().distinct() <= 512);
    assert!(events.len() <= 20_000);
    assert!(log.dedup_mut().overflow() > 0);
}

#[test]
fn overlong_and_binary_lines_do_not_break_the_reader() {
    let mut bytes = vec![b'x'; 100_000];
    bytes.push(b'\n');
    bytes.extend_from_slice(&[0xff, 0xfe, 0, 1, 2, b'\n']);
    bytes.extend_from_slice(b"NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n");
    let mut log = KernelLog::from_reader(
        Box::new(std::io::Cursor::new(bytes)),
        Deduper::new("b"),
        "garbage".into(),
    );
    let events = run(&mut log);
    assert_eq!(log.lines_total, 3);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].code, Some(79));
}

#[test]
fn a_kmsg_record_is_never_later_than_its_read() {
    let boot = 1_700_000_000_000_000_000;
    let now = boot + 3_600_000_000_000;
    for (rec, want) in [
        ("6,1,1000000,-;NVRM: Xid", boot + 1_000_000_000),
        ("6,2,7200000000,-;later than the read", now),
        // Microseconds past what i64 nanoseconds hold: the read time, no overflow.
        ("6,3,18446744073709551615,-;NVRM: Xid", now),
        ("6,4,9223372036854775807,-;x", now),
        ("6,5,9223372036854775,-;x", now),
        ("no header at all", now),
    ] {
        assert_eq!(record_at_ns(rec, boot, now), want, "{rec}");
    }
}
