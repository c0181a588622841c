//! Per-boot deduplication of kernel events: the first sighting of an event becomes a
//! [`NodeEvent`] with a per-boot id, repeats only raise its count, so a node that logs
//! 800,000 identical XID lines ships a handful of events. Memory is bounded.

use std::collections::HashMap;

use rustc_hash::FxHashMap;
use warden_model::wire::NodeEvent;

use crate::kmsg::KernelEvent;
use crate::pci;

/// Default bound on distinct events remembered per boot.
pub const DEFAULT_MAX_KEYS: usize = 4096;

/// Longest message template used as part of a key, bytes.
const MAX_TEMPLATE_LEN: usize = 160;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    kind: i32,
    code: Option<u32>,
    /// PCI address, else device name, else empty.
    place: String,
    template: String,
}

#[derive(Debug)]
struct Slot {
    event: NodeEvent,
    /// Count at the last [`Deduper::drain_counts`].
    reported: u32,
}

/// Folds repeated kernel events within one boot.
#[derive(Debug)]
pub struct Deduper {
    boot_id: String,
    next_id: u64,
    max_keys: usize,
    slots: FxHashMap<Key, Slot>,
    /// Sightings of new distinct events refused because the key table was full.
    overflow: u64,
    gpu_map: FxHashMap<String, u32>,
}

impl Deduper {
    /// A deduper for the boot `boot_id`, remembering up to [`DEFAULT_MAX_KEYS`] events.
    pub fn new(boot_id: impl Into<String>) -> Self {
        Self::with_max_keys(boot_id, DEFAULT_MAX_KEYS)
    }

    /// A deduper remembering up to `max_keys` distinct events (at least 1).
    pub fn with_max_keys(boot_id: impl Into<String>, max_keys: usize) -> Self {
        Deduper {
            boot_id: boot_id.into(),
            next_id: 1,
            max_keys: max_keys.max(1),
            slots: FxHashMap::default(),
            overflow: 0,
            gpu_map: FxHashMap::default(),
        }
    }

    /// Use `map` (PCI bus id in any spelling → GPU index, from NVML) to fill
    /// `gpu_index` in the events produced from now on. Ids that do not parse as PCI
    /// addresses are ignored.
    pub fn with_gpu_map(mut self, map: &HashMap<String, u32>) -> Self {
        self.set_gpu_map(map);
        self
    }

    /// The GPU index of a normalised PCI address, when the map knows it.
    pub fn gpu_index(&self, pci_bus_id: &str) -> Option<u32> {
        self.gpu_map.get(pci_bus_id).copied()
    }

    /// Replace the PCI → GPU index map (see [`Deduper::with_gpu_map`]).
    pub fn set_gpu_map(&mut self, map: &HashMap<String, u32>) {
        self.gpu_map = map
            .iter()
            .filter_map(|(k, v)| pci::normalize(k).map(|k| (k, *v)))
            .collect();
    }

    /// The boot this deduper is counting for.
    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    /// Switch to `boot_id`; a different boot forgets everything and restarts ids at 1.
    pub fn set_boot_id(&mut self, boot_id: &str) {
        if boot_id != self.boot_id {
            self.boot_id = boot_id.to_owned();
            self.next_id = 1;
            self.slots.clear();
            self.overflow = 0;
        }
    }

