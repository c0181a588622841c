//! Turns what changed between two NVML samples of a GPU into node events: error
//! counters that went up, memory repair that became pending or failed, thermal
//! throttling that began, a temperature that crossed its threshold.

use rustc_hash::FxHashMap;
use warden_model::wire::{EventSeverity, NodeEvent, NodeEventKind};

use super::{GpuIdentity, GpuReading, gpu_event, throttle};

/// What the [`ChangeDetector`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeConfig {
    /// A GPU hotter than this, degrees Celsius, is reported (once per crossing);
    /// `None` turns the check off.
    pub temp_threshold_c: Option<u32>,
    /// After a crossing, the GPU must cool to `temp_threshold_c - temp_hysteresis_c`
    /// before another crossing is reported, degrees Celsius.
    pub temp_hysteresis_c: u32,
}

impl Default for ChangeConfig {
    /// 85 °C with 5 °C of hysteresis: below the slowdown temperature of data-centre
    /// GPUs (about 87-90 °C on H100), so the event comes before the throttling.
    fn default() -> Self {
        ChangeConfig {
            temp_threshold_c: Some(85),
            temp_hysteresis_c: 5,
        }
    }
}

#[derive(Debug, Default)]
struct Baseline {
    /// The last known value of every reading (a `None` keeps the previous value).
    last: GpuReading,
    /// Whether a crossing of the temperature threshold was reported and the GPU has
    /// not cooled down since.
    hot: bool,
}

/// Compares each GPU's sample with the last one and reports what got worse. The first
/// sample of a GPU, and the first value of each reading, only set the baseline. An
/// event's `count` is how much its counter rose (1 for a state change).
#[derive(Debug, Default)]
pub struct ChangeDetector {
    config: ChangeConfig,
    gpus: FxHashMap<String, Baseline>,
}

impl ChangeDetector {
    /// A detector with no baselines yet.
    pub fn new(config: ChangeConfig) -> Self {
        ChangeDetector {
            config,
            gpus: FxHashMap::default(),
        }
    }

    /// Compare `readings` with the previous ones; the events are stamped with each
    /// reading's `at_ns`.
    pub fn observe(&mut self, readings: &[GpuReading]) -> Vec<NodeEvent> {
        let mut events = Vec::new();
        for r in readings {
            let key = if r.uuid.is_empty() {
                format!("#{}", r.index)
            } else {
                r.uuid.clone()
            };
            match self.gpus.get_mut(&key) {
                Some(base) => compare(&self.config, base, r, &mut events),
                None => {
                    let hot = above(&self.config, r.temp_c);
                    let mut base = Baseline {
                        last: GpuReading::default(),
                        hot,
                    };
                    merge(&mut base.last, r);
                    self.gpus.insert(key, base);
                }
            }
        }
        events
    }
}

fn above(cfg: &ChangeConfig, temp: Option<u32>) -> bool {
    matches!((cfg.temp_threshold_c, temp), (Some(limit), Some(t)) if t > limit)
}

/// How much a counter rose; `None` when it did not, is unknown, or went down (a
/// driver reload resets volatile counters; the new value becomes the baseline).
fn rise(old: Option<u64>, new: Option<u64>) -> Option<u64> {
    match (old, new) {
        (Some(o), Some(n)) if n > o => Some(n - o),
        _ => None,
    }
}

fn became_true(old: Option<bool>, new: Option<bool>) -> bool {
    old == Some(false) && new == Some(true)
}

