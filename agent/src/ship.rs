//! Shipping to the controller: collectors add records to [`Pending`]; once per flush
//! interval the [`Shipper`] seals them into a wire batch, keeps sealed batches in a
//! bounded [`Outbox`] while the controller is unreachable (the oldest is dropped and
//! counted when it is full), delivers them oldest first with jittered exponential
//! backoff, and sends a heartbeat when it has nothing else to say. A record detection
//! needs at once (a non-finite loss or gradient norm, a process that exited or stopped,
//! a node event of error or fatal severity) wakes the shipper before the interval is
//! over, at most once per [`URGENT_GAP`].

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand::{Rng, SeedableRng, rngs::SmallRng};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use warden_http::Backoff;
pub use warden_http::ingest::{IngestClient, SendError};
use warden_model::wire::{
    Batch, EventSeverity, GpuSample, Heartbeat, JobSignals, LogRecord, NodeEvent, ProcessState,
    TrainingMetric, frame_sealed,
};

use crate::config::ShipConfig;
use crate::metrics::{AgentMetrics, advance};

/// Records waiting for the next batch. Collectors add to it from their own threads.
#[derive(Debug, Default)]
pub struct Pending {
    gpus: Vec<GpuSample>,
    events: Vec<NodeEvent>,
    jobs: BTreeMap<String, JobSignals>,
    records: usize,
    /// Records refused because the pending set was full (the shipper is far behind).
    pub dropped: u64,
    /// Wakes the shipper early for an urgent record.
    wake: Arc<Notify>,
}

/// The shortest time between two flushes when urgent records wake the shipper (a job
/// whose every rank reports a NaN each step flushes this often, not once per record).
pub const URGENT_GAP: Duration = Duration::from_millis(50);

/// A record detection needs at once: a non-finite loss or gradient norm, or a
/// non-finite input to a collective (warden_torch's input check).
pub(crate) fn urgent_metric(m: &TrainingMetric) -> bool {
    m.first_nonfinite_op.is_some()
        || [m.loss, m.grad_norm]
            .into_iter()
            .flatten()
            .any(|v| !v.is_finite())
}

/// A process that exited or stopped: a crash or a hang's culprit.
pub(crate) fn urgent_process(p: &ProcessState) -> bool {
    !p.alive || p.stopped
}

/// Most records waiting for one batch; more are dropped and counted.
pub const MAX_PENDING_RECORDS: usize = 200_000;

impl Pending {
    fn room(&mut self, n: usize) -> bool {
        if self.records + n > MAX_PENDING_RECORDS {
            self.dropped += n as u64;
            false
        } else {
            self.records += n;
            true
        }
    }

    /// Add GPU samples.
    pub fn gpus(&mut self, samples: impl IntoIterator<Item = GpuSample>) {
        for s in samples {
            if self.room(1) {
                self.gpus.push(s);
            }
        }
    }

    /// Add node events; an error or a fatal one (an XID that impairs or loses a GPU)
    /// wakes the shipper.
    pub fn events(&mut self, events: impl IntoIterator<Item = NodeEvent>) {
        for e in events {
            if self.room(1) {
                if e.severity >= EventSeverity::Error as i32 {
                    self.wake.notify_one();
                }
                self.events.push(e);
            }
        }
    }

    fn job(&mut self, job: &str) -> &mut JobSignals {
        self.jobs
            .entry(job.to_owned())
            .or_insert_with(|| JobSignals {
                job: job.to_owned(),
                ..JobSignals::default()
            })
    }

    /// Add a training metric of `job`.
    pub fn metric(&mut self, job: &str, m: TrainingMetric) {
        if self.room(1) {
            if urgent_metric(&m) {
                self.wake.notify_one();
            }
            self.job(job).metrics.push(m);
        }
    }

    /// Add a process state of `job`; an exit or a stop wakes the shipper.
    pub fn process(&mut self, job: &str, p: ProcessState) {
        if self.room(1) {
            if urgent_process(&p) {
                self.wake.notify_one();
            }
            self.job(job).processes.push(p);
        }
    }

    /// What wakes the shipper when an urgent record arrives.
    pub fn waker(&self) -> Arc<Notify> {
        Arc::clone(&self.wake)
    }

