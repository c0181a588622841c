//! Prometheus metrics for NVML readings: Warden's `warden_gpu_*` series and, when
//! asked, the `DCGM_FI_DEV_*` names of NVIDIA's dcgm-exporter, for dashboards built
//! on them (docs/METRICS.md says which panels of Grafana 12239 have data). A reading
//! NVML does not give has no series; a GPU that disappears has all its series removed.
//! docs/METRICS.md lists every metric.

use std::sync::{Mutex, PoisonError};

use prometheus::{Gauge, GaugeVec, Opts, Registry};
use warden_model::wire::{NodeEvent, NodeEventKind};

use crate::nvml::{GpuReading, Profiling, throttle};
use crate::pod_resources::{GpuPods, PodRef, SharedGpuPods};

/// Labels on every per-GPU `warden_gpu_*` series.
const GPU_LABELS: [&str; 3] = ["gpu", "uuid", "pci_bus_id"];
/// Labels on every `DCGM_FI_DEV_*` series, as dcgm-exporter names them.
const DCGM_LABELS: [&str; 6] = [
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
];

const MIB: f64 = 1024.0 * 1024.0;

/// What [`GpuMetrics`] exports besides Warden's own series.
#[derive(Debug, Clone, Default)]
pub struct GpuMetricsOptions {
    /// Also export dcgm-exporter's names (`DCGM_FI_DEV_*`) and labels.
    pub dcgm_compat: bool,
    /// The node's name, for dcgm-exporter's `Hostname` label.
    pub hostname: String,
    /// The GPU → container assignment from the kubelet: with it, every series carries
    /// `pod`, `namespace` and `container` labels.
    pub pods: Option<SharedGpuPods>,
}

/// The labels of the container a GPU is assigned to, as dcgm-exporter names them; on
/// every series when the kubelet's pod-resources API is read (empty when unassigned).
const POD_LABELS: [&str; 3] = ["pod", "namespace", "container"];

/// One GPU's label values.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Labels {
    gpu: String,
    uuid: String,
    pci_bus_id: String,
    name: String,
    /// The container it is assigned to; `None` when pod labels are off.
    pod: Option<PodRef>,
}

impl Labels {
    fn of(r: &GpuReading, pods: Option<&GpuPods>) -> Self {
        Labels {
            gpu: r.index.to_string(),
            uuid: r.uuid.clone(),
            pci_bus_id: r.pci_bus_id.clone(),
            name: r.name.clone(),
            pod: pods.map(|p| p.get(&r.uuid).cloned().unwrap_or_default()),
        }
    }

    /// The pod label values, in [`POD_LABELS`] order, when pod labels are on.
    fn pod_values(&self) -> Vec<&str> {
        self.pod
            .as_ref()
            .map(|p| vec![p.pod.as_str(), &p.namespace, &p.container])
            .unwrap_or_default()
    }

    fn base(&self) -> Vec<&str> {
        let mut v = vec![self.gpu.as_str(), &self.uuid, &self.pci_bus_id];
        v.extend(self.pod_values());
        v
    }

    fn with<'a>(&'a self, extra: &'a str) -> Vec<&'a str> {
        let mut v = self.base();
        v.push(extra);
        v
    }

    fn with2<'a>(&'a self, a: &'a str, b: &'a str) -> Vec<&'a str> {
        let mut v = self.base();
        v.extend([a, b]);
        v
    }
}

/// The label names of a vector: `first`, the pod labels when on, then `extra`.
fn label_names<'a>(first: &[&'a str], pod: bool, extra: &[&'a str]) -> Vec<&'a str> {
    let pod_labels: &[&str] = if pod { &POD_LABELS } else { &[] };
    first
        .iter()
        .chain(pod_labels)
        .chain(extra)
        .copied()
        .collect()
}

/// Set the series `labels` of `vec` to `v`, or remove it when `v` is `None`.
fn put(vec: &GaugeVec, labels: &[&str], v: Option<f64>) {
    match v {
        Some(v) => {
            // Fails only on a label count that does not match the vector's, which
            // the code here fixes.
            if let Ok(g) = vec.get_metric_with_label_values(labels) {
                g.set(v);
            }
        }
        None => {
            // Absent already is fine.
            let _ = vec.remove_label_values(labels);
        }
    }
}

fn num<T: Into<f64>>(v: Option<T>) -> Option<f64> {
    v.map(Into::into)
}

fn count(v: Option<u64>) -> Option<f64> {
    v.map(|v| v as f64)
}

fn flag(v: Option<bool>) -> Option<f64> {
    v.map(|b| if b { 1.0 } else { 0.0 })
}

fn new_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<GaugeVec, prometheus::Error> {
    let vec = GaugeVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(vec.clone()))?;
    Ok(vec)
}