    /// Record one sighting at `at_ns` (agent clock, ns since the Unix epoch). Returns
    /// the event to ship the first time it is seen in this boot, `None` for a repeat.
    /// When the key table is full, a new event takes the place of the least severe
    /// tracked one if it is more severe, and is dropped otherwise; both are counted by
    /// [`Deduper::overflow`].
    pub fn observe(&mut self, ev: &KernelEvent, at_ns: i64) -> Option<NodeEvent> {
        let key = key_of(ev);
        if let Some(slot) = self.slots.get_mut(&key) {
            slot.event.count = slot.event.count.saturating_add(1);
            return None;
        }
        if self.slots.len() >= self.max_keys {
            // Full: a more severe event takes the place of the least severe one, so a
            // flood of warnings can never hide a fatal XID.
            let weakest = self
                .slots
                .iter()
                .min_by_key(|(_, s)| (s.event.severity, s.event.id))
                .filter(|(_, s)| s.event.severity < ev.severity as i32)
                .map(|(k, _)| k.clone());
            self.overflow += 1;
            match weakest {
                Some(k) => {
                    self.slots.remove(&k);
                }
                None => return None,
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        let event = NodeEvent {
            id,
            at_ns,
            kind: ev.kind as i32,
            severity: ev.severity as i32,
            gpu_index: ev
                .pci_bus_id
                .as_ref()
                .and_then(|p| self.gpu_map.get(p).copied()),
            pci_bus_id: ev.pci_bus_id.clone().unwrap_or_default(),
            code: ev.code,
            message: ev.message.clone(),
            count: 1,
        };
        self.slots.insert(
            key,
            Slot {
                event: event.clone(),
                reported: 1,
            },
        );
        Some(event)
    }

    /// The events whose count grew since the last call, with their current total
    /// count and their original id, ordered by id: ship them again to report repeats.
    pub fn drain_counts(&mut self) -> Vec<NodeEvent> {
        let mut out: Vec<NodeEvent> = self
            .slots
            .values_mut()
            .filter(|s| s.event.count != s.reported)
            .map(|s| {
                s.reported = s.event.count;
                s.event.clone()
            })
            .collect();
        out.sort_unstable_by_key(|e| e.id);
        out
    }

    /// Number of distinct events remembered in this boot.
    pub fn distinct(&self) -> usize {
        self.slots.len()
    }

    /// Sightings dropped because the key table was full, in this boot.
    pub fn overflow(&self) -> u64 {
        self.overflow
    }
}

fn key_of(ev: &KernelEvent) -> Key {
    Key {
        kind: ev.kind as i32,
        code: ev.code,
        place: ev
            .pci_bus_id
            .clone()
            .or_else(|| ev.device.clone())
            .unwrap_or_default(),
        template: template(&ev.detail),
    }
}

/// `text` with numbers and hex words masked (`#`), so repeats that differ only in
/// addresses, counters or timestamps share a template.
pub fn template(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(MAX_TEMPLATE_LEN));
    for (i, word) in text.split(' ').enumerate() {
        if out.len() >= MAX_TEMPLATE_LEN {
            break;
        }
        if i > 0 {
            out.push(' ');
        }
        if word.bytes().any(|b| b.is_ascii_digit()) {
            // Keep letters and punctuation, fold each digit run to one '#'.
            let mut last_hash = false;
            for c in word.chars() {
                if c.is_ascii_hexdigit() {
                    if !last_hash {
                        out.push('#');
                    }
                    last_hash = true;
                } else {
                    out.push(c);
                    last_hash = false;
                }
            }
        } else {
            out.push_str(word);
        }
    }
    let mut end = out.len().min(MAX_TEMPLATE_LEN);
    while !out.is_char_boundary(end) {
        end -= 1;
    }
    out.truncate(end);
    out
}

#[cfg(test)]
mod tests {
    use warden_model::wire::{EventSeverity, NodeEventKind};

    use super::*;
    use crate::kmsg::parse_line;

    fn xid_line(code: u32, bus: u32, n: u64) -> String {
        format!(
            "[{}.{:06}] NVRM: Xid (PCI:0000:{bus:02x}:00): {code}, pid={}, name=python, \
             Ch 0000{:04x}, intr 00000000. fault @ 0x{:x}",
            n / 1000,
            n % 1000,
            1000 + n % 7,
            n % 11,
            n * 4096
        )
    }

    #[test]
    fn a_million_line_flood_ships_one_event_per_distinct_xid() {
        // 29 distinct (code, GPU) pairs, as on the node that logged ~800,000 lines.
        let codes = [
            13, 31, 43, 45, 48, 63, 64, 74, 79, 94, 95, 119, 120, 140, 999,
        ];
        let combos: Vec<(u32, u32)> = (0..29u32)
            .map(|i| (codes[i as usize % codes.len()], 0x18 + i / 3))
            .collect();
        let mut uniq = combos.clone();
        uniq.sort_unstable();
        uniq.dedup();
        assert_eq!(uniq.len(), 29);

        let mut d = Deduper::new("boot-a");
        let mut shipped = Vec::new();
        let mut per_combo = vec![0u32; combos.len()];
        for n in 0..1_000_000u64 {
            let c = (n * 7919 % combos.len() as u64) as usize;
            per_combo[c] += 1;
            let (code, bus) = combos[c];
            let line = xid_line(code, bus, n);
            let Some(ev) = parse_line(&line) else {
                panic!("not recognised: {line}");
            };
            if let Some(e) = d.observe(&ev, 1_700_000_000_000_000_000 + n as i64) {
                shipped.push(e);
            }
            assert!(d.distinct() <= 29);
        }
        assert_eq!(shipped.len(), 29);
        assert_eq!(d.distinct(), 29);
        assert_eq!(d.overflow(), 0);
        let ids: Vec<u64> = shipped.iter().map(|e| e.id).collect();
        assert_eq!(ids, (1..=29).collect::<Vec<_>>());

        let counts = d.drain_counts();
        assert_eq!(counts.len(), 29);
        let total: u64 = counts.iter().map(|e| u64::from(e.count)).sum();
        assert_eq!(total, 1_000_000);
        for e in &counts {
            let bus = u32::from_str_radix(&e.pci_bus_id[5..7], 16).unwrap_or(0);
            let c = combos
                .iter()
                .position(|&(code, b)| Some(code) == e.code && b == bus)
                .unwrap_or(usize::MAX);
            assert_eq!(e.count, per_combo[c], "{e:?}");
        }
        // Nothing new since the drain.
        assert!(d.drain_counts().is_empty());
    }