    /// Add everything in `sig` to its job's signals; records beyond the bound are
    /// dropped and counted, whole kinds at a time, registrations first.
    pub fn job_signals(&mut self, sig: JobSignals) {
        let JobSignals {
            job,
            ranks,
            comms,
            collectives,
            metrics,
            processes,
            logs,
            links,
        } = sig;
        let parts = [
            ranks.len(),
            comms.len(),
            processes.len(),
            metrics.len(),
            collectives.len(),
            logs.len(),
            links.len(),
        ];
        let room: Vec<bool> = parts.iter().map(|&n| n == 0 || self.room(n)).collect();
        if parts.iter().all(|&n| n == 0) {
            return;
        }
        if (room[2] && processes.iter().any(urgent_process))
            || (room[3] && metrics.iter().any(urgent_metric))
        {
            self.wake.notify_one();
        }
        fn keep<T>(ok: bool, from: Vec<T>, into: &mut Vec<T>) {
            if ok {
                into.extend(from);
            }
        }
        let j = self.job(&job);
        keep(room[0], ranks, &mut j.ranks);
        keep(room[1], comms, &mut j.comms);
        keep(room[2], processes, &mut j.processes);
        keep(room[3], metrics, &mut j.metrics);
        keep(room[4], collectives, &mut j.collectives);
        keep(room[5], logs, &mut j.logs);
        keep(room[6], links, &mut j.links);
    }

    /// Add a log line of `job`.
    pub fn log(&mut self, job: &str, r: LogRecord) {
        if self.room(1) {
            self.job(job).logs.push(r);
        }
    }

    /// Records waiting.
    pub fn len(&self) -> usize {
        self.records
    }

    /// Nothing waiting.
    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// The job signals waiting, taken out (tests look at what collectors produced).
    #[cfg(test)]
    pub(crate) fn take_jobs(&mut self) -> Vec<JobSignals> {
        self.take().2
    }

    fn take(&mut self) -> (Vec<GpuSample>, Vec<NodeEvent>, Vec<JobSignals>, usize) {
        let n = std::mem::take(&mut self.records);
        (
            std::mem::take(&mut self.gpus),
            std::mem::take(&mut self.events),
            std::mem::take(&mut self.jobs).into_values().collect(),
            n,
        )
    }
}

/// Shared handle to the pending records.
pub type SharedPending = Arc<Mutex<Pending>>;

/// Lock the pending set; a collector that panicked while holding it left plain data
/// behind, which is still usable.
pub fn lock(p: &SharedPending) -> MutexGuard<'_, Pending> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// A batch encoded without its send time.
#[derive(Debug, Clone)]
struct Sealed {
    seq: u64,
    payload: Vec<u8>,
    records: usize,
}

/// Sealed batches waiting for delivery, bounded in bytes.
#[derive(Debug)]
pub struct Outbox {
    queue: VecDeque<Sealed>,
    bytes: usize,
    max_bytes: usize,
    /// Records dropped to stay within the bound, since start.
    pub dropped_records: u64,
    /// Batches dropped to stay within the bound, since start.
    pub dropped_batches: u64,
}

impl Outbox {
    /// An empty outbox holding at most `max_bytes` of payload.
    pub fn new(max_bytes: usize) -> Outbox {
        Outbox {
            queue: VecDeque::new(),
            bytes: 0,
            max_bytes,
            dropped_records: 0,
            dropped_batches: 0,
        }
    }

    fn push(&mut self, s: Sealed) {
        // Memory held is the payloads plus a small fixed cost per batch.
        self.bytes += s.payload.len();
        self.queue.push_back(s);
        while self.bytes > self.max_bytes {
            let Some(old) = self.queue.pop_front() else {
                break;
            };
            self.bytes -= old.payload.len();
            self.dropped_records += old.records as u64;
            self.dropped_batches += 1;
        }
    }

    fn pop_front(&mut self) -> Option<Sealed> {
        let s = self.queue.pop_front()?;
        self.bytes -= s.payload.len();
        Some(s)
    }

    fn push_front(&mut self, s: Sealed) {
        self.bytes += s.payload.len();
        self.queue.push_front(s);
    }

    /// Payload bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Batches held.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Nothing held.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

/// How batches reach the controller.
pub trait Transport: Send + Sync + 'static {
    /// Deliver one framed batch.
    fn send(&self, body: Vec<u8>) -> impl Future<Output = Result<(), SendError>> + Send;
}

