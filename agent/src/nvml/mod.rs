//! GPU telemetry from NVML: one [`GpuReading`] per GPU per sample, hardware events
//! (XIDs, ECC) as wire [`NodeEvent`]s, and a [`ChangeDetector`] that turns counter
//! jumps between samples into events.
//!
//! The outside world sits behind [`GpuSource`]: [`NvmlSource`] is the real one (NVML
//! through nvml-wrapper, which loads `libnvidia-ml.so.1` at run time), [`StaticSource`]
//! the in-memory one for tests. A reading NVML does not support, or whose entry point
//! the installed driver lacks, is `None`, never 0, and never fails the whole sample.
//!
//! A collector loop, as the agent runtime runs it:
//!
//! ```no_run
//! use warden_agent::nvml::{ChangeConfig, ChangeDetector, GpuSource, NvmlConfig, NvmlSource};
//!
//! # fn now_ns() -> i64 { 0 }
//! let mut source = NvmlSource::open(NvmlConfig::default())?;
//! let mut changes = ChangeDetector::new(ChangeConfig::default());
//! loop {
//!     let at_ns = now_ns();
//!     if let Ok(readings) = source.sample(at_ns) {
//!         let events = changes.observe(&readings);
//!         let samples: Vec<_> = readings.iter().map(warden_agent::nvml::to_wire).collect();
//!         # let _ = (events, samples);
//!     }
//!     // Waits up to a second for XID and ECC events: the loop's 1 Hz tick.
//!     let events = source.poll_events(1000, now_ns());
//!     # let _ = events; break;
//! }
//! # Ok::<(), warden_agent::nvml::NvmlSourceError>(())
//! ```

mod changes;
mod real;

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use warden_model::wire::{EventSeverity, GpuSample, NodeEvent, NodeEventKind};

use crate::xid::XidCatalog;

pub use changes::{ChangeConfig, ChangeDetector};
pub use real::{DEFAULT_LIB, NvmlConfig, NvmlSource, NvmlSourceError};

/// What identifies one GPU on the node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct GpuIdentity {
    /// NVML's index of the GPU (the `nvidia-smi` index).
    pub index: u32,
    /// The GPU's UUID (`GPU-...`); empty if NVML could not say.
    pub uuid: String,
    /// PCI address, normalised by [`crate::pci::normalize`] (`0000:3b:00`); empty if
    /// NVML could not say.
    pub pci_bus_id: String,
    /// Product name (`NVIDIA H100 80GB HBM3`); empty if NVML could not say.
    pub name: String,
}

/// ECC error counts as NVML reports them (all memory locations together).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EccCounts {
    /// Corrected (single-bit) errors since the driver loaded.
    pub corrected_volatile: Option<u64>,
    /// Uncorrected (double-bit) errors since the driver loaded.
    pub uncorrected_volatile: Option<u64>,
    /// Corrected errors over the GPU's lifetime.
    pub corrected_aggregate: Option<u64>,
    /// Uncorrected errors over the GPU's lifetime.
    pub uncorrected_aggregate: Option<u64>,
}

/// Pages retired by dynamic page retirement (GPUs before Ampere; row remapping
/// replaces it on A100 and newer, where NVML reports it unsupported).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetiredPages {
    /// Pages retired after multiple single-bit errors.
    pub single_bit: Option<u64>,
    /// Pages retired after a double-bit error.
    pub double_bit: Option<u64>,
    /// Whether pages wait for a reboot or GPU reset to be retired.
    pub pending: Option<bool>,
}

/// Row remapping (A100 and newer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemappedRows {
    /// Rows remapped after correctable errors.
    pub correctable: Option<u64>,
    /// Rows remapped after uncorrectable errors.
    pub uncorrectable: Option<u64>,
    /// Whether a remapping waits for a GPU reset.
    pub pending: Option<bool>,
    /// Whether a remapping failed (the GPU needs service).
    pub failure: Option<bool>,
}

/// NVLink error counters, summed over the GPU's links by NVML.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvlinkErrors {
    /// Flow-control CRC errors.
    pub crc_flit: Option<u64>,
    /// Data CRC errors.
    pub crc_data: Option<u64>,
    /// Replay errors.
    pub replay: Option<u64>,
    /// Recovery errors.
    pub recovery: Option<u64>,
}

