//! The real [`GpuSource`]: NVML through nvml-wrapper, on a worker thread that owns
//! the library, its device handles and its event set, so that a driver call that hangs
//! (a GPU falling off the bus can make NVML block for a long time) holds up that thread
//! and never the agent.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::{Bits, NvmlError};
use nvml_wrapper::gpm::{GpmSample, gpm_metrics_get};
use nvml_wrapper::struct_wrappers::event::EventData;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id;
use nvml_wrapper::{EventSet, Nvml};
use rustc_hash::{FxHashMap, FxHashSet};
use tracing::{debug, info, warn};
use warden_model::wire::{EventSeverity, NodeEvent, NodeEventKind};

use super::{GpuIdentity, GpuReading, GpuSource, GpuSourceError, Profiling, gpu_event, xid_event};
use crate::pci;

/// The library loaded when no path is given (found through the dynamic loader's
/// search path, as the NVIDIA driver installs it).
pub const DEFAULT_LIB: &str = "libnvidia-ml.so.1";

/// Most events returned by one poll; the rest wait for the next.
const MAX_EVENTS_PER_POLL: usize = 256;

/// How [`NvmlSource`] opens and talks to NVML.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlConfig {
    /// The NVML library to load; `None` loads [`DEFAULT_LIB`].
    pub lib_path: Option<PathBuf>,
    /// How long loading the library and `nvmlInit` may take.
    pub init_timeout: Duration,
    /// How long one sample may take, and how much longer than its own timeout an
    /// event poll may take, before the call gives up with [`GpuSourceError::Timeout`].
    pub call_timeout: Duration,
    /// Register for NVML events (XIDs, double-bit ECC errors).
    pub events: bool,
}

impl Default for NvmlConfig {
    fn default() -> Self {
        NvmlConfig {
            lib_path: None,
            // nvmlInit on a large node without persistence mode can take many seconds.
            init_timeout: Duration::from_secs(60),
            call_timeout: Duration::from_secs(5),
            events: true,
        }
    }
}