impl Transport for IngestClient {
    fn send(&self, body: Vec<u8>) -> impl Future<Output = Result<(), SendError>> + Send {
        IngestClient::send(self, body)
    }
}

/// Who this agent is, stamped on every batch.
#[derive(Debug, Clone)]
pub struct Identity {
    /// Node name.
    pub node: String,
    /// This agent instance.
    pub agent_id: String,
    /// The node's boot.
    pub boot_id: String,
}

/// Agent clock, ns since the Unix epoch.
pub fn wall_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// Delivers sealed batches.
#[derive(Debug)]
pub struct Shipper<T> {
    cfg: ShipConfig,
    transport: T,
    id: Identity,
    outbox: Outbox,
    seq: u64,
    failed_batches: u64,
    /// Failed attempts since the last delivery: the exponent of the next wait.
    failures_in_row: u32,
    next_attempt: Instant,
    /// Last delivery; `None` sends a heartbeat at once, so the controller learns of a
    /// new agent without waiting.
    last_delivery: Option<Instant>,
    rng: SmallRng,
    metrics: Option<Arc<AgentMetrics>>,
    collectors_down: Arc<Mutex<Vec<String>>>,
    /// Job-side progress, cut into the pending set just before each seal.
    progress: Option<crate::progress::Progress>,
    frame: Vec<u8>,
    /// Records refused by the controller (400, 413), since start.
    refused_records: u64,
    /// Records the pending set refused, as of the last seal.
    pending_dropped: u64,
    /// Whether the last attempt reached the controller.
    pub connected: bool,
}

impl<T: Transport> Shipper<T> {
    /// A shipper for `id` delivering through `transport`.
    pub fn new(cfg: ShipConfig, transport: T, id: Identity) -> Shipper<T> {
        let now = Instant::now();
        Shipper {
            outbox: Outbox::new(cfg.buffer_max_bytes),
            failures_in_row: 0,
            cfg,
            transport,
            id,
            seq: 0,
            failed_batches: 0,
            next_attempt: now,
            last_delivery: None,
            rng: SmallRng::seed_from_u64(wall_ns() as u64),
            metrics: None,
            collectors_down: Arc::default(),
            progress: None,
            frame: Vec::new(),
            refused_records: 0,
            pending_dropped: 0,
            connected: false,
        }
    }

    /// Report into `metrics`.
    pub fn with_metrics(mut self, m: Arc<AgentMetrics>) -> Self {
        self.metrics = Some(m);
        self
    }

    /// The list of collectors that are down, sent in every heartbeat.
    pub fn with_collectors_down(mut self, down: Arc<Mutex<Vec<String>>>) -> Self {
        self.collectors_down = down;
        self
    }

    /// Cut `progress` into every batch as it is sealed (in-flight collectives are
    /// re-sent in each batch, so they belong to the seal, not to a separate timer).
    pub fn with_progress(mut self, progress: crate::progress::Progress) -> Self {
        self.progress = Some(progress);
        self
    }

    /// The outbox (for inspection).
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// Batches that failed to deliver, since start.
    pub fn failed_batches(&self) -> u64 {
        self.failed_batches
    }

    /// Records given up for any reason, since start.
    pub fn dropped_records(&self) -> u64 {
        self.outbox.dropped_records + self.refused_records + self.pending_dropped
    }

    fn heartbeat(&self) -> Heartbeat {
        Heartbeat {
            dropped_records: self.dropped_records(),
            failed_batches: self.failed_batches,
            collectors_down: self
                .collectors_down
                .lock()
                .map(|v| v.clone())
                .unwrap_or_default(),
        }
    }

    fn batch(&mut self) -> Batch {
        self.seq += 1;
        Batch {
            node: self.id.node.clone(),
            agent_id: self.id.agent_id.clone(),
            boot_id: self.id.boot_id.clone(),
            seq: self.seq,
            heartbeat: Some(self.heartbeat()),
            ..Batch::default()
        }
    }