/// One GPM reading of [`Profiling`].
type Pick = fn(&Profiling) -> Option<f64>;

/// The GPM readings: Warden's name and help, dcgm-exporter's name and help, the reading.
fn profiling_table() -> [(&'static str, &'static str, &'static str, &'static str, Pick); 12] {
    [
        (
            "warden_gpu_graphics_active_ratio",
            "Fraction of the interval the graphics or compute engine was busy (GPM).",
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "Ratio of time the graphics engine is active.",
            |p| p.graphics_active,
        ),
        (
            "warden_gpu_sm_active_ratio",
            "Fraction of the interval SMs had at least one warp resident (GPM).",
            "DCGM_FI_PROF_SM_ACTIVE",
            "The ratio of cycles an SM has at least 1 warp assigned.",
            |p| p.sm_active,
        ),
        (
            "warden_gpu_sm_occupancy_ratio",
            "Warps resident on the SMs over the most they hold (GPM).",
            "DCGM_FI_PROF_SM_OCCUPANCY",
            "The ratio of number of warps resident on an SM.",
            |p| p.sm_occupancy,
        ),
        (
            "warden_gpu_tensor_active_ratio",
            "Fraction of the interval any tensor pipe was busy (GPM).",
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "Ratio of cycles the tensor (HMMA) pipe is active.",
            |p| p.tensor_active,
        ),
        (
            "warden_gpu_dram_active_ratio",
            "Fraction of the interval the device memory interface was busy (GPM).",
            "DCGM_FI_PROF_DRAM_ACTIVE",
            "Ratio of cycles the device memory interface is active sending or receiving data.",
            |p| p.dram_active,
        ),
        (
            "warden_gpu_fp64_active_ratio",
            "Fraction of the interval the FP64 pipe was busy (GPM).",
            "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
            "Ratio of cycles the fp64 pipes are active.",
            |p| p.fp64_active,
        ),
        (
            "warden_gpu_fp32_active_ratio",
            "Fraction of the interval the FP32 pipe was busy (GPM).",
            "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
            "Ratio of cycles the fp32 pipes are active.",
            |p| p.fp32_active,
        ),
        (
            "warden_gpu_fp16_active_ratio",
            "Fraction of the interval the FP16 pipe was busy (GPM).",
            "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
            "Ratio of cycles the fp16 pipes are active.",
            |p| p.fp16_active,
        ),
        (
            "warden_gpu_pcie_tx_bytes_per_second",
            "PCIe bytes per second the GPU sent over the interval (GPM).",
            "DCGM_FI_PROF_PCIE_TX_BYTES",
            "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
            |p| p.pcie_tx_bytes_per_s,
        ),
        (
            "warden_gpu_pcie_rx_bytes_per_second",
            "PCIe bytes per second the GPU received over the interval (GPM).",
            "DCGM_FI_PROF_PCIE_RX_BYTES",
            "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
            |p| p.pcie_rx_bytes_per_s,
        ),
        (
            "warden_gpu_nvlink_tx_bytes_per_second",
            "NVLink bytes per second the GPU sent over the interval, all links (GPM).",
            "DCGM_FI_PROF_NVLINK_TX_BYTES",
            "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second.",
            |p| p.nvlink_tx_bytes_per_s,
        ),
        (
            "warden_gpu_nvlink_rx_bytes_per_second",
            "NVLink bytes per second the GPU received over the interval, all links (GPM).",
            "DCGM_FI_PROF_NVLINK_RX_BYTES",
            "The rate of data received over NVLink, not including protocol headers, in bytes per second.",
            |p| p.nvlink_rx_bytes_per_s,
        ),
    ]
}