/// Why [`NvmlSource::open`] failed. The agent then reports its NVML collector down.
#[derive(Debug, thiserror::Error)]
pub enum NvmlSourceError {
    /// The library could not be loaded (no NVIDIA driver, wrong path).
    #[error("cannot load the NVML library {path}: {source}")]
    Load {
        /// The library that was asked for.
        path: String,
        /// What the loader said.
        source: NvmlError,
    },
    /// The library loaded but has no `nvmlInit_v2`.
    #[error("{path} is not an NVML library: {source}")]
    NotNvml {
        /// The library that was loaded.
        path: String,
        /// The missing symbol.
        source: NvmlError,
    },
    /// `nvmlInit` returned an error (driver not loaded, no permission, ...).
    #[error("nvmlInit failed: {0}")]
    Init(#[source] NvmlError),
    /// NVML initialised but could not count the GPUs.
    #[error("NVML cannot count the GPUs: {0}")]
    DeviceCount(#[source] NvmlError),
    /// Loading and initialising took longer than [`NvmlConfig::init_timeout`].
    #[error("NVML did not initialise within {0:?}")]
    InitTimeout(Duration),
    /// The worker thread could not be started.
    #[error("cannot start the NVML worker thread: {0}")]
    Spawn(#[source] std::io::Error),
    /// The worker thread ended before it reported.
    #[error("the NVML worker thread ended while starting")]
    WorkerDied,
}

/// GPU readings and events from NVML. See the [module docs](super) for a collector
/// loop. Dropping it shuts NVML down.
#[derive(Debug)]
pub struct NvmlSource {
    gpus: Vec<GpuIdentity>,
    watches_events: bool,
    requests: Option<mpsc::Sender<Request>>,
    replies: mpsc::Receiver<Reply>,
    worker: Option<JoinHandle<()>>,
    next_seq: u64,
    /// A call whose answer has not come back.
    outstanding: Option<u64>,
    call_timeout: Duration,
}

#[derive(Debug)]
enum Request {
    Sample {
        seq: u64,
        at_ns: i64,
    },
    Poll {
        seq: u64,
        timeout_ms: u32,
        at_ns: i64,
    },
}

#[derive(Debug)]
struct Reply {
    seq: u64,
    readings: Vec<GpuReading>,
    events: Vec<NodeEvent>,
}

#[derive(Debug)]
struct Ready {
    gpus: Vec<GpuIdentity>,
    watches_events: bool,
}

impl NvmlSource {
    /// Load NVML, initialise it, list the GPUs and register for events. Fails when
    /// the library cannot be loaded or initialised; a GPU or an event registration
    /// that fails is logged and left out instead.
    pub fn open(config: NvmlConfig) -> Result<Self, NvmlSourceError> {
        let (ready_tx, ready_rx) = mpsc::channel();
        let (req_tx, req_rx) = mpsc::channel();
        let (rep_tx, rep_rx) = mpsc::channel();
        let worker_config = config.clone();
        let worker = thread::Builder::new()
            .name("warden-nvml".to_owned())
            .spawn(move || run_worker(&worker_config, &ready_tx, &req_rx, &rep_tx))
            .map_err(NvmlSourceError::Spawn)?;
        let ready = match ready_rx.recv_timeout(config.init_timeout) {
            Ok(Ok(ready)) => ready,
            Ok(Err(e)) => {
                let _ = worker.join();
                return Err(e);
            }
            // The worker finds nobody listening when it is done and ends by itself.
            Err(RecvTimeoutError::Timeout) => {
                return Err(NvmlSourceError::InitTimeout(config.init_timeout));
            }
            Err(RecvTimeoutError::Disconnected) => {
                let _ = worker.join();
                return Err(NvmlSourceError::WorkerDied);
            }
        };
        Ok(NvmlSource {
            gpus: ready.gpus,
            watches_events: ready.watches_events,
            requests: Some(req_tx),
            replies: rep_rx,
            worker: Some(worker),
            next_seq: 0,
            outstanding: None,
            call_timeout: config.call_timeout,
        })
    }

    /// Whether NVML accepted the event registration of at least one GPU (when not,
    /// [`GpuSource::poll_events`] only reports GPUs that become unreachable).
    pub fn watches_events(&self) -> bool {
        self.watches_events
    }

    /// Collect the late answer to an earlier call, if it came.
    fn collect_late(&mut self) -> Result<(), GpuSourceError> {
        while let Some(seq) = self.outstanding {
            match self.replies.try_recv() {
                Ok(r) if r.seq == seq => self.outstanding = None,
                Ok(_) => {}
                Err(TryRecvError::Empty) => return Err(GpuSourceError::Busy),
                Err(TryRecvError::Disconnected) => return Err(GpuSourceError::Stopped),
            }
        }
        Ok(())
    }

    fn call(
        &mut self,
        request: impl FnOnce(u64) -> Request,
        wait: Duration,
    ) -> Result<Reply, GpuSourceError> {
        self.collect_late()?;
        let seq = self.next_seq;
        self.next_seq += 1;
        let sent = self
            .requests
            .as_ref()
            .is_some_and(|tx| tx.send(request(seq)).is_ok());
        if !sent {
            return Err(GpuSourceError::Stopped);
        }
        self.outstanding = Some(seq);
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.replies.recv_timeout(left) {
                Ok(r) if r.seq == seq => {
                    self.outstanding = None;
                    return Ok(r);
                }
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    warn!(
                        waited_ms = wait.as_millis() as u64,
                        "NVML did not answer in time; the call goes on in the background"
                    );
                    return Err(GpuSourceError::Timeout(wait));
                }
                Err(RecvTimeoutError::Disconnected) => return Err(GpuSourceError::Stopped),
            }
        }
    }
}

impl GpuSource for NvmlSource {
    fn inventory(&self) -> &[GpuIdentity] {
        &self.gpus
    }

    fn sample(&mut self, at_ns: i64) -> Result<Vec<GpuReading>, GpuSourceError> {
        let wait = self.call_timeout;
        Ok(self
            .call(|seq| Request::Sample { seq, at_ns }, wait)?
            .readings)
    }