    /// Seal what is pending into the outbox, once the sources that are read before a
    /// flush have been read; returns the records sealed.
    pub fn seal(&mut self, pending: &SharedPending) -> usize {
        if let Some(progress) = &self.progress {
            progress.read_sources();
        }
        let (gpus, events, jobs, n) = {
            let mut p = lock(pending);
            if let Some(progress) = &self.progress {
                progress.flush(wall_ns(), &mut p);
            }
            self.pending_dropped = p.dropped;
            if p.is_empty() {
                return 0;
            }
            p.take()
        };
        let mut b = self.batch();
        b.gpus = gpus;
        b.events = events;
        b.jobs = jobs;
        let sealed = Sealed {
            seq: b.seq,
            payload: b.seal(),
            records: n,
        };
        self.outbox.push(sealed);
        self.publish();
        n
    }

    fn publish(&self) {
        if let Some(m) = &self.metrics {
            m.buffer_bytes.set(self.outbox.bytes() as i64);
            m.buffer_batches.set(self.outbox.len() as i64);
            for (reason, total) in [
                ("buffer_full", self.outbox.dropped_records),
                ("refused", self.refused_records),
                ("pending_full", self.pending_dropped),
            ] {
                advance(&m.records_dropped.with_label_values(&[reason]), total);
            }
            m.controller_up.set(i64::from(self.connected));
        }
    }

    fn failed(&mut self, e: &SendError, now: Instant) {
        self.failed_batches += 1;
        if self.connected || self.failed_batches == 1 {
            tracing::warn!(error = %e, kept = self.outbox.len(), "cannot deliver to the controller; keeping batches");
        }
        self.connected = false;
        // Jitter over the upper half: agents that lost the controller together do not
        // come back together.
        let wait = Backoff::new(self.cfg.backoff_initial, self.cfg.backoff_max).delay(
            self.failures_in_row,
            self.rng.random::<f64>(),
            None,
        );
        self.next_attempt = now + wait;
        self.failures_in_row = self.failures_in_row.saturating_add(1);
        if let Some(m) = &self.metrics {
            m.batches_failed.inc();
        }
    }

    /// Try to deliver what the outbox holds, oldest first, and a heartbeat when idle.
    /// Returns the batches delivered.
    pub async fn deliver(&mut self) -> usize {
        let now = Instant::now();
        if now < self.next_attempt {
            return 0;
        }
        let mut delivered = 0;
        while let Some(s) = self.outbox.pop_front() {
            frame_sealed(&s.payload, wall_ns(), &mut self.frame);
            match self.transport.send(std::mem::take(&mut self.frame)).await {
                Ok(()) => {
                    delivered += 1;
                    self.on_success(now);
                }
                Err(SendError::Refused { status, body }) => {
                    // Retrying cannot help this batch; the next one may be fine.
                    tracing::error!(status, %body, seq = s.seq, records = s.records, "controller refused a batch; dropping it");
                    self.refused_records += s.records as u64;
                    self.on_success(now);
                }
                Err(e) => {
                    self.outbox.push_front(s);
                    self.failed(&e, now);
                    self.publish();
                    return delivered;
                }
            }
        }
        let idle = self
            .last_delivery
            .is_none_or(|t| now.duration_since(t) >= self.cfg.heartbeat_interval);
        if idle {
            let b = self.batch();
            frame_sealed(&b.seal(), wall_ns(), &mut self.frame);
            match self.transport.send(std::mem::take(&mut self.frame)).await {
                Ok(()) | Err(SendError::Refused { .. }) => self.on_success(now),
                Err(e) => self.failed(&e, now),
            }
        }
        self.publish();
        delivered
    }

    fn on_success(&mut self, now: Instant) {
        if !self.connected && self.failed_batches > 0 {
            tracing::info!(kept = self.outbox.len(), "controller reachable again");
        }
        self.connected = true;
        self.failures_in_row = 0;
        self.next_attempt = now;
        self.last_delivery = Some(now);
        if let Some(m) = &self.metrics {
            m.batches_sent.inc();
        }
    }