/// Profiling readings from NVML's GPU Performance Monitoring (GPM: Hopper and newer),
/// each over the interval since the previous sample; the counterparts of DCGM's
/// `DCGM_FI_PROF_*` fields. Activities are ratios from 0 to 1, as DCGM reports them
/// (GPM gives percentages).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Profiling {
    /// Graphics or compute engine busy (`DCGM_FI_PROF_GR_ENGINE_ACTIVE`).
    pub graphics_active: Option<f64>,
    /// SMs with at least one warp resident (`DCGM_FI_PROF_SM_ACTIVE`).
    pub sm_active: Option<f64>,
    /// Warps resident over the most the SMs hold (`DCGM_FI_PROF_SM_OCCUPANCY`).
    pub sm_occupancy: Option<f64>,
    /// Any tensor pipe busy (`DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`).
    pub tensor_active: Option<f64>,
    /// Device memory interface busy (`DCGM_FI_PROF_DRAM_ACTIVE`).
    pub dram_active: Option<f64>,
    /// FP64 pipe busy (`DCGM_FI_PROF_PIPE_FP64_ACTIVE`).
    pub fp64_active: Option<f64>,
    /// FP32 pipe busy (`DCGM_FI_PROF_PIPE_FP32_ACTIVE`).
    pub fp32_active: Option<f64>,
    /// FP16 pipe busy (`DCGM_FI_PROF_PIPE_FP16_ACTIVE`).
    pub fp16_active: Option<f64>,
    /// PCIe bytes per second sent by the GPU (`DCGM_FI_PROF_PCIE_TX_BYTES`).
    pub pcie_tx_bytes_per_s: Option<f64>,
    /// PCIe bytes per second received (`DCGM_FI_PROF_PCIE_RX_BYTES`).
    pub pcie_rx_bytes_per_s: Option<f64>,
    /// NVLink bytes per second sent, all links (`DCGM_FI_PROF_NVLINK_TX_BYTES`).
    pub nvlink_tx_bytes_per_s: Option<f64>,
    /// NVLink bytes per second received, all links (`DCGM_FI_PROF_NVLINK_RX_BYTES`).
    pub nvlink_rx_bytes_per_s: Option<f64>,
}

/// One sample of one GPU. Every reading is `None` where NVML does not support it, the
/// driver lacks its entry point, or the call failed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuReading {
    /// NVML's index of the GPU.
    pub index: u32,
    /// The GPU's UUID.
    pub uuid: String,
    /// PCI address, normalised (`0000:3b:00`).
    pub pci_bus_id: String,
    /// Product name.
    pub name: String,
    /// When the sample was taken (agent clock, ns since the Unix epoch).
    pub at_ns: i64,
    /// Percent of the last sample period in which a kernel ran.
    pub util_gpu_pct: Option<u32>,
    /// Percent of the last sample period in which device memory was read or written.
    pub util_mem_pct: Option<u32>,
    /// Device memory in use, bytes.
    pub mem_used_bytes: Option<u64>,
    /// Device memory free, bytes.
    pub mem_free_bytes: Option<u64>,
    /// Device memory in all, bytes.
    pub mem_total_bytes: Option<u64>,
    /// GPU die temperature, degrees Celsius.
    pub temp_c: Option<u32>,
    /// Power draw, watts.
    pub power_w: Option<f64>,
    /// SM clock, MHz.
    pub sm_clock_mhz: Option<u32>,
    /// Memory clock, MHz.
    pub mem_clock_mhz: Option<u32>,
    /// Why clocks are held down: NVML's bit mask (see [`throttle`]).
    pub throttle_reasons: Option<u64>,
    /// ECC error counters.
    pub ecc: EccCounts,
    /// Retired pages.
    pub retired_pages: RetiredPages,
    /// Remapped rows.
    pub remapped_rows: RemappedRows,
    /// PCIe replay counter.
    pub pcie_replays: Option<u64>,
    /// Current PCIe link generation.
    pub pcie_link_gen: Option<u32>,
    /// Current PCIe link width, lanes.
    pub pcie_link_width: Option<u32>,
    /// NVLink error counters.
    pub nvlink: NvlinkErrors,
    /// GPM profiling readings (none before a GPU's second sample, or without GPM).
    pub profiling: Profiling,
}

