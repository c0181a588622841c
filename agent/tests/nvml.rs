//! The NVML collector against a fake `libnvidia-ml.so.1` (built from C by the test and
//! loaded by the real nvml-wrapper): readings, events, missing entry points, faults.

#[path = "fake_nvml/mod.rs"]
mod fake_nvml;

use std::time::{Duration, Instant};

use fake_nvml::FakeNode;
use prometheus::{Encoder, Registry, TextEncoder};
use warden_agent::gpu_metrics::{GpuMetrics, GpuMetricsOptions};
use warden_agent::nvml::{
    ChangeConfig, ChangeDetector, GpuReading, GpuSource, GpuSourceError, NvmlConfig, NvmlSource,
    NvmlSourceError, throttle, to_wire,
};
use warden_model::wire::{EventSeverity, NodeEvent, NodeEventKind};
use warden_testkit::{PATIENCE, scaled, wait_for};

/// The PCI addresses of the fake's 8 default GPUs, normalised.
const PCI: [&str; 8] = [
    "0000:18:00",
    "0000:2a:00",
    "0000:3a:00",
    "0000:5d:00",
    "0000:9a:00",
    "0000:ab:00",
    "0000:ba:00",
    "0000:db:00",
];

fn config(node: &FakeNode) -> NvmlConfig {
    NvmlConfig {
        lib_path: Some(node.lib_path().to_owned()),
        // The fake answers at once; a loaded machine may still keep its worker thread
        // waiting for seconds, which is no timeout of the driver's.
        call_timeout: PATIENCE,
        ..NvmlConfig::default()
    }
}

fn open(node: &FakeNode) -> NvmlSource {
    NvmlSource::open(config(node)).expect("open the fake NVML")
}

fn sample(src: &mut NvmlSource, at_ns: i64) -> Vec<GpuReading> {
    src.sample(at_ns).expect("sample the fake NVML")
}

fn metrics_text(reg: &Registry) -> String {
    let mut buf = Vec::new();
    TextEncoder::new()
        .encode(&reg.gather(), &mut buf)
        .expect("encode metrics");
    String::from_utf8(buf).expect("metrics are UTF-8")
}

/// The value of the series `name` of GPU `gpu` (plus `extra` labels) in `text`.
fn metric(text: &str, name: &str, gpu: usize, extra: &[(&str, &str)]) -> Option<f64> {
    let index = gpu.to_string();
    let uuid = format!("GPU-fa4e0000-0000-4000-8000-{gpu:012x}");
    let mut labels = vec![
        ("gpu", index.as_str()),
        ("pci_bus_id", PCI[gpu]),
        ("uuid", uuid.as_str()),
    ];
    labels.extend_from_slice(extra);
    labels.sort_unstable();
    let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    let series = format!("{name}{{{}}} ", labels.join(","));
    text.lines()
        .find_map(|l| l.strip_prefix(&series)?.parse().ok())
}