    /// Seal and deliver once per flush interval, and soon after an urgent record
    /// arrives (at most once per [`URGENT_GAP`]), until `shutdown` turns true; then
    /// seal what is left and make one last delivery attempt.
    pub async fn run(mut self, pending: SharedPending, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.cfg.flush_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let wake = lock(&pending).waker();
        let progress_wake = self.progress.as_ref().map(|p| p.waker());
        let progress_woken = || async {
            match &progress_wake {
                Some(w) => w.notified().await,
                None => std::future::pending().await,
            }
        };
        let mut sealed_at = Instant::now();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = wake.notified() => {
                    tokio::time::sleep_until(sealed_at + URGENT_GAP).await;
                }
                _ = progress_woken() => {
                    tokio::time::sleep_until(sealed_at + URGENT_GAP).await;
                }
                _ = shutdown.changed() => {
                    self.seal(&pending);
                    self.next_attempt = Instant::now();
                    self.deliver().await;
                    return;
                }
            }
            self.seal(&pending);
            sealed_at = Instant::now();
            self.deliver().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// A controller that can be switched off, recording what it received.
    #[derive(Clone, Default)]
    struct Fake {
        down: Arc<AtomicBool>,
        got: Arc<Mutex<Vec<Batch>>>,
    }

    impl Transport for Fake {
        async fn send(&self, body: Vec<u8>) -> Result<(), SendError> {
            if self.down.load(Ordering::SeqCst) {
                return Err(SendError::Unreachable("connection refused".into()));
            }
            let b = Batch::decode_binary(&body).map_err(|e| SendError::Refused {
                status: 400,
                body: e.to_string(),
            })?;
            self.got.lock().expect("lock").push(b);
            Ok(())
        }
    }

    fn id() -> Identity {
        Identity {
            node: "n1".into(),
            agent_id: "a1".into(),
            boot_id: "b1".into(),
        }
    }