    fn poll_events(
        &mut self,
        timeout_ms: u32,
        at_ns: i64,
    ) -> Result<Vec<NodeEvent>, GpuSourceError> {
        let wait = Duration::from_millis(u64::from(timeout_ms)) + self.call_timeout;
        let request = |seq| Request::Poll {
            seq,
            timeout_ms,
            at_ns,
        };
        Ok(self.call(request, wait)?.events)
    }
}

impl Drop for NvmlSource {
    fn drop(&mut self) {
        // Closing the request channel ends the worker, which shuts NVML down. A worker
        // still inside a hung NVML call is left to finish on its own.
        self.requests = None;
        let _ = self.collect_late();
        if self.outstanding.is_none()
            && let Some(worker) = self.worker.take()
        {
            let _ = worker.join();
        }
    }
}

fn run_worker(
    config: &NvmlConfig,
    ready: &mpsc::Sender<Result<Ready, NvmlSourceError>>,
    requests: &mpsc::Receiver<Request>,
    replies: &mpsc::Sender<Reply>,
) {
    let nvml = match load(config.lib_path.as_deref()) {
        Ok(nvml) => nvml,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let gpus = match inventory(&nvml) {
        Ok(gpus) => gpus,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let set = if config.events {
        event_set(&nvml, &gpus)
    } else {
        None
    };
    let mut worker = Worker {
        nvml: &nvml,
        gpm: FxHashMap::default(),
        watches_events: set.is_some(),
        set,
        gpus,
        failures: FailureLog::default(),
        lost: FxHashSet::default(),
        pending: Vec::new(),
        wait_failed: false,
    };
    let hello = Ready {
        gpus: worker.gpus.clone(),
        watches_events: worker.watches_events,
    };
    if ready.send(Ok(hello)).is_err() {
        return;
    }
    while let Ok(request) = requests.recv() {
        let reply = match request {
            Request::Sample { seq, at_ns } => Reply {
                seq,
                readings: worker.sample(at_ns),
                events: Vec::new(),
            },
            Request::Poll {
                seq,
                timeout_ms,
                at_ns,
            } => Reply {
                seq,
                readings: Vec::new(),
                events: worker.poll(timeout_ms, at_ns),
            },
        };
        if replies.send(reply).is_err() {
            break;
        }
    }
}

fn load(path: Option<&Path>) -> Result<Nvml, NvmlSourceError> {
    let lib = path.map_or(OsStr::new(DEFAULT_LIB), Path::as_os_str);
    let shown = || lib.to_string_lossy().into_owned();
    Nvml::builder().lib_path(lib).init().map_err(|e| match e {
        NvmlError::LibloadingError(_) => NvmlSourceError::Load {
            path: shown(),
            source: e,
        },
        NvmlError::FailedToLoadSymbol(_) => NvmlSourceError::NotNvml {
            path: shown(),
            source: e,
        },
        e => NvmlSourceError::Init(e),
    })
}

/// Every GPU NVML counts; what cannot be read about one is left empty (a GPU lost
/// at start shows up in the first sample as lost).
fn inventory(nvml: &Nvml) -> Result<Vec<GpuIdentity>, NvmlSourceError> {
    let count = nvml.device_count().map_err(NvmlSourceError::DeviceCount)?;
    let mut gpus = Vec::with_capacity(count as usize);
    for index in 0..count {
        let mut gpu = GpuIdentity {
            index,
            ..GpuIdentity::default()
        };
        match nvml.device_by_index(index) {
            Ok(dev) => {
                let or_log = |what: &str, e: NvmlError| {
                    warn!(gpu = index, what, error = %e, "NVML: cannot read the GPU's identity");
                    String::new()
                };
                gpu.uuid = dev.uuid().unwrap_or_else(|e| or_log("uuid", e));
                gpu.name = dev.name().unwrap_or_else(|e| or_log("name", e));
                gpu.pci_bus_id = match dev.pci_info() {
                    Ok(p) => {
                        pci::normalize(&p.bus_id).unwrap_or_else(|| p.bus_id.to_ascii_lowercase())
                    }
                    Err(e) => or_log("pci_info", e),
                };
            }
            Err(e) => warn!(gpu = index, error = %e, "NVML: cannot open the GPU"),
        }
        gpus.push(gpu);
    }
    info!(
        gpus = gpus.len(),
        driver = nvml.sys_driver_version().unwrap_or_default(),
        "NVML: opened"
    );
    Ok(gpus)
}

/// One event set for every GPU that takes one. A failed registration makes
/// nvml-wrapper free the whole set, so the set is built again without that GPU.
fn event_set<'n>(nvml: &'n Nvml, gpus: &[GpuIdentity]) -> Option<EventSet<'n>> {
    // Single-bit (corrected) ECC events are left out: harmless, and a flood on a GPU
    // with a weak cell; the counters and metrics show them.
    let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
    let mut plan: Vec<(u32, EventTypes)> = Vec::new();
    for g in gpus {
        let Ok(dev) = nvml.device_by_index(g.index) else {
            continue;
        };
        let types = match dev.supported_event_types() {
            Ok(supported) => supported & wanted,
            Err(e) => {
                debug!(gpu = g.index, error = %e, "NVML: supported event types unknown; trying XIDs");
                EventTypes::CRITICAL_XID_ERROR
            }
        };
        if types.is_empty() {
            info!(
                gpu = g.index,
                "NVML: the GPU reports none of the events watched"
            );
        } else {
            plan.push((g.index, types));
        }
    }
    while !plan.is_empty() {
        let mut set = match nvml.create_event_set() {
            Ok(set) => Some(set),
            Err(e) => {
                warn!(error = %e, "NVML: no event set; sampling goes on without XID events");
                return None;
            }
        };
        let mut failed = None;
        for (k, (index, types)) in plan.iter().enumerate() {
            let (Some(s), Ok(dev)) = (set.take(), nvml.device_by_index(*index)) else {
                failed = Some(k);
                break;
            };
            match dev.register_events(*types, s) {
                Ok(s) => set = Some(s),
                Err(e) => {
                    warn!(gpu = index, error = %e.error, "NVML: event registration failed; no XID events from this GPU");
                    failed = Some(k);
                    break;
                }
            }
        }
        match failed {
            None => {
                info!(gpus = plan.len(), "NVML: watching XID and ECC events");
                return set;
            }
            Some(k) => {
                plan.remove(k);
            }
        }
    }
    None
}

/// Logs each failing reading once per GPU (until it recovers), and each entry point
/// missing from the library once.
#[derive(Debug, Default)]
struct FailureLog {
    failing: FxHashSet<(u32, &'static str)>,
    missing: FxHashSet<&'static str>,
}

impl FailureLog {
    fn failed(&mut self, gpu: u32, field: &'static str, e: &NvmlError) {
        match e {
            NvmlError::FailedToLoadSymbol(_) => {
                if self.missing.insert(field) {
                    debug!(field, error = %e, "NVML: the library lacks this entry point; reading left out");
                }
            }
            NvmlError::NotSupported => {
                if self.failing.insert((gpu, field)) {
                    debug!(gpu, field, "NVML: reading not supported on this GPU");
                }
            }
            // Reported once per GPU by the worker.
            NvmlError::GpuLost => {}
            e => {
                if self.failing.insert((gpu, field)) {
                    warn!(gpu, field, error = %e, "NVML: reading failed; left out until it recovers");
                }
            }
        }
    }

