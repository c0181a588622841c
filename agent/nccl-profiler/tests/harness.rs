//! The built cdylib under a C harness that loads and calls it exactly as NCCL does
//! (`tests/harness/harness.c`), for ABI versions 4, 5 and 6; the segments it leaves are
//! read back with `segment::parse`.
//!
//! The harness is compiled with `cc` (or `$CC`). Without a C compiler the tests are
//! skipped, except under `CI=true`, where that is a failure.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

use warden_nccl_profiler::segment::{self, Kind, Phase, Snapshot};
use warden_testkit::{PATIENCE, wait_for};

const SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/harness/harness.c");

/// The plugin library built with this test: cargo builds the package's cdylib next to
/// the rlib the test links, in `target/<profile>/deps` (and copies it one level up).
fn plugin_lib() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps directory");
    let candidates = [
        deps.join("libwarden_nccl_profiler.so"),
        deps.join("../libwarden_nccl_profiler.so"),
    ];
    candidates
        .iter()
        .find(|p| p.exists())
        .cloned()
        .unwrap_or_else(|| panic!("plugin cdylib not found at {candidates:?}"))
}

/// The compiled harness, or `None` (skip) when there is no C compiler outside CI.
fn harness() -> Option<&'static Path> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nccl-harness");
            fs::create_dir_all(&dir).expect("harness build directory");
            let out = dir.join("harness");
            // Several test binaries may build it at once: compile under a name of our
            // own, then rename into place.
            let tmp = dir.join(format!("harness.{}", std::process::id()));
            let result = Command::new(&cc)
                .args([
                    "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-pthread", "-o",
                ])
                .arg(&tmp)
                .arg(SOURCE)
                .arg("-ldl")
                .output();
            let result = match result {
                Ok(r) => r,
                Err(e) => {
                    let msg = format!("no C compiler ({cc}: {e}): NCCL harness tests skipped");
                    assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "{msg}");
                    eprintln!("{msg}");
                    return None;
                }
            };
            assert!(
                result.status.success(),
                "harness does not compile:\n{}",
                String::from_utf8_lossy(&result.stderr)
            );
            fs::rename(&tmp, &out).expect("move the harness into place");
            Some(out)
        })
        .as_deref()
}

fn command(version: u32, scenario: &str, shm: &Path) -> Option<Command> {
    let mut cmd = Command::new(harness()?);
    cmd.arg(plugin_lib())
        .arg(version.to_string())
        .arg(scenario)
        .env("WARDEN_SHM_DIR", shm)
        .env("WARDEN_JOB", "job-7")
        .env("RANK", "5")
        .env("LOCAL_RANK", "1")
        .env("WORLD_SIZE", "8")
        .env_remove("WARDEN_NCCL_PROFILER_MASK")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Some(cmd)
}

/// Run to the end; panic with its output unless it exits 0.
fn run_to_end(mut cmd: Command) -> String {
    let out = cmd.output().expect("run the harness");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "harness failed ({}):\n{text}",
        out.status
    );
    text
}

/// Whether `pid` is stopped (state `T` in `/proc/<pid>/stat`).
fn stopped(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = &s[s.rfind(')')? + 1..];
            rest.split_whitespace().next().map(|st| st == "T")
        })
        .unwrap_or(false)
}