#[derive(Debug)]
struct WardenSeries {
    /// GPM readings, by [`profiling_table`].
    profiling: Vec<(GaugeVec, Pick)>,
    info: GaugeVec,
    utilization: GaugeVec,
    memory_utilization: GaugeVec,
    memory_used: GaugeVec,
    memory_free: GaugeVec,
    memory_total: GaugeVec,
    temperature: GaugeVec,
    power: GaugeVec,
    sm_clock: GaugeVec,
    memory_clock: GaugeVec,
    throttle_reason: GaugeVec,
    ecc_errors: GaugeVec,
    retired_pages: GaugeVec,
    retired_pages_pending: GaugeVec,
    remapped_rows: GaugeVec,
    remapped_rows_pending: GaugeVec,
    remapped_rows_failure: GaugeVec,
    pcie_replays: GaugeVec,
    pcie_link_gen: GaugeVec,
    pcie_link_width: GaugeVec,
    nvlink_errors: GaugeVec,
}

impl WardenSeries {
    fn new(r: &Registry, pod: bool) -> Result<Self, prometheus::Error> {
        let g = |name, help| new_vec(r, name, help, &label_names(&GPU_LABELS, pod, &[]));
        let with = |name, help, extra: &[&str]| {
            new_vec(r, name, help, &label_names(&GPU_LABELS, pod, extra))
        };
        let profiling = profiling_table()
            .into_iter()
            .map(|(name, help, _, _, pick)| Ok((g(name, help)?, pick)))
            .collect::<Result<_, prometheus::Error>>()?;
        Ok(WardenSeries {
            profiling,
            info: with(
                "warden_gpu_info",
                "GPU present, with its product name (always 1).",
                &["name"],
            )?,
            utilization: g(
                "warden_gpu_utilization_ratio",
                "Fraction of the last sample period in which a kernel ran on the GPU.",
            )?,
            memory_utilization: g(
                "warden_gpu_memory_utilization_ratio",
                "Fraction of the last sample period in which device memory was read or written.",
            )?,
            memory_used: g("warden_gpu_memory_used_bytes", "Device memory in use.")?,
            memory_free: g("warden_gpu_memory_free_bytes", "Device memory free.")?,
            memory_total: g("warden_gpu_memory_total_bytes", "Device memory in all.")?,
            temperature: g("warden_gpu_temperature_celsius", "GPU die temperature.")?,
            power: g("warden_gpu_power_watts", "GPU power draw.")?,
            sm_clock: g("warden_gpu_sm_clock_hertz", "SM clock.")?,
            memory_clock: g("warden_gpu_memory_clock_hertz", "Memory clock.")?,
            throttle_reason: with(
                "warden_gpu_throttle_reason",
                "1 while NVML reports this clock throttle reason, else 0.",
                &["reason"],
            )?,
            ecc_errors: with(
                "warden_gpu_ecc_errors",
                "ECC errors as NVML counts them (volatile: since the driver loaded; aggregate: lifetime).",
                &["type", "scope"],
            )?,
            retired_pages: with(
                "warden_gpu_retired_pages",
                "Device memory pages retired, by cause (GPUs before Ampere).",
                &["cause"],
            )?,
            retired_pages_pending: g(
                "warden_gpu_retired_pages_pending",
                "1 while pages wait for a GPU reset to be retired.",
            )?,
            remapped_rows: with(
                "warden_gpu_remapped_rows",
                "Device memory rows remapped, by the error that caused it (Ampere and newer).",
                &["type"],
            )?,
            remapped_rows_pending: g(
                "warden_gpu_remapped_rows_pending",
                "1 while a row remapping waits for a GPU reset.",
            )?,
            remapped_rows_failure: g(
                "warden_gpu_remapped_rows_failure",
                "1 once a row remapping has failed (the GPU needs service).",
            )?,
            pcie_replays: g("warden_gpu_pcie_replays", "PCIe replay counter.")?,
            pcie_link_gen: g(
                "warden_gpu_pcie_link_generation",
                "Current PCIe link generation.",
            )?,
            pcie_link_width: g(
                "warden_gpu_pcie_link_width_lanes",
                "Current PCIe link width.",
            )?,
            nvlink_errors: with(
                "warden_gpu_nvlink_errors",
                "NVLink errors summed over the GPU's links, by counter.",
                &["counter"],
            )?,
        })
    }