fn kinds(events: &[NodeEvent]) -> Vec<(NodeEventKind, EventSeverity, Option<u32>, u32)> {
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

#[test]
fn eight_gpus_read_with_the_injected_values() {
    let node = FakeNode::new(&[]);
    node.set("gpus", 8);
    for i in 0..8u64 {
        node.set(&format!("gpu.{i}.temp"), 60 + i);
        node.set(&format!("gpu.{i}.util_gpu"), 90 + i);
        node.set(&format!("gpu.{i}.util_mem"), 40 + i);
        node.set(&format!("gpu.{i}.power_mw"), 650_500 + i * 1000);
        node.set(&format!("gpu.{i}.mem_used"), (i + 1) << 30);
        node.set(&format!("gpu.{i}.ecc_cor_agg"), 10 * i);
        node.set(&format!("gpu.{i}.pcie_replay"), i);
    }
    node.set("gpu.6.throttle", throttle::SW_POWER_CAP | 0x1000);
    node.set("gpu.6.name", "NVIDIA H200");
    let mut src = open(&node);
    assert_eq!(src.inventory().len(), 8);
    assert!(src.watches_events());

    let readings = sample(&mut src, 1_000);
    assert_eq!(readings.len(), 8);
    for (i, r) in readings.iter().enumerate() {
        let n = i as u64;
        assert_eq!(r.index as usize, i);
        assert_eq!(r.pci_bus_id, PCI[i]);
        assert_eq!(r.uuid, format!("GPU-fa4e0000-0000-4000-8000-{i:012x}"));
        assert_eq!(r.at_ns, 1_000);
        assert_eq!(r.temp_c, Some(60 + i as u32));
        assert_eq!(
            (r.util_gpu_pct, r.util_mem_pct),
            (Some(90 + i as u32), Some(40 + i as u32))
        );
        assert_eq!(r.power_w, Some(650.5 + n as f64));
        assert_eq!(r.mem_used_bytes, Some((n + 1) << 30));
        assert_eq!(r.mem_total_bytes, Some(85_520_809_984));
        assert_eq!(
            r.mem_free_bytes,
            Some(85_520_809_984 - 573_833_216 - ((n + 1) << 30))
        );
        assert_eq!((r.sm_clock_mhz, r.mem_clock_mhz), (Some(1980), Some(2619)));
        assert_eq!(r.ecc.corrected_aggregate, Some(10 * n));
        assert_eq!(r.ecc.uncorrected_volatile, Some(0));
        assert_eq!(r.pcie_replays, Some(n));
        assert_eq!((r.pcie_link_gen, r.pcie_link_width), (Some(5), Some(16)));
        assert_eq!(r.remapped_rows.failure, Some(false));
        assert_eq!(r.nvlink.crc_flit, Some(0));
    }
    // Bits nvml-wrapper has no name for are kept.
    assert_eq!(
        readings[6].throttle_reasons,
        Some(throttle::SW_POWER_CAP | 0x1000)
    );
    assert_eq!(readings[6].name, "NVIDIA H200");
    assert_eq!(readings[0].name, "NVIDIA H100 80GB HBM3");

    let wire = to_wire(&readings[4]);
    assert_eq!(
        (wire.index, wire.util_pct, wire.temp_c, wire.power_w),
        (4, 94.0, 64.0, 654.5)
    );
    assert_eq!(wire.uuid, readings[4].uuid);
    assert_eq!(wire.mem_used_bytes, 5 << 30);

    let reg = Registry::new();
    let metrics = GpuMetrics::new(&reg, GpuMetricsOptions::default()).expect("metrics");
    metrics.observe(&readings);
    let text = metrics_text(&reg);
    for i in 0..8 {
        let n = i as f64;
        assert_eq!(
            metric(&text, "warden_gpu_temperature_celsius", i, &[]),
            Some(60.0 + n)
        );
        assert_eq!(
            metric(&text, "warden_gpu_power_watts", i, &[]),
            Some(650.5 + n)
        );
        assert_eq!(
            metric(&text, "warden_gpu_utilization_ratio", i, &[]),
            Some((90.0 + n) / 100.0)
        );
        assert_eq!(metric(&text, "warden_gpu_pcie_replays", i, &[]), Some(n));
    }
}

#[test]
fn uncorrected_ecc_jump_becomes_an_ecc_event_with_the_delta() {
    let node = FakeNode::new(&[]);
    let mut src = open(&node);
    let mut changes = ChangeDetector::new(ChangeConfig::default());
    assert!(changes.observe(&sample(&mut src, 1)).is_empty());

    node.set("gpu.5.ecc_unc_vol", 3);
    node.set("gpu.5.ecc_unc_agg", 3);
    let readings = sample(&mut src, 2);
    assert_eq!(readings[5].ecc.uncorrected_volatile, Some(3));
    let events = changes.observe(&readings);
    assert_eq!(
        kinds(&events),
        vec![(NodeEventKind::Ecc, EventSeverity::Error, Some(5), 3)]
    );
    assert_eq!(
        (events[0].pci_bus_id.as_str(), events[0].at_ns),
        (PCI[5], 2)
    );
    assert_eq!(to_wire(&readings[5]).ecc_uncorrected, 3);

    // No further rise, no further event.
    assert!(changes.observe(&sample(&mut src, 3)).is_empty());
}

#[test]
fn xid_79_from_the_event_set_is_a_fatal_xid_event_for_its_gpu() {
    let node = FakeNode::new(&[]);
    let mut src = open(&node);
    assert!(src.poll_events(0, 0).expect("poll").is_empty());

    node.set("event.1", "gpu:3,xid:79");
    node.set("event.2", "gpu:6,type:dbe");
    let events = src.poll_events(1000, 5_000).expect("poll");
    assert_eq!(
        kinds(&events),
        vec![
            (NodeEventKind::Xid, EventSeverity::Fatal, Some(3), 1),
            (NodeEventKind::Ecc, EventSeverity::Error, Some(6), 1),
        ]
    );
    let xid = &events[0];
    assert_eq!(xid.code, Some(79));
    assert_eq!(xid.pci_bus_id, PCI[3]);
    assert!(xid.at_ns >= 5_000);
    assert!(
        xid.message.contains("fallen off the bus"),
        "{}",
        xid.message
    );
    assert_eq!(events[1].pci_bus_id, PCI[6]);

    // Each event is delivered once; the wait ends at its timeout.
    let start = Instant::now();
    assert!(src.poll_events(50, 0).expect("poll").is_empty());
    assert!(start.elapsed() >= Duration::from_millis(50));

    // An event that arrives during the wait ends it. (The pause is for the event to come
    // during the wait; an event that comes before it passes the test as well.)
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(100));
            node.set("event.3", "gpu:0,xid:48");
        });
        let wait_ms = u32::try_from(scaled(PATIENCE).as_millis()).unwrap_or(u32::MAX);
        let events = src.poll_events(wait_ms, 0).expect("poll");
        assert_eq!(events.len(), 1);
        assert_eq!((events[0].code, events[0].gpu_index), (Some(48), Some(0)));
    });
}