    fn succeeded(&mut self, gpu: u32, field: &'static str) {
        if !self.failing.is_empty() && self.failing.remove(&(gpu, field)) {
            debug!(gpu, field, "NVML: reading recovered");
        }
    }
}

/// The readings of one GPU in one sample.
struct Query<'a> {
    failures: &'a mut FailureLog,
    gpu: u32,
    lost: bool,
}

impl Query<'_> {
    fn get<T>(&mut self, field: &'static str, r: Result<T, NvmlError>) -> Option<T> {
        match r {
            Ok(v) => {
                self.failures.succeeded(self.gpu, field);
                Some(v)
            }
            Err(e) => {
                self.lost |= matches!(e, NvmlError::GpuLost);
                self.failures.failed(self.gpu, field, &e);
                None
            }
        }
    }
}

/// The field values read in one `nvmlDeviceGetFieldValues` call, with the name each
/// is logged under.
const FIELDS: [(u32, &str); 11] = [
    (
        field_id::NVML_FI_DEV_RETIRED_SBE,
        "retired_pages.single_bit",
    ),
    (
        field_id::NVML_FI_DEV_RETIRED_DBE,
        "retired_pages.double_bit",
    ),
    (
        field_id::NVML_FI_DEV_RETIRED_PENDING,
        "retired_pages.pending",
    ),
    (
        field_id::NVML_FI_DEV_REMAPPED_COR,
        "remapped_rows.correctable",
    ),
    (
        field_id::NVML_FI_DEV_REMAPPED_UNC,
        "remapped_rows.uncorrectable",
    ),
    (
        field_id::NVML_FI_DEV_REMAPPED_PENDING,
        "remapped_rows.pending",
    ),
    (
        field_id::NVML_FI_DEV_REMAPPED_FAILURE,
        "remapped_rows.failure",
    ),
    (
        field_id::NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
        "nvlink.crc_flit",
    ),
    (
        field_id::NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
        "nvlink.crc_data",
    ),
    (
        field_id::NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
        "nvlink.replay",
    ),
    (
        field_id::NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
        "nvlink.recovery",
    ),
];