    /// Set every series of `l` from `r`; `None` readings (or `r == None`, a GPU that
    /// went away) remove theirs.
    fn set(&self, l: &Labels, r: Option<&GpuReading>) {
        let b = l.base();
        let get = |f: fn(&GpuReading) -> Option<f64>| r.and_then(f);
        put(&self.info, &l.with(&l.name), r.map(|_| 1.0));
        put(
            &self.utilization,
            &b,
            get(|r| r.util_gpu_pct.map(|p| f64::from(p) / 100.0)),
        );
        put(
            &self.memory_utilization,
            &b,
            get(|r| r.util_mem_pct.map(|p| f64::from(p) / 100.0)),
        );
        put(&self.memory_used, &b, get(|r| count(r.mem_used_bytes)));
        put(&self.memory_free, &b, get(|r| count(r.mem_free_bytes)));
        put(&self.memory_total, &b, get(|r| count(r.mem_total_bytes)));
        put(&self.temperature, &b, get(|r| num(r.temp_c)));
        put(&self.power, &b, get(|r| r.power_w));
        put(
            &self.sm_clock,
            &b,
            get(|r| r.sm_clock_mhz.map(|c| f64::from(c) * 1e6)),
        );
        put(
            &self.memory_clock,
            &b,
            get(|r| r.mem_clock_mhz.map(|c| f64::from(c) * 1e6)),
        );
        let mask = r.and_then(|r| r.throttle_reasons);
        for (bit, reason) in throttle::REASONS {
            put(
                &self.throttle_reason,
                &l.with(reason),
                mask.map(|m| if m & bit != 0 { 1.0 } else { 0.0 }),
            );
        }
        let ecc = r.map(|r| r.ecc).unwrap_or_default();
        put(
            &self.ecc_errors,
            &l.with2("corrected", "volatile"),
            count(ecc.corrected_volatile),
        );
        put(
            &self.ecc_errors,
            &l.with2("uncorrected", "volatile"),
            count(ecc.uncorrected_volatile),
        );
        put(
            &self.ecc_errors,
            &l.with2("corrected", "aggregate"),
            count(ecc.corrected_aggregate),
        );
        put(
            &self.ecc_errors,
            &l.with2("uncorrected", "aggregate"),
            count(ecc.uncorrected_aggregate),
        );
        let pages = r.map(|r| r.retired_pages).unwrap_or_default();
        put(
            &self.retired_pages,
            &l.with("single_bit"),
            count(pages.single_bit),
        );
        put(
            &self.retired_pages,
            &l.with("double_bit"),
            count(pages.double_bit),
        );
        put(&self.retired_pages_pending, &b, flag(pages.pending));
        let rows = r.map(|r| r.remapped_rows).unwrap_or_default();
        put(
            &self.remapped_rows,
            &l.with("correctable"),
            count(rows.correctable),
        );
        put(
            &self.remapped_rows,
            &l.with("uncorrectable"),
            count(rows.uncorrectable),
        );
        put(&self.remapped_rows_pending, &b, flag(rows.pending));
        put(&self.remapped_rows_failure, &b, flag(rows.failure));
        put(&self.pcie_replays, &b, get(|r| count(r.pcie_replays)));
        put(&self.pcie_link_gen, &b, get(|r| num(r.pcie_link_gen)));
        put(&self.pcie_link_width, &b, get(|r| num(r.pcie_link_width)));
        let links = r.map(|r| r.nvlink).unwrap_or_default();
        put(
            &self.nvlink_errors,
            &l.with("crc_flit"),
            count(links.crc_flit),
        );
        put(
            &self.nvlink_errors,
            &l.with("crc_data"),
            count(links.crc_data),
        );
        put(&self.nvlink_errors, &l.with("replay"), count(links.replay));
        put(
            &self.nvlink_errors,
            &l.with("recovery"),
            count(links.recovery),
        );
        for (vec, pick) in &self.profiling {
            put(vec, &b, r.and_then(|r| pick(&r.profiling)));
        }
    }
}

#[derive(Debug)]
struct DcgmSeries {
    hostname: String,
    /// `DCGM_FI_PROF_*`, by [`profiling_table`].
    profiling: Vec<(GaugeVec, Pick)>,
    gpu_util: GaugeVec,
    fb_used: GaugeVec,
    fb_free: GaugeVec,
    gpu_temp: GaugeVec,
    power_usage: GaugeVec,
    sm_clock: GaugeVec,
    mem_clock: GaugeVec,
    ecc_sbe_vol: GaugeVec,
    ecc_dbe_vol: GaugeVec,
    ecc_sbe_agg: GaugeVec,
    ecc_dbe_agg: GaugeVec,
    retired_sbe: GaugeVec,
    retired_dbe: GaugeVec,
    pcie_replay: GaugeVec,
    nvlink_crc_flit: GaugeVec,
    xid_errors: GaugeVec,
}