#[test]
fn temperature_change_shows_in_metrics_and_a_crossing_is_a_thermal_event() {
    let node = FakeNode::new(&[]);
    node.set("gpu.*.temp", 65);
    let mut src = open(&node);
    let reg = Registry::new();
    let metrics = GpuMetrics::new(
        &reg,
        GpuMetricsOptions {
            dcgm_compat: true,
            hostname: "gpu-node01".to_owned(),
            pods: None,
        },
    )
    .expect("metrics");
    let mut changes = ChangeDetector::new(ChangeConfig::default());

    let first = sample(&mut src, 1);
    metrics.observe(&first);
    assert!(changes.observe(&first).is_empty());
    let text = metrics_text(&reg);
    assert_eq!(
        metric(&text, "warden_gpu_temperature_celsius", 2, &[]),
        Some(65.0)
    );

    node.set("gpu.2.temp", 92);
    node.set("gpu.2.throttle", throttle::HW_THERMAL_SLOWDOWN);
    let second = sample(&mut src, 2);
    metrics.observe(&second);
    let text = metrics_text(&reg);
    assert_eq!(
        metric(&text, "warden_gpu_temperature_celsius", 2, &[]),
        Some(92.0)
    );
    assert_eq!(
        metric(&text, "warden_gpu_temperature_celsius", 1, &[]),
        Some(65.0)
    );
    let hw = [("reason", "hw_thermal_slowdown")];
    assert_eq!(
        metric(&text, "warden_gpu_throttle_reason", 2, &hw),
        Some(1.0)
    );
    assert_eq!(
        metric(&text, "warden_gpu_throttle_reason", 1, &hw),
        Some(0.0)
    );
    let dcgm = format!(
        "DCGM_FI_DEV_GPU_TEMP{{Hostname=\"gpu-node01\",UUID=\"{}\",device=\"nvidia2\",gpu=\"2\",modelName=\"NVIDIA H100 80GB HBM3\",pci_bus_id=\"{}\"}} 92",
        second[2].uuid, PCI[2]
    );
    assert!(text.lines().any(|l| l == dcgm), "{dcgm} not in\n{text}");

    let events = changes.observe(&second);
    assert_eq!(
        kinds(&events),
        vec![
            (NodeEventKind::Thermal, EventSeverity::Warning, Some(2), 1),
            (NodeEventKind::Thermal, EventSeverity::Warning, Some(2), 1),
        ]
    );
    assert!(
        events[0].message.contains("hw_thermal_slowdown"),
        "{}",
        events[0].message
    );
    assert!(events[1].message.contains("92 °C"), "{}", events[1].message);
}

/// What an older driver without these entry points gives.
const OMITTED: [&str; 4] = [
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlEventSetCreate",
];