fn sample_as_u64(v: SampleValue) -> Result<u64, NvmlError> {
    match v {
        SampleValue::U32(x) => Ok(u64::from(x)),
        SampleValue::U64(x) => Ok(x),
        SampleValue::I64(x) => u64::try_from(x).map_err(|_| NvmlError::Unknown),
        SampleValue::F64(x) if x.is_finite() && x >= 0.0 => Ok(x as u64),
        SampleValue::F64(_) => Err(NvmlError::Unknown),
    }
}

/// NVML's raw throttle mask, including bits nvml-wrapper does not name.
fn throttle_bits(r: Result<ThrottleReasons, NvmlError>) -> Result<u64, NvmlError> {
    match r {
        Ok(t) => Ok(t.bits()),
        Err(NvmlError::IncorrectBits(Bits::U64(raw))) => Ok(raw),
        Err(e) => Err(e),
    }
}

/// One GPM metric read: its id, the factor and upper bound that turn GPM's unit into
/// DCGM's (percent into a ratio up to 1, MiB/s into bytes/s), and its [`Profiling`] slot.
type GpmField = (
    GpmMetricId,
    f64,
    f64,
    fn(&mut Profiling) -> &mut Option<f64>,
);

/// Every GPM metric read.
fn gpm_fields() -> [GpmField; 12] {
    const RATIO: (f64, f64) = (0.01, 1.0);
    const BYTES: (f64, f64) = (1_048_576.0, f64::INFINITY);
    fn f(
        id: GpmMetricId,
        (scale, most): (f64, f64),
        slot: fn(&mut Profiling) -> &mut Option<f64>,
    ) -> GpmField {
        (id, scale, most, slot)
    }
    [
        f(GpmMetricId::GraphicsUtil, RATIO, |p| &mut p.graphics_active),
        f(GpmMetricId::SmUtil, RATIO, |p| &mut p.sm_active),
        f(GpmMetricId::SmOccupancy, RATIO, |p| &mut p.sm_occupancy),
        f(GpmMetricId::AnyTensorUtil, RATIO, |p| &mut p.tensor_active),
        f(GpmMetricId::DramBwUtil, RATIO, |p| &mut p.dram_active),
        f(GpmMetricId::Fp64Util, RATIO, |p| &mut p.fp64_active),
        f(GpmMetricId::Fp32Util, RATIO, |p| &mut p.fp32_active),
        f(GpmMetricId::Fp16Util, RATIO, |p| &mut p.fp16_active),
        f(GpmMetricId::PcieTxPerSec, BYTES, |p| {
            &mut p.pcie_tx_bytes_per_s
        }),
        f(GpmMetricId::PcieRxPerSec, BYTES, |p| {
            &mut p.pcie_rx_bytes_per_s
        }),
        f(GpmMetricId::NvlinkTotalTxPerSec, BYTES, |p| {
            &mut p.nvlink_tx_bytes_per_s
        }),
        f(GpmMetricId::NvlinkTotalRxPerSec, BYTES, |p| {
            &mut p.nvlink_rx_bytes_per_s
        }),
    ]
}