impl DcgmSeries {
    fn new(r: &Registry, hostname: String, pod: bool) -> Result<Self, prometheus::Error> {
        let g = |name, help| new_vec(r, name, help, &label_names(&DCGM_LABELS, pod, &[]));
        let profiling = profiling_table()
            .into_iter()
            .map(|(_, _, name, help, pick)| Ok((g(name, help)?, pick)))
            .collect::<Result<_, prometheus::Error>>()?;
        Ok(DcgmSeries {
            hostname,
            profiling,
            gpu_util: g("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).")?,
            fb_used: g("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).")?,
            fb_free: g("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).")?,
            gpu_temp: g("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).")?,
            power_usage: g("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).")?,
            sm_clock: g("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).")?,
            mem_clock: g("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).")?,
            ecc_sbe_vol: g(
                "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                "Total number of single-bit volatile ECC errors.",
            )?,
            ecc_dbe_vol: g(
                "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                "Total number of double-bit volatile ECC errors.",
            )?,
            ecc_sbe_agg: g(
                "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
                "Total number of single-bit persistent ECC errors.",
            )?,
            ecc_dbe_agg: g(
                "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
                "Total number of double-bit persistent ECC errors.",
            )?,
            retired_sbe: g(
                "DCGM_FI_DEV_RETIRED_SBE",
                "Total number of retired pages due to single-bit errors.",
            )?,
            retired_dbe: g(
                "DCGM_FI_DEV_RETIRED_DBE",
                "Total number of retired pages due to double-bit errors.",
            )?,
            pcie_replay: g(
                "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
                "Total number of PCIe retries.",
            )?,
            nvlink_crc_flit: g(
                "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                "Total number of NVLink flow-control CRC errors.",
            )?,
            xid_errors: g(
                "DCGM_FI_DEV_XID_ERRORS",
                "Value of the last XID error encountered.",
            )?,
        })
    }

    fn labels<'a>(&'a self, l: &'a Labels, device: &'a str) -> Vec<&'a str> {
        let mut v = vec![
            l.gpu.as_str(),
            &l.uuid,
            &l.pci_bus_id,
            device,
            &l.name,
            &self.hostname,
        ];
        v.extend(l.pod_values());
        v
    }

    fn set(&self, l: &Labels, r: Option<&GpuReading>, first: bool) {
        let device = format!("nvidia{}", l.gpu);
        let d = self.labels(l, &device);
        let get = |f: fn(&GpuReading) -> Option<f64>| r.and_then(f);
        put(&self.gpu_util, &d, get(|r| num(r.util_gpu_pct)));
        put(
            &self.fb_used,
            &d,
            get(|r| r.mem_used_bytes.map(|b| (b as f64 / MIB).round())),
        );
        put(
            &self.fb_free,
            &d,
            get(|r| r.mem_free_bytes.map(|b| (b as f64 / MIB).round())),
        );
        put(&self.gpu_temp, &d, get(|r| num(r.temp_c)));
        put(&self.power_usage, &d, get(|r| r.power_w));
        put(&self.sm_clock, &d, get(|r| num(r.sm_clock_mhz)));
        put(&self.mem_clock, &d, get(|r| num(r.mem_clock_mhz)));
        put(
            &self.ecc_sbe_vol,
            &d,
            get(|r| count(r.ecc.corrected_volatile)),
        );
        put(
            &self.ecc_dbe_vol,
            &d,
            get(|r| count(r.ecc.uncorrected_volatile)),
        );
        put(
            &self.ecc_sbe_agg,
            &d,
            get(|r| count(r.ecc.corrected_aggregate)),
        );
        put(
            &self.ecc_dbe_agg,
            &d,
            get(|r| count(r.ecc.uncorrected_aggregate)),
        );
        put(
            &self.retired_sbe,
            &d,
            get(|r| count(r.retired_pages.single_bit)),
        );
        put(
            &self.retired_dbe,
            &d,
            get(|r| count(r.retired_pages.double_bit)),
        );
        put(&self.pcie_replay, &d, get(|r| count(r.pcie_replays)));
        put(&self.nvlink_crc_flit, &d, get(|r| count(r.nvlink.crc_flit)));
        for (vec, pick) in &self.profiling {
            put(vec, &d, r.and_then(|r| pick(&r.profiling)));
        }
        // dcgm-exporter shows 0 until the first XID.
        if r.is_none() {
            put(&self.xid_errors, &d, None);
        } else if first {
            put(&self.xid_errors, &d, Some(0.0));
        }
    }

    fn set_xid(&self, l: &Labels, code: u32) {
        let device = format!("nvidia{}", l.gpu);
        put(
            &self.xid_errors,
            &self.labels(l, &device),
            Some(f64::from(code)),
        );
    }
}