/// Start with HARNESS_STOP and wait until it stopped itself before finalize.
fn start_and_wait_stopped(mut cmd: Command) -> Child {
    let mut child = cmd
        .env("HARNESS_STOP", "1")
        .spawn()
        .expect("spawn the harness");
    // `None` once it stopped itself, its exit status if it exited first.
    let exited = wait_for("the harness to stop itself", PATIENCE, || {
        if stopped(child.id()) {
            return Some(None);
        }
        child.try_wait().ok().flatten().map(Some)
    });
    if let Some(status) = exited {
        let out = child.wait_with_output().expect("harness output");
        panic!(
            "harness exited ({status}) before stopping:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    child
}

/// Let it finalize and exit; panic unless it exits 0.
fn resume_to_end(child: Child) -> String {
    let pid = child.id().to_string();
    let status = Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .expect("kill -CONT");
    assert!(status.success());
    let out = child.wait_with_output().expect("harness output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "harness failed ({}):\n{text}",
        out.status
    );
    text
}

/// Every segment in `dir`, parsed, by comm hash.
fn segments(dir: &Path) -> Vec<(PathBuf, Snapshot)> {
    let mut out: Vec<(PathBuf, Snapshot)> = fs::read_dir(dir)
        .expect("list the segment directory")
        .map(|e| e.expect("directory entry").path())
        .map(|p| {
            let snap = segment::read_retrying(|| fs::read(&p), segment::READ_ATTEMPTS)
                .expect("read the segment")
                .expect("parse the segment");
            (p, snap)
        })
        .collect();
    out.sort_by_key(|(_, s)| s.comm_hash);
    out
}

fn run_scenario(version: u32, mask: Option<&str>) {
    let shm = tempfile::tempdir().expect("segment directory");
    let Some(mut cmd) = command(version, "run", shm.path()) else {
        return;
    };
    if let Some(mask) = mask {
        cmd.env("WARDEN_NCCL_PROFILER_MASK", mask);
    }
    cmd.env("HARNESS_OPS", "200");
    let child = start_and_wait_stopped(cmd);
    let pid = child.id();
    let segs = segments(shm.path());
    assert_eq!(segs.len(), 3, "one segment per communicator: {segs:?}");
    for (i, (path, s)) in segs.iter().enumerate() {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        assert_eq!(
            name,
            format!("nccl-{pid}-{:016x}-{i}.seg", 0xc0ffee00u64 + i as u64)
        );
        assert_eq!(s.abi_version, version);
        assert_eq!(s.pid, pid);
        assert_eq!(
            (s.global_rank, s.local_rank, s.world_size),
            (Some(5), Some(1), Some(8))
        );
        assert_eq!(s.job, "job-7");
        assert_eq!(s.comm_hash, 0xc0ffee00 + i as u64);
        assert_eq!(s.comm_name, ["tp-0", "dp-0", ""][i]);
        assert_eq!((s.nranks, s.comm_rank, s.n_nodes), (4, i as u32, 2));
        assert!(!s.finished);
        assert_eq!(s.torn, 0, "a stopped writer leaves no torn record");
        assert_eq!(s.counters.dropped_events, 0);
        assert_eq!(s.counters.dropped_writes, 0);
        assert_eq!(s.counters.unknown_events, 0);
        assert!(s.completion_observed());
        assert_eq!(s.counters.link_overflow, 0);
        if mask.is_some_and(|m| m.contains("proxystep")) {
            // One send op per operation, each with one step of 4096 bytes, to rank + 1.
            let ops = if i == 0 { 199 + 38 } else { 240 };
            assert_eq!(s.links.len(), 1, "{:?}", s.links);
            let l = s.links[0];
            assert_eq!(
                (l.peer, l.steps, l.bytes),
                ((i as u32 + 1) % 4, ops, ops * 4096)
            );
        } else {
            assert!(s.links.is_empty(), "{:?}", s.links);
        }

        let started = s.coll.started.expect("a collective started");
        let completed = s.coll.completed.expect("a collective completed");
        if i == 0 {
            // The hung one: entered, never enqueued, never completed.
            assert_eq!(s.counters.coll_started, 200);
            assert_eq!(s.counters.coll_completed, 199);
            assert_eq!(started.seq, 200);
            assert_eq!(started.nccl_seq, 199);
            assert_eq!(started.phase, Phase::Started);
            assert_eq!(started.end_ns, 0);
            assert_eq!(s.coll.enqueued.map(|e| e.seq), Some(199));
            assert_eq!(completed.seq, 199);
            assert_eq!(s.counters.p2p_started, 38);
            let of_200: Vec<Phase> = s
                .recent
                .iter()
                .filter(|e| e.kind == Kind::Coll && e.seq == 200)
                .map(|e| e.phase)
                .collect();
            assert_eq!(
                of_200,
                vec![Phase::Started],
                "in flight, nothing after the start"
            );
        } else {
            assert_eq!(s.counters.coll_started, 200);
            assert_eq!(s.counters.coll_completed, 200);
            assert_eq!(started.seq, 200);
            assert_eq!(completed.seq, 200);
            assert_eq!(s.counters.p2p_started, 40);
            assert_eq!(s.counters.p2p_completed, 40);
            assert_eq!(s.p2p.completed.map(|e| e.seq), Some(40));
        }
        assert_eq!(started.op, 1, "AllReduce");
        assert_eq!(started.bytes, 4 * 1024 * started.seq);
        assert_eq!(started.channels, 2);
        assert_eq!(completed.kind, Kind::Coll);
        assert_eq!(completed.phase, Phase::Completed);
        assert_eq!(completed.bytes, 4 * 1024 * completed.seq);
        assert!(completed.start_ns > 0 && completed.enqueued_ns >= completed.start_ns);
        assert!(completed.end_ns >= completed.start_ns);
        assert!(completed.end_ns - completed.start_ns >= completed.xfer_ns as i64);
        // The ring: the newest events, oldest first, consistent.
        assert_eq!(s.recent.len(), 256);
        assert!(s.recent.windows(2).all(|w| w[0].serial + 1 == w[1].serial));
        assert_eq!(
            s.recent.last().map(|e| e.serial),
            Some(s.counters.ring_head)
        );
        for e in &s.recent {
            let bytes = if e.kind == Kind::Coll {
                4 * 1024 * e.seq
            } else {
                512
            };
            assert_eq!(e.bytes, bytes, "{e:?}");
        }
    }
    let text = resume_to_end(child);
    assert!(text.contains("harness: ok"), "{text}");
    let left: Vec<_> = fs::read_dir(shm.path()).expect("list").collect();
    assert!(left.is_empty(), "finalize removes the segments: {left:?}");
}

#[test]
fn v4_communicators_concurrent_threads_and_a_hung_collective() {
    run_scenario(4, None);
}

#[test]
fn v5_communicators_concurrent_threads_and_a_hung_collective() {
    run_scenario(5, None);
}

#[test]
fn v6_communicators_concurrent_threads_and_a_hung_collective() {
    run_scenario(6, None);
}

#[test]
fn v5_with_kernel_channel_and_proxy_step_events() {
    run_scenario(5, Some("default+kernelch+proxystep"));
}

/// The `links` scenario: per collective, send ProxyOps to peers 1 and 2 (8 steps of
/// 64 KiB each, SendWait then stop; peer 2's steps wait 300 µs longer) and a receive
/// ProxyOp from peer 3, under `default+proxystep`.
fn links(version: u32) {
    const OPS: u64 = 40;
    let shm = tempfile::tempdir().expect("segment directory");
    let Some(mut cmd) = command(version, "links", shm.path()) else {
        return;
    };
    cmd.env("WARDEN_NCCL_PROFILER_MASK", "default+proxystep")
        .env("HARNESS_OPS", OPS.to_string());
    let child = start_and_wait_stopped(cmd);
    let segs = segments(shm.path());
    assert_eq!(segs.len(), 1);
    let s = &segs[0].1;
    assert_eq!(s.event_mask, 0x1e, "coll, p2p, proxyop, proxystep");
    // Completion works as without step timing.
    assert_eq!(s.counters.coll_started, OPS);
    assert_eq!(s.counters.coll_completed, OPS);
    assert_eq!(s.coll.completed.map(|e| e.seq), Some(OPS));
    assert_eq!(s.counters.child_events, 3 * OPS);
    assert_eq!(s.counters.link_overflow, 0);
    assert_eq!(s.counters.dropped_events + s.counters.dropped_writes, 0);
    // Send steps only: peers 1 and 2, never the receive op's peer 3.
    let mut links = s.links.clone();
    links.sort_by_key(|l| l.peer);
    let steps = OPS * 8;
    let per_peer: Vec<(u32, u64, u64)> = links.iter().map(|l| (l.peer, l.steps, l.bytes)).collect();
    assert_eq!(
        per_peer,
        vec![(1, steps, steps * 65536), (2, steps, steps * 65536)]
    );
    let (fast, slow) = (links[0], links[1]);
    assert!(
        slow.busy_ns >= steps * 300_000,
        "each of peer 2's steps waited 300 µs: {slow:?}"
    );
    assert!(
        slow.busy_ns > fast.busy_ns,
        "the slow link has the larger time: {fast:?} vs {slow:?}"
    );
    let text = resume_to_end(child);
    assert!(text.contains("harness: ok"), "{text}");
}

#[test]
fn v4_proxy_steps_time_each_peer_link() {
    links(4);
}

#[test]
fn v5_proxy_steps_time_each_peer_link() {
    links(5);
}

#[test]
fn v6_proxy_steps_time_each_peer_link() {
    links(6);
}

fn garbage(version: u32) {
    let shm = tempfile::tempdir().expect("segment directory");
    let Some(cmd) = command(version, "garbage", shm.path()) else {
        return;
    };
    let child = start_and_wait_stopped(cmd);
    let segs = segments(shm.path());
    assert_eq!(segs.len(), 1);
    let s = &segs[0].1;
    assert_eq!(s.comm_name, "");
    assert_eq!(s.counters.coll_started, 3);
    assert_eq!(s.counters.foreign_events, 1, "the PXN proxy op");
    assert!(s.counters.unknown_events >= 3, "{:?}", s.counters);
    // The collective with null names: unknown op, no bytes; completed through its
    // proxy op. The plain one after it: enqueued.
    let completed = s.coll.completed.expect("completed");
    assert_eq!((completed.seq, completed.op, completed.bytes), (1, 0, 0));
    assert_eq!(completed.channels, 255);
    let enqueued = s.coll.enqueued.expect("enqueued");
    assert_eq!((enqueued.seq, enqueued.op, enqueued.bytes), (3, 4, 80));
    assert_eq!(
        (enqueued.nccl_seq, enqueued.peer, enqueued.channels),
        (7, 3, 4)
    );
    let text = resume_to_end(child);
    assert!(text.contains("harness: ok"), "{text}");
}

#[test]
fn v4_null_and_unknown_fields_do_not_crash() {
    garbage(4);
}

#[test]
fn v5_null_and_unknown_fields_do_not_crash() {
    garbage(5);
}

#[test]
fn v6_null_and_unknown_fields_do_not_crash() {
    garbage(6);
}

#[test]
fn missing_segment_directory_disables_the_plugin_and_the_job_goes_on() {
    let base = tempfile::tempdir().expect("temporary directory");
    let missing = base.path().join("not-there");
    for version in [4, 5, 6] {
        let Some(cmd) = command(version, "disabled", &missing) else {
            return;
        };
        let text = run_to_end(cmd);
        assert!(text.contains("is not there"), "{text}");
    }
    assert!(
        !missing.exists(),
        "the plugin does not create the directory"
    );
}

#[test]
fn segment_path_that_is_a_file_disables_the_plugin() {
    let base = tempfile::tempdir().expect("temporary directory");
    let file = base.path().join("a-file");
    fs::write(&file, b"x").expect("write a file");
    let Some(cmd) = command(5, "disabled", &file) else {
        return;
    };
    run_to_end(cmd);
}

#[test]
fn read_only_segment_directory_disables_the_plugin_and_the_job_goes_on() {
    use std::os::unix::fs::PermissionsExt;
    // Under the target directory rather than /tmp's private temp dirs: the harness
    // gives up root for this case and must still reach the directory.
    let base =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ro-shm-{}", std::process::id()));
    let dir = base.join("warden");
    fs::create_dir_all(&dir).expect("create the directory");
    fs::set_permissions(&base, fs::Permissions::from_mode(0o755)).expect("chmod base");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o555)).expect("chmod read-only");
    let result = std::panic::catch_unwind(|| {
        for version in [4, 6] {
            let Some(cmd) = command(version, "disabled-unprivileged", &dir) else {
                return;
            };
            let text = run_to_end(cmd);
            assert!(text.contains("cannot create segment"), "{text}");
        }
    });
    let _ = fs::set_permissions(&dir, fs::Permissions::from_mode(0o755));
    let _ = fs::remove_dir_all(&base);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}