/// A GPU's GPM state: whether it has GPM (asked once), and its last sample.
type GpmState<'n> = (bool, Option<GpmSample<'n>>);

/// GPM readings of `dev` over the interval since its previous sample, which this call
/// replaces; nothing for a GPU without GPM (asked once: a driver without GPM lacks the
/// entry point, a GPU before Hopper says no) or on its first call.
fn profile<'n>(
    nvml: &'n Nvml,
    gpm: &mut FxHashMap<u32, GpmState<'n>>,
    dev: &nvml_wrapper::Device<'n>,
    q: &mut Query<'_>,
) -> Profiling {
    let (supported, last) = gpm
        .entry(q.gpu)
        .or_insert_with(|| (dev.gpm_support().unwrap_or(false), None));
    if !*supported {
        return Profiling::default();
    }
    let Some(now) = q.get("gpm_sample", dev.gpm_sample()) else {
        *last = None;
        return Profiling::default();
    };
    let (Some(before), Some(now)) = (last.replace(now), last.as_ref()) else {
        return Profiling::default();
    };
    let fields = gpm_fields();
    let ids = fields.map(|(id, ..)| id);
    let mut out = Profiling::default();
    if let Some(results) = q.get("gpm_metrics", gpm_metrics_get(nvml, &before, now, &ids)) {
        for ((_, scale, most, slot), r) in fields.iter().zip(results) {
            *slot(&mut out) = r
                .ok()
                .map(|m| m.value)
                .filter(|v| v.is_finite())
                .map(|v| (v * scale).clamp(0.0, *most));
        }
    }
    out
}

struct Worker<'n> {
    nvml: &'n Nvml,
    /// Each GPU's GPM state.
    gpm: FxHashMap<u32, GpmState<'n>>,
    gpus: Vec<GpuIdentity>,
    set: Option<EventSet<'n>>,
    watches_events: bool,
    failures: FailureLog,
    /// GPUs that answered "lost" and have not answered since.
    lost: FxHashSet<u32>,
    /// Events found while sampling, for the next poll.
    pending: Vec<NodeEvent>,
    /// Whether a failing event wait was logged.
    wait_failed: bool,
}

