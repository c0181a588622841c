//! Fuzz target: the kernel-log collector (`warden_agent::kernel_log`, `kmsg`, `dedup`,
//! `pci`, the XID lines through the shipped catalog).
//!
//! The input, repeated a few times (so lines can outgrow the collector's 8 KiB record
//! limit), is read by `KernelLog` as a text stream in chunks of a fuzzed size; every
//! line is also parsed on its own with `kmsg::parse_line` and as a `/dev/kmsg` record
//! header. Checked: nothing panics; every line is counted once when none is overlong;
//! events carry messages within `MAX_MESSAGE_LEN`, normalised PCI addresses and an
//! XID code when they are XIDs; a repeat of a sighting is folded, not shipped again;
//! record times are never later than the read.

use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;

use warden_agent::dedup::{self, Deduper};
use warden_agent::kernel_log::{KernelLog, record_at_ns};
use warden_agent::kmsg::{self, MAX_MESSAGE_LEN};
use warden_agent::pci;
use warden_model::wire::NodeEventKind;

/// Longest line the text reader hands on whole (`kernel_log::MAX_RECORD`).
const MAX_RECORD: usize = 8192;
const NOW_NS: i64 = 1_700_000_000_000_000_000;

/// A reader that hands out `data`, `times` times over, at most `chunk` bytes a read.
struct Chunked {
    data: Vec<u8>,
    times: usize,
    at: usize,
    chunk: usize,
}

impl Read for Chunked {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.data.is_empty() || self.times == 0 {
            return Ok(0);
        }
        let n = self.chunk.min(out.len()).min(self.data.len() - self.at);
        out[..n].copy_from_slice(&self.data[self.at..self.at + n]);
        self.at += n;
        if self.at == self.data.len() {
            self.at = 0;
            self.times -= 1;
        }
        Ok(n)
    }
}

/// One input, as libFuzzer passes it (`fuzz_targets/kmsg.rs`).
pub fn run(input: &[u8]) {
    let Some((&knobs, data)) = input.split_first() else {
        return;
    };
    let times = 1 + usize::from(knobs & 7);
    let chunk = [1, 7, 64, 4096, 8191, 8192, 65536, usize::MAX][usize::from(knobs >> 5)];

    let gpus: HashMap<String, u32> = [("0000:3b:00".to_owned(), 0), ("0000:86:00".to_owned(), 1)]
        .into_iter()
        .collect();
    let mut log = KernelLog::from_reader(
        Box::new(Chunked {
            data: data.to_vec(),
            times,
            at: 0,
            chunk,
        }),
        Deduper::with_max_keys("boot-1", 64).with_gpu_map(&gpus),
        PathBuf::from("fuzz"),
    );
    let mut events = Vec::new();
    let stats = log
        .poll(NOW_NS, usize::MAX, &mut events)
        .expect("reading from memory does not fail");
    let stream: Vec<u8> = data.repeat(times);
    let complete = stream.iter().filter(|&&b| b == b'\n').count();
    let overlong = stream.split(|&b| b == b'\n').any(|l| l.len() >= MAX_RECORD);
    if !overlong {
        assert_eq!(
            stats.lines as usize, complete,
            "every finished line counted once"
        );
    }
    assert!(stats.recognised <= stats.lines);
    assert!(events.len() as u64 <= stats.recognised);
    for e in events.iter().chain(log.drain_counts().iter()) {
        assert!(e.message.len() <= MAX_MESSAGE_LEN);
        assert!(e.count >= 1);
    }

    let text = String::from_utf8_lossy(data);
    let mut once = Deduper::new("boot-2");
    for line in text.split('\n') {
        let at = record_at_ns(line, NOW_NS - 1_000_000_000_000, NOW_NS);
        assert!(at <= NOW_NS, "a record is never later than its read");
        let _ = pci::find(line);
        let _ = kmsg::strip_prefix(line);
        let _ = dedup::template(line);
        let Some(ev) = kmsg::parse_line(line) else {
            continue;
        };
        assert!(ev.message.len() <= MAX_MESSAGE_LEN && ev.detail.len() <= MAX_MESSAGE_LEN);
        if let Some(p) = &ev.pci_bus_id {
            assert_eq!(
                pci::normalize(p).as_deref(),
                Some(p.as_str()),
                "a PCI address is kept normalised"
            );
        }
        if ev.kind == NodeEventKind::Xid {
            assert!(ev.code.is_some(), "an XID event has its code");
        }
        if once.observe(&ev, NOW_NS).is_some() {
            assert!(
                once.observe(&ev, NOW_NS).is_none(),
                "a repeat of a sighting is folded"
            );
        }
    }
}