    fn sample(i: u64) -> GpuSample {
        GpuSample {
            index: (i % 8) as u32,
            uuid: format!("GPU-{i:08}"),
            at_ns: i as i64,
            temp_c: 40.0,
            ..GpuSample::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn ten_minute_outage_stays_within_the_bound_and_delivers_what_was_kept() {
        let fake = Fake::default();
        let cfg = ShipConfig {
            buffer_max_bytes: 64 << 10,
            ..ShipConfig::default()
        };
        let bound = cfg.buffer_max_bytes;
        let mut sh = Shipper::new(cfg, fake.clone(), id());
        let pending = SharedPending::default();
        fake.down.store(true, Ordering::SeqCst);
        let mut n = 0u64;
        // Ten minutes at 1 Hz with 8 GPU samples a second.
        for _ in 0..600 {
            lock(&pending).gpus((0..8).map(|_| {
                n += 1;
                sample(n)
            }));
            sh.seal(&pending);
            sh.deliver().await;
            assert!(
                sh.outbox().bytes() <= bound,
                "{} > {bound}",
                sh.outbox().bytes()
            );
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        assert!(sh.failed_batches() > 5, "retried with backoff");
        assert!(sh.failed_batches() < 600, "backoff spaced the retries");
        let kept = sh.outbox().len();
        let dropped = sh.outbox().dropped_records;
        assert!(dropped > 0 && kept > 0, "kept {kept}, dropped {dropped}");
        assert_eq!(
            dropped + kept as u64 * 8,
            600 * 8,
            "every record kept or counted"
        );

        // The controller returns: everything kept arrives, oldest first.
        fake.down.store(false, Ordering::SeqCst);
        tokio::time::advance(Duration::from_secs(31)).await;
        let delivered = sh.deliver().await;
        assert_eq!(delivered, kept);
        let got = fake.got.lock().expect("lock");
        assert_eq!(got.len(), kept);
        let seqs: Vec<u64> = got.iter().map(|b| b.seq).collect();
        assert!(
            seqs.windows(2).all(|w| w[1] == w[0] + 1),
            "in order: {seqs:?}"
        );
        assert_eq!(
            *seqs.last().expect("some"),
            600,
            "newest kept, oldest dropped"
        );
        let last = got.last().expect("some");
        assert_eq!(last.gpus.len(), 8);
        let hb = last.heartbeat.as_ref().expect("heartbeat in every batch");
        assert!(hb.failed_batches > 0);
        // Stamped at send time, not at seal time.
        assert!(last.sent_at_ns > 0);
    }

    /// A shipper with a 10 s flush interval (what it delivers sooner, it was woken
    /// for), and the controller it delivers to.
    fn slow_shipper() -> (Fake, Shipper<Fake>) {
        let fake = Fake::default();
        let cfg = ShipConfig {
            flush_interval: Duration::from_secs(10),
            ..ShipConfig::default()
        };
        let sh = Shipper::new(cfg, fake.clone(), id());
        (fake, sh)
    }

    /// `sh` running on `pending`, 1 s after it started (its first batch went out).
    async fn running(sh: Shipper<Fake>, pending: &SharedPending) -> tokio::task::JoinHandle<()> {
        let (stop, shutdown) = watch::channel(false);
        let pending = Arc::clone(pending);
        let run = tokio::spawn(async move {
            let _stop = stop;
            sh.run(pending, shutdown).await;
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        run
    }

    /// Batches delivered by `run` under a 10 s flush interval, `at` after a record
    /// added once the first batch went out.
    async fn delivered_after(add: impl FnOnce(&mut Pending), at: Duration) -> Vec<Batch> {
        let (fake, sh) = slow_shipper();
        let pending = SharedPending::default();
        let run = running(sh, &pending).await;
        add(&mut lock(&pending));
        tokio::time::sleep(at).await;
        run.abort();
        fake.got.lock().expect("lock").clone()
    }

    fn metric(loss: f64) -> TrainingMetric {
        TrainingMetric {
            rank: 3,
            step: 20,
            loss: Some(loss),
            ..TrainingMetric::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_nan_is_shipped_at_once_not_at_the_next_flush() {
        let got = delivered_after(|p| p.metric("j", metric(f64::NAN)), URGENT_GAP * 2).await;
        let nan: Vec<&Batch> = got.iter().filter(|b| !b.jobs.is_empty()).collect();
        assert_eq!(nan.len(), 1, "{got:?}");
        assert!(nan[0].jobs[0].metrics[0].loss.is_some_and(f64::is_nan));

        // A finite loss waits for the flush interval.
        let got = delivered_after(|p| p.metric("j", metric(0.5)), Duration::from_secs(5)).await;
        assert!(got.iter().all(|b| b.jobs.is_empty()), "{got:?}");

        // A non-finite collective input (the input check) is a NaN on its way: at once.
        let fed = TrainingMetric {
            first_nonfinite_op: Some(3),
            ..metric(0.5)
        };
        let got = delivered_after(|p| p.metric("j", fed), URGENT_GAP * 2).await;
        let sent: Vec<&Batch> = got.iter().filter(|b| !b.jobs.is_empty()).collect();
        assert_eq!(sent.len(), 1, "{got:?}");
        assert_eq!(sent[0].jobs[0].metrics[0].first_nonfinite_op, Some(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_gpu_error_event_is_shipped_at_once_and_a_warning_waits() {
        for (severity, urgent) in [
            (EventSeverity::Fatal, true),
            (EventSeverity::Warning, false),
        ] {
            let event = NodeEvent {
                severity: severity as i32,
                ..NodeEvent::default()
            };
            let got = delivered_after(|p| p.events([event]), URGENT_GAP * 2).await;
            let shipped = got.iter().any(|b| !b.events.is_empty());
            assert_eq!(shipped, urgent, "{severity:?}: {got:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_exit_or_a_stop_is_shipped_at_once() {
        for (alive, stopped) in [(false, false), (true, true)] {
            let sig = JobSignals {
                job: "j".into(),
                processes: vec![ProcessState {
                    rank: 2,
                    pid: 7,
                    alive,
                    stopped,
                    ..ProcessState::default()
                }],
                ..JobSignals::default()
            };
            let got = delivered_after(|p| p.job_signals(sig), URGENT_GAP * 2).await;
            assert!(
                got.iter().any(|b| !b.jobs.is_empty()),
                "alive {alive} stopped {stopped}: {got:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_nan_or_an_exit_from_the_capture_path_is_shipped_at_once() {
        for urgent in [true, false] {
            let (fake, sh) = slow_shipper();
            let progress = crate::progress::Progress::default();
            let run = running(
                sh.with_progress(progress.clone()),
                &SharedPending::default(),
            )
            .await;
            let loss = if urgent { f64::NAN } else { 0.5 };
            progress.metric("j", metric(loss));
            progress.process(
                "j",
                ProcessState {
                    rank: 1,
                    alive: !urgent,
                    ..ProcessState::default()
                },
            );
            tokio::time::sleep(URGENT_GAP * 2).await;
            run.abort();
            let got = fake.got.lock().expect("lock");
            let shipped = got.iter().any(|b| !b.jobs.is_empty());
            assert_eq!(shipped, urgent, "urgent {urgent}: {got:?}");
        }
    }

    #[test]
    fn a_source_read_before_a_flush_is_read_into_the_batch_it_cuts() {
        let (_, mut sh) = slow_shipper();
        let progress = crate::progress::Progress::default();
        let reads = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = Arc::clone(&reads);
        progress.read_before_flush(Arc::new(move |p: &crate::progress::Progress| {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            p.metric("j", metric(f64::from(n)));
        }));
        sh = sh.with_progress(progress);
        let pending = SharedPending::default();
        assert_eq!(sh.seal(&pending), 1, "what the read found is in the batch");
        assert_eq!(sh.seal(&pending), 1, "read again for the next one");
        assert_eq!(reads.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn urgent_records_flush_at_most_once_per_gap() {
        let (fake, sh) = slow_shipper();
        let pending = SharedPending::default();
        let run = running(sh, &pending).await;
        // A NaN every millisecond for a second: about one flush per gap, not 1,000.
        for _ in 0..1000 {
            lock(&pending).metric("j", metric(f64::NAN));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(URGENT_GAP * 2).await;
        run.abort();
        let got = fake.got.lock().expect("lock");
        let flushes = got.iter().filter(|b| !b.jobs.is_empty()).count();
        let most = (Duration::from_secs(1).as_millis() / URGENT_GAP.as_millis()) as usize + 2;
        assert!((2..=most).contains(&flushes), "{flushes} flushes");
        let shipped: usize = got
            .iter()
            .flat_map(|b| &b.jobs)
            .map(|j| j.metrics.len())
            .sum();
        assert_eq!(shipped, 1000, "every NaN shipped");
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_agent_sends_heartbeats() {
        let fake = Fake::default();
        let mut sh = Shipper::new(ShipConfig::default(), fake.clone(), id());
        let pending = SharedPending::default();
        for _ in 0..12 {
            sh.seal(&pending);
            sh.deliver().await;
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        let got = fake.got.lock().expect("lock");
        assert_eq!(got.len(), 3, "at start, then every 5 s");
        assert!(
            got.iter()
                .all(|b| b.heartbeat.is_some() && b.gpus.is_empty())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_batch_is_dropped_not_retried_forever() {
        #[derive(Clone, Default)]
        struct Refuses(Arc<Mutex<u32>>);
        impl Transport for Refuses {
            async fn send(&self, _: Vec<u8>) -> Result<(), SendError> {
                *self.0.lock().expect("lock") += 1;
                Err(SendError::Refused {
                    status: 400,
                    body: "bad".into(),
                })
            }
        }
        let t = Refuses::default();
        let mut sh = Shipper::new(ShipConfig::default(), t.clone(), id());
        let pending = SharedPending::default();
        lock(&pending).gpus([sample(1)]);
        sh.seal(&pending);
        sh.deliver().await;
        assert!(sh.outbox().is_empty());
        assert_eq!(sh.outbox().dropped_records, 0, "not a buffer drop");
        assert_eq!(sh.dropped_records(), 1);
        assert_eq!(*t.0.lock().expect("lock"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn records_the_pending_set_refused_are_reported_in_the_heartbeat() {
        let fake = Fake::default();
        let mut sh = Shipper::new(ShipConfig::default(), fake.clone(), id());
        let pending = SharedPending::default();
        lock(&pending).gpus((0..MAX_PENDING_RECORDS as u64 + 3).map(sample));
        sh.seal(&pending);
        sh.deliver().await;
        assert_eq!(sh.dropped_records(), 3);
        let got = fake.got.lock().expect("lock");
        let hb = got[0].heartbeat.as_ref().expect("heartbeat");
        assert_eq!(hb.dropped_records, 3);
    }

    #[test]
    fn pending_is_bounded() {
        let mut p = Pending::default();
        p.gpus((0..MAX_PENDING_RECORDS as u64 + 10).map(sample));
        assert_eq!(p.len(), MAX_PENDING_RECORDS);
        assert_eq!(p.dropped, 10);
    }
}