fn compare(cfg: &ChangeConfig, base: &mut Baseline, r: &GpuReading, out: &mut Vec<NodeEvent>) {
    let old = &base.last;
    let gpu = r.identity();
    let place = format!("GPU {} ({})", r.index, r.pci_bus_id);
    let mut emit = |kind, severity, count: u64, message: String| {
        let mut ev = gpu_event(Some(&gpu), kind, severity, r.at_ns, message);
        ev.count = u32::try_from(count).unwrap_or(u32::MAX);
        out.push(ev);
    };

    // Uncorrected ECC: the volatile counter where NVML has one, else the aggregate
    // one (both count the same errors; using both would report them twice).
    let unc = if r.ecc.uncorrected_volatile.is_some() || old.ecc.uncorrected_volatile.is_some() {
        rise(old.ecc.uncorrected_volatile, r.ecc.uncorrected_volatile)
    } else {
        rise(old.ecc.uncorrected_aggregate, r.ecc.uncorrected_aggregate)
    };
    if let Some(d) = unc {
        emit(
            NodeEventKind::Ecc,
            EventSeverity::Error,
            d,
            format!("NVML: {d} new uncorrected ECC error(s) on {place}"),
        );
    }
    if let Some(d) = rise(old.retired_pages.single_bit, r.retired_pages.single_bit) {
        emit(
            NodeEventKind::Ecc,
            EventSeverity::Warning,
            d,
            format!("NVML: {d} page(s) retired after single-bit ECC errors on {place}"),
        );
    }
    if let Some(d) = rise(old.retired_pages.double_bit, r.retired_pages.double_bit) {
        emit(
            NodeEventKind::Ecc,
            EventSeverity::Error,
            d,
            format!("NVML: {d} page(s) retired after double-bit ECC errors on {place}"),
        );
    }
    if became_true(old.retired_pages.pending, r.retired_pages.pending) {
        emit(
            NodeEventKind::Ecc,
            EventSeverity::Warning,
            1,
            format!("NVML: pages pending retirement on {place}; reset the GPU to retire them"),
        );
    }
    if became_true(old.remapped_rows.pending, r.remapped_rows.pending) {
        emit(
            NodeEventKind::Ecc,
            EventSeverity::Warning,
            1,
            format!("NVML: row remapping pending on {place}; reset the GPU to apply it"),
        );
    }
    if became_true(old.remapped_rows.failure, r.remapped_rows.failure) {
        emit(
            NodeEventKind::Ecc,
            EventSeverity::Fatal,
            1,
            format!("NVML: row remapping failed on {place}; the GPU needs service"),
        );
    }
    if let Some(d) = rise(old.pcie_replays, r.pcie_replays) {
        emit(
            NodeEventKind::Pcie,
            EventSeverity::Warning,
            d,
            format!("NVML: {d} PCIe replay(s) on {place}"),
        );
    }
    let links = [
        (old.nvlink.crc_flit, r.nvlink.crc_flit, "CRC flit"),
        (old.nvlink.crc_data, r.nvlink.crc_data, "CRC data"),
        (old.nvlink.replay, r.nvlink.replay, "replay"),
        (old.nvlink.recovery, r.nvlink.recovery, "recovery"),
    ];
    for (o, n, what) in links {
        if let Some(d) = rise(o, n) {
            emit(
                NodeEventKind::Nvlink,
                EventSeverity::Warning,
                d,
                format!("NVML: {d} NVLink {what} error(s) on {place}"),
            );
        }
    }
    if let (Some(o), Some(n)) = (old.throttle_reasons, r.throttle_reasons) {
        let temp = r.temp_c.or(old.temp_c);
        let at = temp.map(|t| format!(" at {t} °C")).unwrap_or_default();
        for (bit, label) in throttle::REASONS {
            if bit & throttle::THERMAL & n & !o != 0 {
                emit(
                    NodeEventKind::Thermal,
                    EventSeverity::Warning,
                    1,
                    format!("NVML: clocks throttled ({label}) on {place}{at}"),
                );
            }
        }
    }
    if let (Some(limit), Some(t)) = (cfg.temp_threshold_c, r.temp_c) {
        if t > limit && !base.hot {
            base.hot = true;
            emit(
                NodeEventKind::Thermal,
                EventSeverity::Warning,
                1,
                format!("NVML: {place} at {t} °C, above {limit} °C"),
            );
        } else if t <= limit.saturating_sub(cfg.temp_hysteresis_c) {
            base.hot = false;
        }
    }
    merge(&mut base.last, r);
}