/// The GPU metrics of one agent.
#[derive(Debug)]
pub struct GpuMetrics {
    up: Gauge,
    warden: WardenSeries,
    dcgm: Option<DcgmSeries>,
    /// The GPUs of the last [`GpuMetrics::observe`].
    known: Mutex<Vec<Labels>>,
    /// The GPU → container assignment, when pod labels are on.
    pods: Option<SharedGpuPods>,
}

impl GpuMetrics {
    /// Register the metrics in `registry`; fails if a name is registered already.
    pub fn new(registry: &Registry, options: GpuMetricsOptions) -> Result<Self, prometheus::Error> {
        let up = Gauge::with_opts(Opts::new(
            "warden_gpu_collector_up",
            "1 while the NVML collector works, else 0.",
        ))?;
        registry.register(Box::new(up.clone()))?;
        let pod = options.pods.is_some();
        let warden = WardenSeries::new(registry, pod)?;
        let dcgm = if options.dcgm_compat {
            Some(DcgmSeries::new(registry, options.hostname, pod)?)
        } else {
            None
        };
        Ok(GpuMetrics {
            up,
            warden,
            dcgm,
            known: Mutex::new(Vec::new()),
            pods: options.pods,
        })
    }

    /// Whether the NVML collector works (`warden_gpu_collector_up`).
    pub fn set_collector_up(&self, up: bool) {
        self.up.set(if up { 1.0 } else { 0.0 });
    }

    /// Show `readings`, one per GPU; the series of GPUs not among them are removed, and
    /// so are those of a GPU whose container changed (they reappear under the new one).
    pub fn observe(&self, readings: &[GpuReading]) {
        let pods = self.pods.as_ref().map(crate::pod_resources::snapshot);
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        let now: Vec<Labels> = readings
            .iter()
            .map(|r| Labels::of(r, pods.as_ref()))
            .collect();
        for gone in known.iter().filter(|l| !now.contains(l)) {
            self.warden.set(gone, None);
            if let Some(d) = &self.dcgm {
                d.set(gone, None, false);
            }
        }
        for (l, r) in now.iter().zip(readings) {
            self.warden.set(l, Some(r));
            if let Some(d) = &self.dcgm {
                d.set(l, Some(r), !known.contains(l));
            }
        }
        *known = now;
    }

    /// With dcgm-exporter names on, show an XID event in `DCGM_FI_DEV_XID_ERRORS` of
    /// its GPU (the last XID, as dcgm-exporter does). Other events, and XIDs of GPUs
    /// not seen by [`GpuMetrics::observe`], are ignored.
    pub fn observe_xid(&self, event: &NodeEvent) {
        let Some(dcgm) = &self.dcgm else { return };
        if event.kind != NodeEventKind::Xid as i32 {
            return;
        }
        let (Some(index), Some(code)) = (event.gpu_index, event.code) else {
            return;
        };
        let index = index.to_string();
        let known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(l) = known.iter().find(|l| l.gpu == index) {
            dcgm.set_xid(l, code);
        }
    }
}

#[cfg(test)]
mod tests {
    use prometheus::{Encoder, TextEncoder};

    use super::*;
    use crate::nvml::{GpuIdentity, NvlinkErrors, xid_event};

    fn reading(index: u32) -> GpuReading {
        let id = GpuIdentity {
            index,
            uuid: format!("GPU-{index}"),
            pci_bus_id: format!("0000:{:02x}:00", 0x18 + index),
            name: "NVIDIA H100 80GB HBM3".to_owned(),
        };
        let mut r = GpuReading::new(&id, 0);
        r.util_gpu_pct = Some(50);
        r.mem_used_bytes = Some(2 * 1024 * 1024 * 1024);
        r.mem_free_bytes = Some(1024 * 1024 * 1024);
        r.temp_c = Some(64);
        r.sm_clock_mhz = Some(1980);
        r.throttle_reasons = Some(throttle::SW_POWER_CAP | throttle::HW_THERMAL_SLOWDOWN);
        r.ecc.uncorrected_volatile = Some(2);
        r.nvlink = NvlinkErrors {
            crc_flit: Some(7),
            ..NvlinkErrors::default()
        };
        r
    }