    #[test]
    fn key_table_is_bounded_and_overflow_counted() {
        let mut d = Deduper::with_max_keys("b", 4);
        let mut shipped = 0;
        for bus in 0..10u32 {
            let line =
                format!("NVRM: Xid (PCI:0000:{bus:02x}:00): 79, GPU has fallen off the bus.");
            let ev = parse_line(&line).expect("recognised");
            shipped += usize::from(d.observe(&ev, 1).is_some());
        }
        assert_eq!((shipped, d.distinct(), d.overflow()), (4, 4, 6));
    }

    #[test]
    fn a_full_table_still_ships_a_more_severe_event() {
        let mut d = Deduper::with_max_keys("b", 2);
        for bus in 0..5u32 {
            let line = format!("NVRM: Xid (PCI:0000:{bus:02x}:00): 13, Graphics Exception");
            let ev = parse_line(&line).expect("recognised");
            d.observe(&ev, 1);
        }
        let fatal = parse_line("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.")
            .expect("recognised");
        let shipped = d
            .observe(&fatal, 2)
            .expect("a fatal XID is shipped even when full");
        assert_eq!(shipped.code, Some(79));
        assert_eq!(d.distinct(), 2);
    }

    #[test]
    fn a_new_boot_starts_fresh() {
        let ev = parse_line("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.")
            .expect("recognised");
        let mut d = Deduper::new("boot-a");
        assert_eq!(d.observe(&ev, 1).map(|e| e.id), Some(1));
        assert_eq!(d.observe(&ev, 2), None);
        d.set_boot_id("boot-a");
        assert_eq!(d.observe(&ev, 3), None, "same boot keeps its memory");
        d.set_boot_id("boot-b");
        assert_eq!(d.boot_id(), "boot-b");
        let again = d.observe(&ev, 4).expect("new boot reports again");
        assert_eq!((again.id, again.count, again.at_ns), (1, 1, 4));
        assert!(d.drain_counts().is_empty());
    }

    #[test]
    fn event_fields_and_gpu_map() {
        let map = HashMap::from([("00000000:3B:00.0".to_owned(), 5u32)]);
        let mut d = Deduper::new("b").with_gpu_map(&map);
        let ev = parse_line(
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
        )
        .expect("recognised");
        let e = d.observe(&ev, 42).expect("first");
        assert_eq!(e.kind, NodeEventKind::Xid as i32);
        assert_eq!(e.severity, EventSeverity::Fatal as i32);
        assert_eq!(e.gpu_index, Some(5));
        assert_eq!(e.pci_bus_id, "0000:3b:00");
        assert_eq!(e.code, Some(79));
        assert_eq!(e.count, 1);
        // Unmapped PCI address: no GPU index, address kept.
        let ev = parse_line("NVRM: Xid (PCI:0000:5e:00): 79, GPU has fallen off the bus.")
            .expect("recognised");
        let e = d.observe(&ev, 43).expect("first");
        assert_eq!((e.gpu_index, e.pci_bus_id.as_str()), (None, "0000:5e:00"));
    }

    #[test]
    fn templates_mask_numbers_but_keep_words() {
        assert_eq!(
            template("Ch 00000008, intr 0x10000000 at 312.5"),
            template("Ch 0000001f, intr 0x20000000 at 9.75")
        );
        assert_ne!(
            template("Graphics SM Warp Exception"),
            template("Graphics SM Global Exception")
        );
        assert!(template(&"x".repeat(10_000)).len() <= MAX_TEMPLATE_LEN);
    }
}