impl Worker<'_> {
    fn sample(&mut self, at_ns: i64) -> Vec<GpuReading> {
        let gpus = std::mem::take(&mut self.gpus);
        let readings = gpus.iter().filter_map(|g| self.read(g, at_ns)).collect();
        self.gpus = gpus;
        readings
    }

    fn read(&mut self, g: &GpuIdentity, at_ns: i64) -> Option<GpuReading> {
        let nvml = self.nvml;
        let mut q = Query {
            failures: &mut self.failures,
            gpu: g.index,
            lost: false,
        };
        let Some(dev) = q.get("handle", nvml.device_by_index(g.index)) else {
            let lost = q.lost;
            self.unreachable(g, lost, at_ns);
            return None;
        };
        let mut r = GpuReading::new(g, at_ns);
        if let Some(u) = q.get("utilization", dev.utilization_rates()) {
            r.util_gpu_pct = Some(u.gpu);
            r.util_mem_pct = Some(u.memory);
        }
        if q.lost {
            self.unreachable(g, true, at_ns);
            return None;
        }
        if let Some(m) = q.get("memory", dev.memory_info()) {
            r.mem_used_bytes = Some(m.used);
            r.mem_free_bytes = Some(m.free);
            r.mem_total_bytes = Some(m.total);
        }
        r.temp_c = q.get("temperature", dev.temperature(TemperatureSensor::Gpu));
        r.power_w = q
            .get("power", dev.power_usage())
            .map(|mw| f64::from(mw) / 1000.0);
        r.sm_clock_mhz = q.get("sm_clock", dev.clock_info(Clock::SM));
        r.mem_clock_mhz = q.get("mem_clock", dev.clock_info(Clock::Memory));
        r.throttle_reasons = q.get(
            "throttle_reasons",
            throttle_bits(dev.current_throttle_reasons_strict()),
        );
        let (cor, unc) = (MemoryError::Corrected, MemoryError::Uncorrected);
        let (vol, agg) = (EccCounter::Volatile, EccCounter::Aggregate);
        let ecc = |kind, counter| dev.total_ecc_errors(kind, counter);
        r.ecc.corrected_volatile = q.get("ecc.corrected.volatile", ecc(cor, vol));
        r.ecc.uncorrected_volatile = q.get("ecc.uncorrected.volatile", ecc(unc, vol));
        r.ecc.corrected_aggregate = q.get("ecc.corrected.aggregate", ecc(cor, agg));
        r.ecc.uncorrected_aggregate = q.get("ecc.uncorrected.aggregate", ecc(unc, agg));
        r.pcie_replays = q
            .get("pcie_replays", dev.pcie_replay_counter())
            .map(u64::from);
        r.pcie_link_gen = q.get("pcie_link_gen", dev.current_pcie_link_gen());
        r.pcie_link_width = q.get("pcie_link_width", dev.current_pcie_link_width());

        let ids = FIELDS.map(|(id, _)| FieldId(id));
        let mut values = [None; FIELDS.len()];
        if let Some(samples) = q.get("field_values", dev.field_values_for(&ids)) {
            for ((slot, (_, name)), s) in values.iter_mut().zip(FIELDS).zip(samples) {
                *slot = q.get(name, s.and_then(|s| s.value).and_then(sample_as_u64));
            }
        }
        let [
            sbe,
            dbe,
            sbe_pending,
            cor,
            unc,
            remap_pending,
            failure,
            flit,
            data,
            replay,
            recovery,
        ] = values;
        let flag = |v: Option<u64>| v.map(|v| v != 0);
        r.retired_pages.single_bit = sbe;
        r.retired_pages.double_bit = dbe;
        r.retired_pages.pending = flag(sbe_pending);
        r.remapped_rows.correctable = cor;
        r.remapped_rows.uncorrectable = unc;
        r.remapped_rows.pending = flag(remap_pending);
        r.remapped_rows.failure = flag(failure);
        r.nvlink.crc_flit = flit;
        r.nvlink.crc_data = data;
        r.nvlink.replay = replay;
        r.nvlink.recovery = recovery;
        r.profiling = profile(nvml, &mut self.gpm, &dev, &mut q);

        if q.lost {
            self.unreachable(g, true, at_ns);
            return None;
        }
        if self.lost.remove(&g.index) {
            info!(gpu = g.index, pci_bus_id = %g.pci_bus_id, "NVML: the GPU answers again");
        }
        Some(r)
    }

    /// `g` could not be read; when NVML says it is lost, report that once.
    fn unreachable(&mut self, g: &GpuIdentity, lost: bool, at_ns: i64) {
        if lost && self.lost.insert(g.index) {
            warn!(gpu = g.index, pci_bus_id = %g.pci_bus_id, "NVML: the GPU is lost; left out of samples");
            self.pending.push(gpu_event(
                Some(g),
                NodeEventKind::FallenOffBus,
                EventSeverity::Fatal,
                at_ns,
                format!(
                    "NVML: GPU {} ({}) is lost (NVML_ERROR_GPU_IS_LOST)",
                    g.index, g.pci_bus_id
                ),
            ));
        }
    }

    fn poll(&mut self, timeout_ms: u32, at_ns: i64) -> Vec<NodeEvent> {
        let start = Instant::now();
        let mut out = std::mem::take(&mut self.pending);
        let timeout = Duration::from_millis(u64::from(timeout_ms));
        let Some(set) = self.set.as_ref() else {
            if out.is_empty() {
                thread::sleep(timeout);
            }
            return out;
        };
        let mut wait = if out.is_empty() { timeout_ms } else { 0 };
        while out.len() < MAX_EVENTS_PER_POLL {
            match set.wait(wait) {
                Ok(data) => {
                    let elapsed = i64::try_from(start.elapsed().as_nanos()).unwrap_or(i64::MAX);
                    out.push(convert(data, &self.gpus, at_ns.saturating_add(elapsed)));
                    wait = 0;
                }
                Err(NvmlError::Timeout) => break,
                Err(e) => {
                    if !self.wait_failed {
                        self.wait_failed = true;
                        warn!(error = %e, "NVML: waiting for events failed");
                    }
                    // Do not spin on an error that repeats.
                    thread::sleep(timeout.saturating_sub(start.elapsed()));
                    break;
                }
            }
        }
        out
    }
}