/// Take every reading `r` has into `last`, keeping the old value where `r` has none.
fn merge(last: &mut GpuReading, r: &GpuReading) {
    fn keep<T: Copy>(old: &mut Option<T>, new: Option<T>) {
        if new.is_some() {
            *old = new;
        }
    }
    let GpuIdentity {
        index,
        uuid,
        pci_bus_id,
        name,
    } = r.identity();
    (last.index, last.uuid, last.pci_bus_id, last.name) = (index, uuid, pci_bus_id, name);
    last.at_ns = r.at_ns;
    keep(&mut last.util_gpu_pct, r.util_gpu_pct);
    keep(&mut last.util_mem_pct, r.util_mem_pct);
    keep(&mut last.mem_used_bytes, r.mem_used_bytes);
    keep(&mut last.mem_free_bytes, r.mem_free_bytes);
    keep(&mut last.mem_total_bytes, r.mem_total_bytes);
    keep(&mut last.temp_c, r.temp_c);
    keep(&mut last.power_w, r.power_w);
    keep(&mut last.sm_clock_mhz, r.sm_clock_mhz);
    keep(&mut last.mem_clock_mhz, r.mem_clock_mhz);
    keep(&mut last.throttle_reasons, r.throttle_reasons);
    keep(&mut last.ecc.corrected_volatile, r.ecc.corrected_volatile);
    keep(
        &mut last.ecc.uncorrected_volatile,
        r.ecc.uncorrected_volatile,
    );
    keep(&mut last.ecc.corrected_aggregate, r.ecc.corrected_aggregate);
    keep(
        &mut last.ecc.uncorrected_aggregate,
        r.ecc.uncorrected_aggregate,
    );
    keep(
        &mut last.retired_pages.single_bit,
        r.retired_pages.single_bit,
    );
    keep(
        &mut last.retired_pages.double_bit,
        r.retired_pages.double_bit,
    );
    keep(&mut last.retired_pages.pending, r.retired_pages.pending);
    keep(
        &mut last.remapped_rows.correctable,
        r.remapped_rows.correctable,
    );
    keep(
        &mut last.remapped_rows.uncorrectable,
        r.remapped_rows.uncorrectable,
    );
    keep(&mut last.remapped_rows.pending, r.remapped_rows.pending);
    keep(&mut last.remapped_rows.failure, r.remapped_rows.failure);
    keep(&mut last.pcie_replays, r.pcie_replays);
    keep(&mut last.pcie_link_gen, r.pcie_link_gen);
    keep(&mut last.pcie_link_width, r.pcie_link_width);
    keep(&mut last.nvlink.crc_flit, r.nvlink.crc_flit);
    keep(&mut last.nvlink.crc_data, r.nvlink.crc_data);
    keep(&mut last.nvlink.replay, r.nvlink.replay);
    keep(&mut last.nvlink.recovery, r.nvlink.recovery);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvml::{GpuSource, StaticSource};

    fn gpu(index: u32) -> GpuIdentity {
        GpuIdentity {
            index,
            uuid: format!("GPU-{index}"),
            pci_bus_id: format!("0000:{:02x}:00", 0x18 + index),
            name: "NVIDIA H100 80GB HBM3".to_owned(),
        }
    }

    /// A GPU with every counter at 0, cool, not throttled.
    fn healthy(index: u32) -> GpuReading {
        let mut r = GpuReading::new(&gpu(index), 0);
        r.temp_c = Some(60);
        r.throttle_reasons = Some(0);
        r.ecc.uncorrected_volatile = Some(0);
        r.ecc.uncorrected_aggregate = Some(0);
        r.retired_pages.single_bit = Some(0);
        r.retired_pages.double_bit = Some(0);
        r.retired_pages.pending = Some(false);
        r.remapped_rows.pending = Some(false);
        r.remapped_rows.failure = Some(false);
        r.pcie_replays = Some(0);
        r.nvlink = crate::nvml::NvlinkErrors {
            crc_flit: Some(0),
            crc_data: Some(0),
            replay: Some(0),
            recovery: Some(0),
        };
        r
    }

    /// (kind, severity, gpu index, count) of each event.
    type Seen = Vec<(NodeEventKind, EventSeverity, Option<u32>, u32)>;

    fn summary(events: &[NodeEvent]) -> Seen {
        events
            .iter()
            .map(|e| {
                (
                    NodeEventKind::from_wire(e.kind),
                    EventSeverity::from_wire(e.severity),
                    e.gpu_index,
                    e.count,
                )
            })
            .collect()
    }

    /// Sample GPU 3 from a [`StaticSource`]: first healthy (the baseline), then after
    /// `change`; return the events of the second sample.
    fn check(change: impl Fn(&mut GpuReading), expect: Seen) {
        let mut src = StaticSource::from_readings(vec![healthy(0), healthy(3)]);
        let mut det = ChangeDetector::new(ChangeConfig::default());
        let first = src.sample(1).expect("static sample");
        assert!(det.observe(&first).is_empty(), "baseline must be silent");
        change(&mut src.readings_mut()[1]);
        let second = src.sample(2).expect("static sample");
        let events = det.observe(&second);
        assert_eq!(summary(&events), expect);
        for e in &events {
            assert_eq!((e.at_ns, e.pci_bus_id.as_str()), (2, "0000:1b:00"), "{e:?}");
            assert!(e.message.contains("GPU 3"), "{}", e.message);
        }
    }

    use EventSeverity::{Error, Fatal, Warning};
    use NodeEventKind::{Ecc, Nvlink, Pcie, Thermal};

    #[test]
    fn uncorrected_ecc_rise_is_an_error_counting_the_delta() {
        check(
            |r| {
                r.ecc.uncorrected_volatile = Some(4);
                r.ecc.uncorrected_aggregate = Some(4);
            },
            vec![(Ecc, Error, Some(3), 4)],
        );
    }

    #[test]
    fn aggregate_ecc_counts_only_without_a_volatile_counter() {
        let mut a = healthy(0);
        a.ecc.uncorrected_volatile = None;
        let mut det = ChangeDetector::new(ChangeConfig::default());
        assert!(det.observe(std::slice::from_ref(&a)).is_empty());
        a.ecc.uncorrected_aggregate = Some(2);
        assert_eq!(
            summary(&det.observe(std::slice::from_ref(&a))),
            vec![(Ecc, Error, Some(0), 2)]
        );
    }

    #[test]
    fn memory_repair_changes() {
        check(
            |r| r.retired_pages.double_bit = Some(1),
            vec![(Ecc, Error, Some(3), 1)],
        );
        check(
            |r| r.retired_pages.single_bit = Some(2),
            vec![(Ecc, Warning, Some(3), 2)],
        );
        check(
            |r| r.retired_pages.pending = Some(true),
            vec![(Ecc, Warning, Some(3), 1)],
        );
        check(
            |r| r.remapped_rows.pending = Some(true),
            vec![(Ecc, Warning, Some(3), 1)],
        );
        check(
            |r| r.remapped_rows.failure = Some(true),
            vec![(Ecc, Fatal, Some(3), 1)],
        );
    }

    #[test]
    fn link_errors() {
        check(
            |r| r.pcie_replays = Some(17),
            vec![(Pcie, Warning, Some(3), 17)],
        );
        check(
            |r| {
                r.nvlink.crc_flit = Some(5);
                r.nvlink.recovery = Some(1);
            },
            vec![(Nvlink, Warning, Some(3), 5), (Nvlink, Warning, Some(3), 1)],
        );
    }

    #[test]
    fn thermal_throttling_onset_and_temperature_crossing() {
        check(
            |r| r.throttle_reasons = Some(throttle::HW_THERMAL_SLOWDOWN | throttle::GPU_IDLE),
            vec![(Thermal, Warning, Some(3), 1)],
        );
        // A power cap is not thermal.
        check(
            |r| r.throttle_reasons = Some(throttle::SW_POWER_CAP),
            vec![],
        );
        check(
            |r| r.temp_c = Some(86),
            vec![(Thermal, Warning, Some(3), 1)],
        );
        check(|r| r.temp_c = Some(85), vec![]);
    }

    #[test]
    fn temperature_crossing_is_reported_once_until_the_gpu_cools() {
        let mut r = healthy(0);
        let mut det = ChangeDetector::new(ChangeConfig::default());
        let mut temps = Vec::new();
        for t in [60, 90, 91, 84, 86, 79, 88] {
            r.temp_c = Some(t);
            if !det.observe(std::slice::from_ref(&r)).is_empty() {
                temps.push(t);
            }
        }
        assert_eq!(temps, vec![90, 88]);
        let mut off = ChangeDetector::new(ChangeConfig {
            temp_threshold_c: None,
            ..ChangeConfig::default()
        });
        for t in [60, 99] {
            r.temp_c = Some(t);
            assert!(off.observe(std::slice::from_ref(&r)).is_empty());
        }
    }

    #[test]
    fn unchanged_or_falling_counters_are_silent() {
        check(|_| {}, vec![]);
        // A driver reload resets volatile counters: a fall is a new baseline...
        let mut r = healthy(0);
        r.ecc.uncorrected_volatile = Some(5);
        let mut det = ChangeDetector::new(ChangeConfig::default());
        assert!(det.observe(std::slice::from_ref(&r)).is_empty());
        r.ecc.uncorrected_volatile = Some(0);
        assert!(det.observe(std::slice::from_ref(&r)).is_empty());
        // ...from which the next rise counts.
        r.ecc.uncorrected_volatile = Some(1);
        assert_eq!(
            summary(&det.observe(std::slice::from_ref(&r))),
            vec![(Ecc, Error, Some(0), 1)]
        );
    }

    #[test]
    fn a_reading_missing_for_a_while_keeps_its_baseline() {
        let mut r = healthy(0);
        let mut det = ChangeDetector::new(ChangeConfig::default());
        det.observe(std::slice::from_ref(&r));
        r.pcie_replays = None;
        assert!(det.observe(std::slice::from_ref(&r)).is_empty());
        r.pcie_replays = Some(3);
        assert_eq!(
            summary(&det.observe(std::slice::from_ref(&r))),
            vec![(Pcie, Warning, Some(0), 3)]
        );
        // A reading first seen late only sets its baseline.
        r.retired_pages.single_bit = None;
        let mut late = ChangeDetector::new(ChangeConfig::default());
        late.observe(std::slice::from_ref(&r));
        r.retired_pages.single_bit = Some(7);
        assert!(late.observe(std::slice::from_ref(&r)).is_empty());
    }

    #[test]
    fn each_gpu_has_its_own_baseline() {
        let mut det = ChangeDetector::new(ChangeConfig::default());
        let a = healthy(0);
        let mut b = healthy(1);
        det.observe(std::slice::from_ref(&a));
        // GPU 1 first seen with a high count: its baseline, no event.
        b.pcie_replays = Some(10);
        assert!(det.observe(&[a.clone(), b.clone()]).is_empty());
        b.pcie_replays = Some(11);
        assert_eq!(
            summary(&det.observe(&[a, b])),
            vec![(Pcie, Warning, Some(1), 1)]
        );
    }
}