impl GpuReading {
    /// A reading of `gpu` at `at_ns` with nothing measured yet.
    pub fn new(gpu: &GpuIdentity, at_ns: i64) -> Self {
        GpuReading {
            index: gpu.index,
            uuid: gpu.uuid.clone(),
            pci_bus_id: gpu.pci_bus_id.clone(),
            name: gpu.name.clone(),
            at_ns,
            ..GpuReading::default()
        }
    }

    /// The GPU this reading is about.
    pub fn identity(&self) -> GpuIdentity {
        GpuIdentity {
            index: self.index,
            uuid: self.uuid.clone(),
            pci_bus_id: self.pci_bus_id.clone(),
            name: self.name.clone(),
        }
    }
}

/// NVML's clock throttle reasons (`nvmlClocksThrottleReason*`, also called clock
/// event reasons), as bits of [`GpuReading::throttle_reasons`].
pub mod throttle {
    /// Nothing runs on the GPU.
    pub const GPU_IDLE: u64 = 0x1;
    /// Clocks limited by the application clock setting.
    pub const APPLICATIONS_CLOCKS_SETTING: u64 = 0x2;
    /// Software power cap.
    pub const SW_POWER_CAP: u64 = 0x4;
    /// Hardware slowdown (temperature, power brake or power supply).
    pub const HW_SLOWDOWN: u64 = 0x8;
    /// Sync boost.
    pub const SYNC_BOOST: u64 = 0x10;
    /// Software thermal slowdown.
    pub const SW_THERMAL_SLOWDOWN: u64 = 0x20;
    /// Hardware thermal slowdown.
    pub const HW_THERMAL_SLOWDOWN: u64 = 0x40;
    /// Hardware power brake (external power brake assertion).
    pub const HW_POWER_BRAKE_SLOWDOWN: u64 = 0x80;
    /// Clocks limited by the display clock setting.
    pub const DISPLAY_CLOCK_SETTING: u64 = 0x100;

    /// Every reason with its metric label, in bit order.
    pub const REASONS: [(u64, &str); 9] = [
        (GPU_IDLE, "gpu_idle"),
        (APPLICATIONS_CLOCKS_SETTING, "applications_clocks_setting"),
        (SW_POWER_CAP, "sw_power_cap"),
        (HW_SLOWDOWN, "hw_slowdown"),
        (SYNC_BOOST, "sync_boost"),
        (SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
        (HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
        (HW_POWER_BRAKE_SLOWDOWN, "hw_power_brake_slowdown"),
        (DISPLAY_CLOCK_SETTING, "display_clock_setting"),
    ];

    /// The reasons that mean the GPU is too hot.
    pub const THERMAL: u64 = SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN;
}

/// Why a [`GpuSource`] call returned no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuSourceError {
    /// The previous call has not come back from NVML yet (a hung driver); this call
    /// was not started.
    #[error("the previous NVML call has not returned yet")]
    Busy,
    /// NVML did not answer in time; the call goes on in the background.
    #[error("NVML did not answer within {0:?}")]
    Timeout(Duration),
    /// The source's worker is gone; the source must be opened again.
    #[error("the NVML worker has stopped")]
    Stopped,
}

/// Where GPU readings and events come from.
///
/// Calls block the caller (up to the source's own time limits); run them on a thread
/// that may block, e.g. `tokio::task::spawn_blocking`.
pub trait GpuSource: Send {
    /// The GPUs found when the source was opened, in index order.
    fn inventory(&self) -> &[GpuIdentity];

    /// Read every GPU now; `at_ns` stamps the readings. A GPU that cannot be reached
    /// at all (lost, fallen off the bus) is left out of the result.
    fn sample(&mut self, at_ns: i64) -> Result<Vec<GpuReading>, GpuSourceError>;