    fn text(reg: &Registry) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&reg.gather(), &mut buf)
            .expect("text encoding");
        String::from_utf8(buf).expect("utf-8 metrics")
    }

    /// The value of the series whose line starts with `series`.
    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// The value of the series `name` of GPU 3 with the extra labels `extra`.
    fn gpu3(text: &str, name: &str, extra: &[(&str, &str)]) -> Option<f64> {
        let mut labels = vec![
            ("gpu", "3"),
            ("pci_bus_id", "0000:1b:00"),
            ("uuid", "GPU-3"),
        ];
        labels.extend_from_slice(extra);
        // The text format writes labels sorted by name.
        labels.sort_unstable();
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        value(text, &format!("{name}{{{}}}", labels.join(",")))
    }

    #[test]
    fn readings_become_series_in_base_units() {
        let reg = Registry::new();
        let m = GpuMetrics::new(&reg, GpuMetricsOptions::default()).expect("metrics");
        m.set_collector_up(true);
        m.observe(&[reading(3)]);
        let t = text(&reg);
        let v = |name: &str| gpu3(&t, name, &[]);
        assert_eq!(value(&t, "warden_gpu_collector_up"), Some(1.0));
        assert_eq!(v("warden_gpu_utilization_ratio"), Some(0.5));
        assert_eq!(v("warden_gpu_temperature_celsius"), Some(64.0));
        assert_eq!(v("warden_gpu_sm_clock_hertz"), Some(1.98e9));
        assert_eq!(v("warden_gpu_memory_used_bytes"), Some(2147483648.0));
        let ecc = [("scope", "volatile"), ("type", "uncorrected")];
        assert_eq!(gpu3(&t, "warden_gpu_ecc_errors", &ecc), Some(2.0));
        let flit = [("counter", "crc_flit")];
        assert_eq!(gpu3(&t, "warden_gpu_nvlink_errors", &flit), Some(7.0));
        for (reason, want) in [
            ("hw_thermal_slowdown", 1.0),
            ("sw_power_cap", 1.0),
            ("gpu_idle", 0.0),
        ] {
            let got = gpu3(&t, "warden_gpu_throttle_reason", &[("reason", reason)]);
            assert_eq!(got, Some(want), "{reason}");
        }
        // Not read: no series at all.
        for absent in [
            "warden_gpu_power_watts{",
            "warden_gpu_pcie_replays{",
            "warden_gpu_retired_pages{",
            r#"warden_gpu_nvlink_errors{counter="replay""#,
            "DCGM_",
        ] {
            assert!(
                !t.lines().any(|l| l.starts_with(absent)),
                "{absent} in\n{t}"
            );
        }
    }

    #[test]
    fn a_gpu_that_disappears_loses_its_series() {
        let reg = Registry::new();
        let m = dcgm_metrics(&reg);
        m.observe(&[reading(3), reading(4)]);
        assert!(text(&reg).contains(r#"uuid="GPU-4""#));
        m.observe(&[reading(3)]);
        let t = text(&reg);
        assert!(!t.contains(r#"uuid="GPU-4""#), "{t}");
        assert!(!t.contains(r#"UUID="GPU-4""#), "{t}");
        assert!(t.contains(r#"uuid="GPU-3""#));
    }

    /// Metrics with dcgm-exporter names on, for host `node1`.
    fn dcgm_metrics(reg: &Registry) -> GpuMetrics {
        GpuMetrics::new(
            reg,
            GpuMetricsOptions {
                dcgm_compat: true,
                hostname: "node1".to_owned(),
                pods: None,
            },
        )
        .expect("metrics")
    }

    /// Grafana dashboard 12239's metrics (dashboards/reference/) are all exported with
    /// dcgm-exporter names on, for a GPU with GPM; without GPM, all but the profiling
    /// (`DCGM_FI_PROF_*`) ones, which docs/METRICS.md names.
    #[test]
    fn grafana_12239_has_every_metric_and_the_profiling_ones_with_gpm() {
        let wanted = include_str!("../../dashboards/reference/dcgm-12239-metrics.txt");
        let names: Vec<&str> = wanted
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        assert!(names.len() >= 5, "{wanted}");
        let doc = include_str!("../../docs/METRICS.md");
        for gpm in [false, true] {
            let reg = Registry::new();
            let m = dcgm_metrics(&reg);
            let mut r = reading(0);
            r.power_w = Some(650.0);
            if gpm {
                r.profiling.tensor_active = Some(0.42);
            }
            m.observe(&[r]);
            let t = text(&reg);
            for name in &names {
                let has = t.lines().any(|l| l.starts_with(&format!("{name}{{")));
                let profiling = name.starts_with("DCGM_FI_PROF_");
                assert_eq!(has, gpm || !profiling, "GPM {gpm}, {name}:\n{t}");
                if profiling {
                    assert!(doc.contains(name), "docs/METRICS.md does not name {name}");
                }
            }
        }
    }

    #[test]
    fn gpm_readings_are_ratios_and_bytes_under_both_names_and_absent_without_gpm() {
        let reg = Registry::new();
        let m = dcgm_metrics(&reg);
        let mut r = reading(3);
        r.profiling.sm_active = Some(0.5);
        r.profiling.pcie_tx_bytes_per_s = Some(2.0 * MIB);
        m.observe(&[r, reading(4)]);
        let t = text(&reg);
        let labels = r#"{Hostname="node1",UUID="GPU-3",device="nvidia3",gpu="3",modelName="NVIDIA H100 80GB HBM3",pci_bus_id="0000:1b:00"}"#;
        assert_eq!(
            value(&t, &format!("DCGM_FI_PROF_SM_ACTIVE{labels}")),
            Some(0.5)
        );
        assert_eq!(
            value(&t, &format!("DCGM_FI_PROF_PCIE_TX_BYTES{labels}")),
            Some(2.0 * MIB)
        );
        assert_eq!(gpu3(&t, "warden_gpu_sm_active_ratio", &[]), Some(0.5));
        assert_eq!(gpu3(&t, "warden_gpu_tensor_active_ratio", &[]), None);
        assert!(
            !t.lines()
                .any(|l| l.contains("_ACTIVE{") && l.contains(r#"gpu="4""#)),
            "GPU 4 has no GPM: {t}"
        );
    }

    #[test]
    fn dcgm_names_units_and_labels() {
        let reg = Registry::new();
        let m = dcgm_metrics(&reg);
        m.observe(&[reading(3)]);
        let labels = r#"{Hostname="node1",UUID="GPU-3",device="nvidia3",gpu="3",modelName="NVIDIA H100 80GB HBM3",pci_bus_id="0000:1b:00"}"#;
        let t = text(&reg);
        let v = |name: &str| value(&t, &format!("{name}{labels}"));
        assert_eq!(v("DCGM_FI_DEV_GPU_UTIL"), Some(50.0));
        assert_eq!(v("DCGM_FI_DEV_FB_USED"), Some(2048.0));
        assert_eq!(v("DCGM_FI_DEV_FB_FREE"), Some(1024.0));
        assert_eq!(v("DCGM_FI_DEV_SM_CLOCK"), Some(1980.0));
        assert_eq!(v("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"), Some(2.0));
        assert_eq!(
            v("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
            Some(7.0)
        );
        assert_eq!(v("DCGM_FI_DEV_XID_ERRORS"), Some(0.0));
        assert_eq!(v("DCGM_FI_DEV_POWER_USAGE"), None);

        let mut r = reading(3);
        m.observe_xid(&xid_event(Some(&r.identity()), 79, 0));
        // Another sample does not reset the last XID.
        r.temp_c = Some(70);
        m.observe(&[r]);
        let t = text(&reg);
        assert_eq!(
            value(&t, &format!("DCGM_FI_DEV_XID_ERRORS{labels}")),
            Some(79.0)
        );
        assert_eq!(
            value(&t, &format!("DCGM_FI_DEV_GPU_TEMP{labels}")),
            Some(70.0)
        );
    }

    #[test]
    fn registering_twice_in_one_registry_is_an_error() {
        let reg = Registry::new();
        let _first = GpuMetrics::new(&reg, GpuMetricsOptions::default()).expect("metrics");
        assert!(GpuMetrics::new(&reg, GpuMetricsOptions::default()).is_err());
    }
}
