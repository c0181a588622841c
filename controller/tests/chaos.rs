//! Chaos against the real `warden-controller` binary.
//!
//! A storm of 100 fatal GPU faults (XID 79, one per node) while remediation acts
//! through the script actuator and the controller is killed with SIGKILL at random
//! moments and started again on the same store (an SQLite data dir, and a fresh
//! PostgreSQL database): no incident lost or split, every incident decided once, no
//! node isolated but by its own isolation (one a kill cut short is finished, so applied
//! again, on the next start).
//! And a PostgreSQL server of the test's own stopped and started under a running
//! controller: the controller says it is not ready, keeps running, and recovers by
//! itself — the incidents that came during the outage are stored once it is back.
//!
//! `WARDEN_CHAOS_SEED` replays a run of the storm (every run prints its seed).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::ctl::{Ctl, batch, post_batch, xid_batch};
use support::pg::{PrivatePg, TestDb};
use warden_testkit::{PATIENCE, wait_for, wait_until};

/// Nodes in the storm, each with one fatal XID of its own.
const NODES: usize = 100;
/// Kills at least, one every 0.5–3 s.
const MIN_KILLS: u32 = 5;
/// Pause between two faults of one sender.
const FAULT_EVERY: Duration = Duration::from_millis(100);
/// How often every node's agent sends a heartbeat.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// splitmix64: a small seeded generator, so a failing run can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A duration between `lo` and `hi` milliseconds.
    fn between_ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next() % (hi - lo + 1))
    }
}

fn seed() -> u64 {
    std::env::var("WARDEN_CHAOS_SEED")
        .ok()
        .map(|s| s.parse().expect("WARDEN_CHAOS_SEED is a number"))
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_nanos() as u64
        })
}

fn node(i: usize) -> String {
    format!("node-{i:03}")
}

/// A script actuator that takes a while (as a real one does, so kills land inside
/// it) and then appends `ACTION NODE INCIDENT` to `log`.
fn recorder(dir: &Path) -> (PathBuf, PathBuf) {
    support::recording_actuator(
        dir,
        "sleep 0.1\n",
        "$WARDEN_ACTION $WARDEN_NODE $WARDEN_INCIDENT",
    )
}

/// Start the controller and wait until it leads (on PostgreSQL, once the lease of the
/// one killed before it has lapsed): the kills are timed from then.
fn start(store: &[OsString], config: &Path) -> Ctl {
    let mut args: Vec<&std::ffi::OsStr> = store.iter().map(OsString::as_os_str).collect();
    args.push("--config".as_ref());
    args.push(config.as_os_str());
    let ctl = Ctl::start_env(&args, None, &[("RUST_LOG", "warn")]);
    wait_until("the controller leads", PATIENCE, || {
        metric(ctl.port, "warden_controller_leader") == Some(1.0)
    });
    ctl
}

/// `GET path` on a controller that may be between lives: `None` unless 200 and JSON.
fn get_json(port: u16, path: &str) -> Option<Value> {
    let (status, body) = support::http_get(port, path)?;
    (status == 200).then(|| serde_json::from_str(&body).ok())?
}

/// A node's agent: the sequence number of its last batch, and its fault's state.
#[derive(Default)]
struct Slot {
    seq: u64,
    fault: Fault,
}

#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum Fault {
    #[default]
    NotYet,
    /// Sent, not acknowledged yet: the agent sends nothing newer meanwhile (it
    /// delivers oldest first).
    Pending,
    Acked,
}