    /// Hardware events (XIDs, ECC) that arrived since the last call, waiting up to
    /// `timeout_ms` for the first one. `at_ns` is the agent clock when the call starts.
    fn poll_events(
        &mut self,
        timeout_ms: u32,
        at_ns: i64,
    ) -> Result<Vec<NodeEvent>, GpuSourceError>;
}

/// The wire form of a reading. The wire sample has no "unknown": a reading that is
/// `None` is sent as 0 (the full reading stays in the agent's metrics).
pub fn to_wire(r: &GpuReading) -> GpuSample {
    GpuSample {
        index: r.index,
        uuid: r.uuid.clone(),
        at_ns: r.at_ns,
        util_pct: r.util_gpu_pct.unwrap_or(0) as f32,
        mem_used_bytes: r.mem_used_bytes.unwrap_or(0),
        temp_c: r.temp_c.unwrap_or(0) as f32,
        power_w: r.power_w.unwrap_or(0.0) as f32,
        throttle_reasons: r.throttle_reasons.unwrap_or(0),
        ecc_uncorrected: r
            .ecc
            .uncorrected_volatile
            .or(r.ecc.uncorrected_aggregate)
            .unwrap_or(0),
    }
}

/// PCI address → GPU index, for [`crate::dedup::Deduper::with_gpu_map`].
pub fn pci_index_map(gpus: &[GpuIdentity]) -> HashMap<String, u32> {
    gpus.iter()
        .filter(|g| !g.pci_bus_id.is_empty())
        .map(|g| (g.pci_bus_id.clone(), g.index))
        .collect()
}

/// A node event about `gpu` (or no GPU in particular), seen at `at_ns`. Its id is 0:
/// the agent numbers events per boot when it ships them.
pub fn gpu_event(
    gpu: Option<&GpuIdentity>,
    kind: NodeEventKind,
    severity: EventSeverity,
    at_ns: i64,
    message: String,
) -> NodeEvent {
    NodeEvent {
        id: 0,
        at_ns,
        kind: kind as i32,
        severity: severity as i32,
        gpu_index: gpu.map(|g| g.index),
        pci_bus_id: gpu.map(|g| g.pci_bus_id.clone()).unwrap_or_default(),
        code: None,
        message,
        count: 1,
    }
}

/// The event for XID `code` on `gpu`, with the severity the built-in catalog gives it.
pub fn xid_event(gpu: Option<&GpuIdentity>, code: u32, at_ns: i64) -> NodeEvent {
    let catalog = XidCatalog::builtin();
    let what = catalog
        .get(code)
        .map_or("not in the catalog", |i| i.name.as_str());
    let place = match gpu {
        Some(g) => format!("GPU {} ({})", g.index, g.pci_bus_id),
        None => "an unknown GPU".to_owned(),
    };
    let mut ev = gpu_event(
        gpu,
        NodeEventKind::Xid,
        catalog.severity(code),
        at_ns,
        format!("NVML: XID {code} ({what}) on {place}"),
    );
    ev.code = Some(code);
    ev
}

/// An in-memory [`GpuSource`]: returns the readings and events it was given.
#[derive(Debug, Clone, Default)]
pub struct StaticSource {
    gpus: Vec<GpuIdentity>,
    readings: Vec<GpuReading>,
    events: VecDeque<NodeEvent>,
    fail_next: Option<GpuSourceError>,
}

impl StaticSource {
    /// A source for `gpus`, each reading nothing until [`StaticSource::set_readings`].
    pub fn new(gpus: Vec<GpuIdentity>) -> Self {
        let readings = gpus.iter().map(|g| GpuReading::new(g, 0)).collect();
        StaticSource {
            gpus,
            readings,
            ..StaticSource::default()
        }
    }

    /// A source whose inventory is the GPUs of `readings`.
    pub fn from_readings(readings: Vec<GpuReading>) -> Self {
        StaticSource {
            gpus: readings.iter().map(GpuReading::identity).collect(),
            readings,
            ..StaticSource::default()
        }
    }

    /// What the next samples return (their `at_ns` is set by [`GpuSource::sample`]).
    pub fn set_readings(&mut self, readings: Vec<GpuReading>) {
        self.readings = readings;
    }

    /// The readings, to change in place.
    pub fn readings_mut(&mut self) -> &mut Vec<GpuReading> {
        &mut self.readings
    }

    /// Queue an event for the next [`GpuSource::poll_events`].
    pub fn push_event(&mut self, event: NodeEvent) {
        self.events.push_back(event);
    }