#[test]
fn missing_entry_points_leave_their_readings_out_and_the_rest_in() {
    let node = FakeNode::new(&OMITTED);
    node.set("gpu.*.temp", 70);
    node.set("gpu.*.pcie_replay", 5);
    node.set("gpu.*.nvlink_crc_flit", 9);
    node.set("event.1", "gpu:1,xid:79");
    let mut src = open(&node);
    assert!(!src.watches_events());

    let readings = sample(&mut src, 1);
    assert_eq!(readings.len(), 8);
    for r in &readings {
        assert_eq!(r.power_w, None);
        assert_eq!(r.pcie_replays, None);
        assert_eq!(r.nvlink.crc_flit, None);
        assert_eq!(r.nvlink.recovery, None);
        assert_eq!(r.remapped_rows.failure, None);
        assert_eq!(r.retired_pages.single_bit, None);
        // The rest is there.
        assert_eq!(r.temp_c, Some(70));
        assert_eq!(r.sm_clock_mhz, Some(1980));
        assert_eq!(r.ecc.uncorrected_volatile, Some(0));
        assert_eq!(r.pcie_link_width, Some(16));
    }
    // No events without an event set, and the poll still waits as asked.
    let start = Instant::now();
    assert!(src.poll_events(30, 0).expect("poll").is_empty());
    assert!(start.elapsed() >= Duration::from_millis(30));

    let reg = Registry::new();
    let metrics = GpuMetrics::new(&reg, GpuMetricsOptions::default()).expect("metrics");
    metrics.observe(&readings);
    let text = metrics_text(&reg);
    for absent in [
        "warden_gpu_power_watts",
        "warden_gpu_pcie_replays",
        "warden_gpu_nvlink_errors",
        "warden_gpu_remapped_rows",
        "warden_gpu_retired_pages",
    ] {
        assert!(
            !text.lines().any(|l| l.starts_with(absent)),
            "{absent} in\n{text}"
        );
    }
    assert_eq!(
        metric(&text, "warden_gpu_temperature_celsius", 7, &[]),
        Some(70.0)
    );
    assert_eq!(
        metric(&text, "warden_gpu_pcie_link_width_lanes", 7, &[]),
        Some(16.0)
    );
}

#[test]
fn unsupported_or_failing_readings_are_none_not_zero() {
    let node = FakeNode::new(&[]);
    node.set("gpu.*.power_mw", "na");
    node.set("gpu.*.nvlink_crc_flit", "na");
    node.set("gpu.*.retired_sbe", "na");
    node.set("gpu.4.temp", "err:999");
    node.set("gpu.4.ecc_unc_vol", "na");
    node.set("gpu.4.ecc_unc_agg", 6);
    let mut src = open(&node);
    let readings = sample(&mut src, 1);
    assert_eq!(readings.len(), 8);
    for r in &readings {
        assert_eq!((r.power_w, r.nvlink.crc_flit), (None, None));
        assert_eq!(r.retired_pages.single_bit, None);
        // One field value unsupported does not take the others with it.
        assert_eq!(
            (r.nvlink.crc_data, r.retired_pages.double_bit),
            (Some(0), Some(0))
        );
        assert!(r.mem_used_bytes.is_some());
    }
    assert_eq!(readings[4].temp_c, None);
    assert_eq!(readings[3].temp_c, Some(35));
    assert_eq!(readings[4].ecc.uncorrected_volatile, None);
    // The wire sample falls back on the aggregate count.
    assert_eq!(to_wire(&readings[4]).ecc_uncorrected, 6);

    // A failing reading that recovers comes back.
    node.set("gpu.4.temp", 50);
    assert_eq!(sample(&mut src, 2)[4].temp_c, Some(50));
}

#[test]
fn remapped_rows_and_nvlink_counters_read_and_their_changes_reported() {
    let node = FakeNode::new(&[]);
    node.set("gpu.1.remap_cor", 2);
    node.set("gpu.1.remap_unc", 1);
    node.set("gpu.1.nvlink_crc_flit", 100);
    let mut src = open(&node);
    let mut changes = ChangeDetector::new(ChangeConfig::default());
    let first = sample(&mut src, 1);
    assert_eq!(
        (
            first[1].remapped_rows.correctable,
            first[1].remapped_rows.uncorrectable
        ),
        (Some(2), Some(1))
    );
    assert_eq!(first[1].nvlink.crc_flit, Some(100));
    assert!(changes.observe(&first).is_empty());

    node.set("gpu.1.remap_failure", 1);
    node.set("gpu.1.remap_pending", 1);
    node.set("gpu.1.nvlink_crc_flit", 112);
    node.set("gpu.7.pcie_replay", 4);
    let events = changes.observe(&sample(&mut src, 2));
    assert_eq!(
        kinds(&events),
        vec![
            (NodeEventKind::Ecc, EventSeverity::Warning, Some(1), 1),
            (NodeEventKind::Ecc, EventSeverity::Fatal, Some(1), 1),
            (NodeEventKind::Nvlink, EventSeverity::Warning, Some(1), 12),
            (NodeEventKind::Pcie, EventSeverity::Warning, Some(7), 4),
        ]
    );
}