/// The agents of the storm: each node sends a heartbeat every second and, in turn, one
/// batch with a fatal XID, re-sent until the controller acknowledges it (200), as an
/// agent does. `SENDERS` nodes report their faults at a time.
struct Agents {
    /// The port of the controller alive now; 0 while it is being restarted.
    port: Arc<AtomicU16>,
    /// Faults acknowledged so far.
    acked: Arc<AtomicU64>,
    /// Deliveries of a fault that got no answer or an error, re-sent.
    resent: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// Nodes reporting their faults at the same time.
const SENDERS: usize = 4;

impl Agents {
    fn start(port: u16) -> Agents {
        let port = Arc::new(AtomicU16::new(port));
        let acked = Arc::new(AtomicU64::new(0));
        let resent = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let slots: Arc<Vec<Mutex<Slot>>> =
            Arc::new((0..NODES).map(|_| Mutex::new(Slot::default())).collect());
        let timeout = Duration::from_secs(10);
        let mut threads = Vec::new();
        // Heartbeats: every node each second, and at once to a controller just started
        // (it knows no agent yet).
        {
            let (port, slots, stop) = (port.clone(), slots.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                let mut beaten = 0u16;
                let mut last = Instant::now();
                while !stop.load(Ordering::SeqCst) {
                    let now = port.load(Ordering::SeqCst);
                    if now != 0 && (now != beaten || last.elapsed() >= HEARTBEAT_EVERY) {
                        beaten = now;
                        last = Instant::now();
                        for (i, slot) in slots.iter().enumerate() {
                            let mut slot = slot.lock().expect("slot");
                            if slot.fault == Fault::Pending {
                                continue;
                            }
                            slot.seq += 1;
                            // A lost heartbeat is made up for by the next one.
                            let _ = post_batch(now, &batch(&node(i), slot.seq, vec![]), timeout);
                        }
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }));
        }
        for k in 0..SENDERS {
            let (port, slots, stop) = (port.clone(), slots.clone(), stop.clone());
            let (acked, resent) = (acked.clone(), resent.clone());
            threads.push(std::thread::spawn(move || {
                for i in (k..NODES).step_by(SENDERS) {
                    let fault = {
                        let mut slot = slots[i].lock().expect("slot");
                        slot.seq += 1;
                        slot.fault = Fault::Pending;
                        xid_batch(&node(i), slot.seq)
                    };
                    loop {
                        if stop.load(Ordering::SeqCst) {
                            return;
                        }
                        let now = port.load(Ordering::SeqCst);
                        if now == 0 {
                            std::thread::sleep(Duration::from_millis(20));
                            continue;
                        }
                        if post_batch(now, &fault, timeout) == Some(200) {
                            break;
                        }
                        resent.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    slots[i].lock().expect("slot").fault = Fault::Acked;
                    acked.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(FAULT_EVERY);
                }
            }));
        }
        Agents {
            port,
            acked,
            resent,
            stop,
            threads,
        }
    }

    /// Whether every fault was acknowledged.
    fn done(&self) -> bool {
        self.acked.load(Ordering::SeqCst) == NODES as u64
    }
}

impl Drop for Agents {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn timeline(inc: &Value) -> Vec<String> {
    inc["timeline"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(|e| e["what"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The storm under SIGKILL on the store `store` names; `label` for the printout.
fn storm_under_sigkill(label: &str, store: &[OsString]) {
    let started = Instant::now();
    let seed = seed();
    eprintln!("chaos storm ({label}): seed {seed} (WARDEN_CHAOS_SEED={seed} replays it)");
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().expect("temp dir");
    let (script, log) = recorder(dir.path());
    let config = support::script_remediation_config(dir.path(), &script);

    // A bound on the whole storm, so that one that cannot get through ends the test.
    let limit = warden_testkit::scaled(PATIENCE * 3);
    let mut ctl = start(store, &config);
    let agents = Agents::start(ctl.port);
    let mut kills = 0u32;
    let mut acked_at_kill = Vec::new();
    loop {
        // Wait 0.5–3 s, or less once every fault is in and enough kills were made.
        let wait = rng.between_ms(500, 3000);
        let until = Instant::now() + wait;
        while Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        if agents.done() && kills >= MIN_KILLS {
            break;
        }
        agents.port.store(0, Ordering::SeqCst);
        ctl.kill();
        kills += 1;
        acked_at_kill.push(agents.acked.load(Ordering::SeqCst));
        ctl = start(store, &config);
        agents.port.store(ctl.port, Ordering::SeqCst);
        assert!(
            started.elapsed() < limit,
            "the storm did not get through in {limit:?} ({} of {NODES} faults acknowledged)",
            agents.acked.load(Ordering::SeqCst)
        );
    }
    assert_eq!(agents.acked.load(Ordering::SeqCst), NODES as u64);

    // Every fault is decided and acted on by the controller alive now.
    let port = ctl.port;
    let isolations = |port: u16| -> Vec<Value> {
        get_json(port, "/api/v1/actions?limit=1000")
            .and_then(|a| a.as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .filter(|a| a["kind"] == "isolate")
            .collect()
    };
    // Each incident is decided once and its isolation recorded (as intended, at least)
    // in the same write; more than one per node is caught below.
    wait_until("every fault's isolation recorded", PATIENCE, || {
        isolations(port).len() >= NODES
    });
    // One more kill, and a last start: what follows is read from the store.
    ctl.kill();
    let ctl = start(store, &config);
    agents.port.store(ctl.port, Ordering::SeqCst);
    wait_until("no action left intended", PATIENCE, || {
        get_json(ctl.port, "/api/v1/actions?limit=1000")
            .and_then(|a| a.as_array().cloned())
            .is_some_and(|a| a.iter().all(|a| a["status"] == "done"))
    });
    let incidents: Vec<Value> = ctl
        .get("/api/v1/incidents?limit=1000")
        .as_array()
        .expect("array")
        .clone();
    let actions: Vec<Value> = ctl
        .get("/api/v1/actions?limit=1000")
        .as_array()
        .expect("array")
        .clone();
    let remediation = ctl.get("/api/v1/remediation");
    let script_lines: Vec<String> = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    let resent = agents.resent.load(Ordering::SeqCst);
    drop(agents);
    ctl.kill();

    // None lost, none split: one gpu_fault incident per node.
    let mut per_node: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for inc in &incidents {
        assert_eq!(inc["kind"], "gpu_fault", "{inc}");
        let nodes: BTreeSet<String> = inc["gpus"]
            .as_array()
            .expect("gpus")
            .iter()
            .filter_map(|g| g["node"].as_str().map(str::to_owned))
            .chain(
                inc["nodes"]
                    .as_array()
                    .expect("nodes")
                    .iter()
                    .filter_map(|n| n.as_str().map(str::to_owned)),
            )
            .collect();
        assert_eq!(nodes.len(), 1, "one node per incident: {inc}");
        for n in nodes {
            per_node.entry(n).or_default().push(inc);
        }
    }
    let missing: Vec<String> = (0..NODES)
        .map(node)
        .filter(|n| !per_node.contains_key(n))
        .collect();
    assert!(missing.is_empty(), "incidents lost for {missing:?}");
    let split: Vec<&String> = per_node
        .iter()
        .filter(|(_, v)| v.len() > 1)
        .map(|(n, _)| n)
        .collect();
    assert!(split.is_empty(), "incidents split for {split:?}");
    assert_eq!(incidents.len(), NODES);

    // Every incident decided once: exactly one isolation recorded for it, all finished;
    // at most one isolation per node in the audit log.
    let isolate: Vec<&Value> = actions.iter().filter(|a| a["kind"] == "isolate").collect();
    assert!(
        actions.iter().all(|a| a["status"] == "done"),
        "an action left intended after the last start: {actions:?}"
    );
    assert!(
        !actions.iter().any(|a| a["kind"] == "breaker_trip"),
        "the breaker tripped: {remediation}"
    );
    let mut isolations_per_node: BTreeMap<&str, usize> = BTreeMap::new();
    let mut isolations_per_incident: BTreeMap<&str, usize> = BTreeMap::new();
    for a in &isolate {
        *isolations_per_node
            .entry(a["target"].as_str().expect("target"))
            .or_default() += 1;
        *isolations_per_incident
            .entry(a["incident"].as_str().expect("incident"))
            .or_default() += 1;
    }
    let twice: Vec<_> = isolations_per_node
        .iter()
        .filter(|(_, n)| **n > 1)
        .collect();
    assert!(
        twice.is_empty(),
        "isolated twice in the audit log: {twice:?}"
    );
    for inc in &incidents {
        let id = inc["id"].as_str().expect("id");
        assert_eq!(
            isolations_per_incident.get(id),
            Some(&1),
            "incident {id} decided once, with one isolation recorded: {inc}"
        );
        let decided = timeline(inc)
            .iter()
            .filter(|w| w.starts_with("policy rule"))
            .count();
        assert!(decided <= 1, "decided {decided} times: {inc}");
    }

    // The actuator ran at most once per node; each run is in the audit log, and each
    // isolation the audit log says was done ran.
    let mut runs: BTreeMap<String, usize> = BTreeMap::new();
    for line in &script_lines {
        let mut words = line.split_whitespace();
        assert_eq!(words.next(), Some("isolate"), "{line}");
        *runs
            .entry(words.next().expect("node").to_owned())
            .or_default() += 1;
    }
    let interrupted: Vec<&&Value> = isolate
        .iter()
        .filter(|a| {
            a["result"]
                .as_str()
                .is_some_and(|r| r.contains("finished on recovery"))
        })
        .collect();
    // Isolation is idempotent: one a kill cut short is applied again on the next start,
    // so its node may see the actuator twice; any other node once.
    let again: Vec<_> = runs
        .iter()
        .filter(|(n, k)| {
            let finished_again = interrupted.iter().any(|a| a["target"] == n.as_str());
            **k > if finished_again { 2 } else { 1 }
        })
        .collect();
    assert!(
        again.is_empty(),
        "the actuator isolated a node more often than its isolation was started: {again:?}"
    );
    for a in &isolate {
        let target = a["target"].as_str().expect("target");
        let result = a["result"].as_str().unwrap_or_default();
        if result.ends_with(": done") {
            assert_eq!(runs.get(target), Some(&1), "done but never run: {a}");
        }
        if result.contains("finished on recovery") && !result.contains("left alone") {
            assert!(runs.contains_key(target), "finished but never run: {a}");
        }
    }
    for n in runs.keys() {
        assert!(
            isolations_per_node.contains_key(n.as_str()),
            "the actuator isolated {n}, and the audit log does not say so"
        );
    }
    let ran_in_interrupted = interrupted
        .iter()
        .filter(|a| runs.contains_key(a["target"].as_str().unwrap_or_default()))
        .count();
    assert!(kills >= MIN_KILLS);
    eprintln!(
        "chaos storm ({label}): seed {seed}; {kills} SIGKILLs (faults acknowledged at each: \
         {acked_at_kill:?}); {} fault deliveries unanswered and re-sent; {} incidents, \
         {} isolations recorded, {} runs of the actuator, {} isolations interrupted by a \
         kill and finished on the next start ({ran_in_interrupted} of them had run the \
         actuator); wall {:.1} s",
        resent,
        incidents.len(),
        isolate.len(),
        script_lines.len(),
        interrupted.len(),
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn a_fault_storm_under_sigkill_loses_nothing_and_repeats_nothing_on_sqlite() {
    let data = tempfile::tempdir().expect("temp dir");
    storm_under_sigkill(
        "SQLite",
        &["--data-dir".into(), data.path().as_os_str().to_owned()],
    );
}

#[test]
fn a_fault_storm_under_sigkill_loses_nothing_and_repeats_nothing_on_postgres() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let db: TestDb = rt.block_on(TestDb::create());
    storm_under_sigkill("PostgreSQL", &["--database-url".into(), db.url().into()]);
}

/// How long the test's PostgreSQL stays down: past the leader lease (5 s), so the
/// controller stops acting and must take the lease back by itself.
const OUTAGE: Duration = Duration::from_secs(10);

fn status(port: u16, path: &str) -> Option<u16> {
    support::http_get(port, path).map(|(s, _)| s)
}

fn metric(port: u16, name: &str) -> Option<f64> {
    let (_, text) = support::http_get(port, "/metrics")?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// The nodes of the stored gpu_fault incidents, as the API reads them from the store.
fn stored_fault_nodes(port: u16) -> Option<Vec<String>> {
    let incidents = get_json(port, "/api/v1/incidents?limit=1000")?;
    let mut nodes: Vec<String> = incidents
        .as_array()?
        .iter()
        .filter(|i| i["kind"] == "gpu_fault")
        .flat_map(|i| i["gpus"].as_array().cloned().unwrap_or_default())
        .filter_map(|g| g["node"].as_str().map(str::to_owned))
        .collect();
    nodes.sort();
    Some(nodes)
}

/// An agent that posts one fault from `node` to `port`, re-sending until it is
/// acknowledged (through an outage and the recovery after it); returns when it was.
fn agent_fault(port: u16, node: &str) -> std::thread::JoinHandle<Instant> {
    let fault = xid_batch(node, 2);
    std::thread::spawn(move || {
        wait_for("the fault acknowledged", PATIENCE * 3, || {
            (post_batch(port, &fault, Duration::from_secs(15)) == Some(200)).then(Instant::now)
        })
    })
}

#[test]
fn a_postgres_restart_under_a_running_controller_is_recovered_from_by_itself() {
    let Some(pg) = PrivatePg::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("controller.yaml");
    std::fs::write(&config, "diagnosis:\n  enabled: false\n").expect("write config");
    let url = pg.url();
    let mut ctl = Ctl::start_env(
        &[
            "--database-url".as_ref(),
            url.as_ref(),
            "--config".as_ref(),
            config.as_os_str(),
        ],
        None,
        &[],
    );
    let port = ctl.port;
    wait_until("leading", PATIENCE, || {
        metric(port, "warden_controller_leader") == Some(1.0)
    });
    ctl.ingest_xid("node-a", 1);
    wait_until("node-a's incident stored", PATIENCE, || {
        stored_fault_nodes(port).is_some_and(|n| n == ["node-a"])
    });
    assert_eq!(status(port, "/readyz"), Some(200));

    // The database goes away, as in a crash: every connection cut. It stays away for
    // OUTAGE at least, and until the controller has shown the outage (not ready, not
    // leading) and node-c's fault has come: a loaded machine may take longer than the
    // lease to notice.
    pg.down();
    let down = Instant::now();
    let b = agent_fault(port, "node-b");
    let mut not_ready = None;
    let mut not_leading = None;
    let mut c = None;
    let give_up = warden_testkit::scaled(OUTAGE + PATIENCE);
    while down.elapsed() < OUTAGE || not_ready.is_none() || not_leading.is_none() || c.is_none() {
        assert!(ctl.alive(), "the controller exited during the outage");
        assert!(
            down.elapsed() < give_up,
            "the outage not shown within {give_up:?}: /readyz 503 after {not_ready:?}, \
             leader gauge 0 after {not_leading:?}"
        );
        if not_ready.is_none() && status(port, "/readyz").is_some_and(|s| s == 503) {
            not_ready = Some(down.elapsed());
        }
        if not_leading.is_none() && metric(port, "warden_controller_leader") == Some(0.0) {
            not_leading = Some(down.elapsed());
        }
        // A fault that comes once the lease has lapsed (and the controller has stopped
        // acting on it).
        if c.is_none() && not_leading.is_some() && down.elapsed() >= Duration::from_secs(6) {
            c = Some(agent_fault(port, "node-c"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let not_ready = not_ready.expect("/readyz never said 503 while the database was down");
    let not_leading =
        not_leading.expect("the controller kept acting as leader on a lease it could not renew");

    // The database comes back; nothing is done to the controller.
    pg.up();
    let up = Instant::now();
    let limit = warden_testkit::scaled(PATIENCE);
    let mut ready = None;
    let mut stored = None;
    while ready.is_none() || stored.is_none() {
        assert!(ctl.alive(), "the controller exited after the outage");
        assert!(
            up.elapsed() < limit,
            "not recovered {limit:?} after the database came back: ready {ready:?}, \
             stored {:?}",
            stored_fault_nodes(port)
        );
        if ready.is_none() && status(port, "/readyz") == Some(200) {
            ready = Some(up.elapsed());
        }
        if stored.is_none()
            && stored_fault_nodes(port).is_some_and(|n| n == ["node-a", "node-b", "node-c"])
        {
            stored = Some(up.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let acked_b = b.join().expect("node-b's agent");
    let acked_c = c
        .expect("node-c's agent started")
        .join()
        .expect("node-c's agent");
    assert_eq!(metric(port, "warden_controller_leader"), Some(1.0));
    // Said when the controller stopped acting, before it led again; the line may still
    // be on its way through the pipe.
    wait_until("the outage noticed in the log", PATIENCE, || {
        ctl.printed()
            .contains("stopped acting until the leader lease is back")
    });
    let printed = ctl.printed();
    assert!(!printed.contains("panicked"), "a panic:\n{printed}");
    // The store holds them: a new controller reads the same three back, each once.
    ctl.kill();
    let ctl = Ctl::start_env(
        &[
            "--database-url".as_ref(),
            url.as_ref(),
            "--config".as_ref(),
            config.as_os_str(),
        ],
        None,
        &[],
    );
    wait_until("the incidents read back", PATIENCE, || {
        stored_fault_nodes(ctl.port).is_some_and(|n| n == ["node-a", "node-b", "node-c"])
    });
    ctl.kill();
    eprintln!(
        "postgres restart: outage {:.1} s; /readyz 503 after {:.1} s, leader gauge 0 after \
         {:.1} s; after the database came back: /readyz 200 in {:.1} s, all three incidents \
         stored in {:.1} s (node-b acknowledged {:.1} s after the outage began, node-c \
         {:.1} s after the database came back)",
        OUTAGE.as_secs_f64(),
        not_ready.as_secs_f64(),
        not_leading.as_secs_f64(),
        ready.expect("ready").as_secs_f64(),
        stored.expect("stored").as_secs_f64(),
        acked_b.duration_since(down).as_secs_f64(),
        acked_c.saturating_duration_since(up).as_secs_f64(),
    );
}