    /// Make the next call (sample or poll) fail with `err`.
    pub fn fail_next(&mut self, err: GpuSourceError) {
        self.fail_next = Some(err);
    }
}

impl GpuSource for StaticSource {
    fn inventory(&self) -> &[GpuIdentity] {
        &self.gpus
    }

    fn sample(&mut self, at_ns: i64) -> Result<Vec<GpuReading>, GpuSourceError> {
        if let Some(e) = self.fail_next.take() {
            return Err(e);
        }
        Ok(self
            .readings
            .iter()
            .map(|r| GpuReading { at_ns, ..r.clone() })
            .collect())
    }

    fn poll_events(
        &mut self,
        _timeout_ms: u32,
        _at_ns: i64,
    ) -> Result<Vec<NodeEvent>, GpuSourceError> {
        if let Some(e) = self.fail_next.take() {
            return Err(e);
        }
        Ok(self.events.drain(..).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32) -> GpuIdentity {
        GpuIdentity {
            index,
            uuid: format!("GPU-{index}"),
            pci_bus_id: format!("0000:{:02x}:00", 0x18 + index),
            name: "NVIDIA H100 80GB HBM3".to_owned(),
        }
    }

    #[test]
    fn wire_sample_carries_the_reading_and_zero_for_unknown() {
        let mut r = GpuReading::new(&gpu(2), 42);
        r.util_gpu_pct = Some(97);
        r.mem_used_bytes = Some(1 << 30);
        r.temp_c = Some(71);
        r.throttle_reasons = Some(throttle::SW_POWER_CAP);
        r.ecc.uncorrected_aggregate = Some(3);
        let w = to_wire(&r);
        assert_eq!(
            (w.index, w.uuid.as_str(), w.at_ns, w.util_pct, w.temp_c),
            (2, "GPU-2", 42, 97.0, 71.0)
        );
        assert_eq!(w.mem_used_bytes, 1 << 30);
        assert_eq!(w.throttle_reasons, throttle::SW_POWER_CAP);
        // No volatile count: the aggregate one stands in.
        assert_eq!(w.ecc_uncorrected, 3);
        assert_eq!(w.power_w, 0.0);
        r.ecc.uncorrected_volatile = Some(1);
        assert_eq!(to_wire(&r).ecc_uncorrected, 1);
    }

    #[test]
    fn xid_events_take_severity_and_name_from_the_catalog() {
        let g = gpu(3);
        let ev = xid_event(Some(&g), 79, 7);
        assert_eq!(ev.kind, NodeEventKind::Xid as i32);
        assert_eq!(ev.severity, EventSeverity::Fatal as i32);
        assert_eq!(
            (
                ev.code,
                ev.gpu_index,
                ev.pci_bus_id.as_str(),
                ev.at_ns,
                ev.count
            ),
            (Some(79), Some(3), "0000:1b:00", 7, 1)
        );
        assert!(ev.message.contains("fallen off the bus"), "{}", ev.message);
        let unknown = xid_event(None, 9999, 0);
        assert_eq!(unknown.severity, EventSeverity::Warning as i32);
        assert_eq!((unknown.gpu_index, unknown.pci_bus_id.as_str()), (None, ""));
    }

    #[test]
    fn static_source_returns_what_it_was_given() {
        let mut s = StaticSource::new(vec![gpu(0), gpu(1)]);
        assert_eq!(s.inventory().len(), 2);
        s.readings_mut()[1].temp_c = Some(50);
        let got = s.sample(9).expect("static sample");
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(|r| r.at_ns == 9));
        assert_eq!((got[0].temp_c, got[1].temp_c), (None, Some(50)));
        s.push_event(xid_event(Some(&gpu(1)), 48, 9));
        assert_eq!(s.poll_events(0, 9).expect("static poll").len(), 1);
        assert!(s.poll_events(0, 9).expect("static poll").is_empty());
        s.fail_next(GpuSourceError::Busy);
        assert_eq!(s.sample(10), Err(GpuSourceError::Busy));
        assert!(s.sample(10).is_ok());
    }

    #[test]
    fn pci_map_feeds_the_kernel_log_deduper() {
        let map = pci_index_map(&[gpu(0), gpu(5), GpuIdentity::default()]);
        assert_eq!(map.len(), 2);
        assert_eq!(map.get("0000:1d:00"), Some(&5));
    }
}