fn convert(data: EventData<'_>, gpus: &[GpuIdentity], at_ns: i64) -> NodeEvent {
    let index = data.device.index().ok();
    let known = match index {
        Some(i) => gpus.iter().find(|g| g.index == i),
        None => data
            .device
            .uuid()
            .ok()
            .and_then(|u| gpus.iter().find(|g| g.uuid == u)),
    };
    let gpu = known.cloned().or(index.map(|index| GpuIdentity {
        index,
        ..GpuIdentity::default()
    }));
    let gpu = gpu.as_ref();
    let place = gpu.map_or_else(
        || "an unknown GPU".to_owned(),
        |g| format!("GPU {} ({})", g.index, g.pci_bus_id),
    );
    if data.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
        let code = match data.event_data {
            Some(XidError::Value(v)) => u32::try_from(v).ok(),
            _ => None,
        };
        match code {
            Some(code) => xid_event(gpu, code, at_ns),
            None => gpu_event(
                gpu,
                NodeEventKind::Xid,
                EventSeverity::Warning,
                at_ns,
                format!("NVML: XID with an unknown code on {place}"),
            ),
        }
    } else if data.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
        gpu_event(
            gpu,
            NodeEventKind::Ecc,
            EventSeverity::Error,
            at_ns,
            format!("NVML: double-bit ECC error on {place}"),
        )
    } else {
        gpu_event(
            gpu,
            NodeEventKind::Other,
            EventSeverity::Info,
            at_ns,
            format!("NVML: event {:#x} on {place}", data.event_type.bits()),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Log output captured from this thread.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn count(&self, needle: &str) -> usize {
            let text = self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            String::from_utf8_lossy(&text).matches(needle).count()
        }
    }

    #[test]
    fn a_failing_reading_is_logged_once_per_gpu_until_it_recovers() {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let mut log = FailureLog::default();
            for _ in 0..3 {
                for gpu in 0..2 {
                    log.failed(gpu, "temperature", &NvmlError::Unknown);
                    log.failed(gpu, "power", &NvmlError::NotSupported);
                    let missing = NvmlError::FailedToLoadSymbol("nvmlDeviceGetPowerUsage".into());
                    log.failed(gpu, "pcie_replays", &missing);
                    log.failed(gpu, "memory", &NvmlError::GpuLost);
                }
            }
            assert_eq!(out.count("reading failed"), 2, "once per GPU");
            assert_eq!(out.count("not supported"), 2);
            assert_eq!(out.count("lacks this entry point"), 1, "once in all");
            assert_eq!(
                out.count("memory"),
                0,
                "a lost GPU is reported by the worker"
            );
            log.succeeded(1, "temperature");
            log.succeeded(1, "temperature");
            assert_eq!(out.count("recovered"), 1);
            log.failed(1, "temperature", &NvmlError::Unknown);
            assert_eq!(
                out.count("reading failed"),
                3,
                "a new failure is logged again"
            );
        });
    }

    #[test]
    fn throttle_bits_nvml_wrapper_cannot_name_are_kept() {
        assert_eq!(
            throttle_bits(Ok(ThrottleReasons::SW_POWER_CAP)).ok(),
            Some(0x4)
        );
        let raw = Err(NvmlError::IncorrectBits(Bits::U64(0x1004)));
        assert_eq!(throttle_bits(raw).ok(), Some(0x1004));
        assert!(throttle_bits(Err(NvmlError::NotSupported)).is_err());
    }

    #[test]
    fn field_values_of_any_numeric_type_become_counts() {
        assert_eq!(sample_as_u64(SampleValue::U32(7)).ok(), Some(7));
        assert_eq!(sample_as_u64(SampleValue::U64(1 << 40)).ok(), Some(1 << 40));
        assert_eq!(sample_as_u64(SampleValue::I64(3)).ok(), Some(3));
        assert_eq!(sample_as_u64(SampleValue::F64(2.0)).ok(), Some(2));
        assert!(sample_as_u64(SampleValue::I64(-1)).is_err());
        assert!(sample_as_u64(SampleValue::F64(f64::NAN)).is_err());
    }
}