#[test]
fn a_lost_gpu_is_left_out_reported_once_and_its_series_removed() {
    let node = FakeNode::new(&[]);
    let mut src = open(&node);
    let reg = Registry::new();
    let metrics = GpuMetrics::new(&reg, GpuMetricsOptions::default()).expect("metrics");
    metrics.observe(&sample(&mut src, 1));
    assert!(
        metric(
            &metrics_text(&reg),
            "warden_gpu_temperature_celsius",
            2,
            &[]
        )
        .is_some()
    );

    node.set("gpu.2.lost", 1);
    let readings = sample(&mut src, 2);
    assert_eq!(readings.len(), 7);
    assert!(readings.iter().all(|r| r.index != 2));
    metrics.observe(&readings);
    let text = metrics_text(&reg);
    assert_eq!(
        metric(&text, "warden_gpu_temperature_celsius", 2, &[]),
        None
    );
    assert!(metric(&text, "warden_gpu_temperature_celsius", 3, &[]).is_some());

    let events = src.poll_events(0, 3).expect("poll");
    assert_eq!(
        kinds(&events),
        vec![(
            NodeEventKind::FallenOffBus,
            EventSeverity::Fatal,
            Some(2),
            1
        )]
    );
    assert_eq!(
        (events[0].pci_bus_id.as_str(), events[0].at_ns),
        (PCI[2], 2)
    );
    // Still lost: not reported again.
    assert_eq!(sample(&mut src, 4).len(), 7);
    assert!(src.poll_events(0, 5).expect("poll").is_empty());

    node.set("gpu.2.lost", 0);
    assert_eq!(sample(&mut src, 6).len(), 8);
}

#[test]
fn a_library_that_does_not_exist_is_an_error() {
    let err = NvmlSource::open(NvmlConfig {
        lib_path: Some("/nonexistent/libnvidia-ml.so.1".into()),
        ..NvmlConfig::default()
    })
    .expect_err("no library, no source");
    assert!(matches!(err, NvmlSourceError::Load { .. }), "{err:?}");
    assert!(
        err.to_string().contains("/nonexistent/libnvidia-ml.so.1"),
        "{err}"
    );
}

#[test]
fn nvml_init_failure_is_an_error() {
    let node = FakeNode::new(&[]);
    node.set("init_error", 9); // NVML_ERROR_DRIVER_NOT_LOADED
    let err = NvmlSource::open(config(&node)).expect_err("init fails");
    assert!(
        matches!(
            err,
            NvmlSourceError::Init(nvml_wrapper::error::NvmlError::DriverNotLoaded)
        ),
        "{err:?}"
    );
    // The same library initialises once the driver is there.
    node.set("init_error", 0);
    assert_eq!(open(&node).inventory().len(), 8);
}

#[test]
fn a_library_without_nvml_init_is_not_nvml() {
    let node = FakeNode::new(&["nvmlInit_v2"]);
    let err = NvmlSource::open(config(&node)).expect_err("not NVML");
    assert!(matches!(err, NvmlSourceError::NotNvml { .. }), "{err:?}");
}

#[test]
fn a_hung_driver_times_out_without_holding_up_the_caller() {
    let node = FakeNode::new(&[]);
    node.set("gpus", 2);
    let mut src = NvmlSource::open(NvmlConfig {
        call_timeout: Duration::from_millis(200),
        ..config(&node)
    })
    .expect("open");
    assert_eq!(sample(&mut src, 1).len(), 2);

    // The driver hangs far longer than the call timeout, so that the checks below
    // do not depend on how fast a loaded machine gets back to this thread.
    let hang = Duration::from_secs(5);
    node.set("delay_ms", hang.as_millis());
    let start = Instant::now();
    assert_eq!(
        src.sample(2),
        Err(GpuSourceError::Timeout(Duration::from_millis(200)))
    );
    let took = start.elapsed();
    eprintln!("a call to a hung driver returned after {took:?} (timeout 200 ms)");
    assert!(
        took < hang,
        "the caller waited for the hung driver: {took:?}"
    );
    // The hung call still runs: the next one is refused rather than queued.
    assert_eq!(src.poll_events(0, 3), Err(GpuSourceError::Busy));

    node.set("delay_ms", 0);
    let readings = wait_for("NVML to answer again", PATIENCE, || match src.sample(4) {
        Ok(r) => Some(r),
        Err(GpuSourceError::Busy | GpuSourceError::Timeout(_)) => None,
        Err(e) => panic!("NVML did not come back: {e}"),
    });
    assert_eq!(readings.len(), 2);
    assert_eq!(readings[0].at_ns, 4);
}
