//! deploy/slurm: the example configs load with the binaries' own loaders, the systemd
//! units are hardened, and the job hook reports a job's start and end to a real HTTP
//! listener without ever failing the job.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use super::repo;

fn slurm_dir() -> PathBuf {
    repo().join("deploy/slurm")
}

/// `[Section]` → key → every value given (a key may repeat).
type Unit = BTreeMap<String, BTreeMap<String, Vec<String>>>;

fn unit(name: &str) -> Unit {
    let path = slurm_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut out = Unit::new();
    let mut section = String::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = s.to_owned();
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("{name}: not a setting: {line}"));
        out.entry(section.clone())
            .or_default()
            .entry(k.to_owned())
            .or_default()
            .push(v.to_owned());
    }
    out
}

fn one<'a>(u: &'a Unit, key: &str) -> &'a str {
    let v = u["Service"]
        .get(key)
        .unwrap_or_else(|| panic!("no {key}= in [Service]"));
    assert_eq!(v.len(), 1, "{key}= given once");
    &v[0]
}

/// `--config FILE` of ExecStart, mapped to the example file shipped beside the unit.
fn config_of(u: &Unit) -> PathBuf {
    let exec: Vec<&str> = one(u, "ExecStart").split_whitespace().collect();
    let i = exec
        .iter()
        .position(|a| *a == "--config")
        .expect("--config");
    let installed = Path::new(exec[i + 1]);
    assert!(
        installed.starts_with("/etc/warden"),
        "{}",
        installed.display()
    );
    slurm_dir().join(installed.file_name().expect("file name"))
}

/// Where systemd puts credential `name` of `unit`, from LoadCredential=.
fn credential(u: &Unit, unit: &str) -> Vec<PathBuf> {
    u["Service"]
        .get("LoadCredential")
        .into_iter()
        .flatten()
        .map(|c| {
            let id = c.split_once(':').map_or(c.as_str(), |(id, _)| id);
            PathBuf::from(format!("/run/credentials/{unit}/{id}"))
        })
        .collect()
}

fn megabytes(v: &str) -> u64 {
    let (n, m) = match v.as_bytes().last() {
        Some(b'M') => (&v[..v.len() - 1], 1),
        Some(b'G') => (&v[..v.len() - 1], 1024),
        _ => panic!("MemoryMax={v}: give it in M or G"),
    };
    n.parse::<u64>().expect("a number") * m
}

#[test]
fn units_are_hardened_and_their_example_configs_load() {
    let agent = unit("warden-agent.service");
    let ctl = unit("warden-controller.service");
    for (u, name) in [(&agent, "agent"), (&ctl, "controller")] {
        for (k, v) in [
            ("ProtectSystem", "strict"),
            ("NoNewPrivileges", "yes"),
            ("Restart", "on-failure"),
            ("DynamicUser", "yes"),
            ("PrivateTmp", "yes"),
            ("ProtectKernelModules", "yes"),
            ("SystemCallFilter", "@system-service"),
            ("ProtectKernelTunables", "yes"),
            ("ProtectControlGroups", "yes"),
            ("ProtectClock", "yes"),
            ("ProtectHostname", "yes"),
            ("RestrictNamespaces", "yes"),
            ("RestrictRealtime", "yes"),
            ("RestrictSUIDSGID", "yes"),
            ("LockPersonality", "yes"),
            ("SystemCallArchitectures", "native"),
            ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
        ] {
            assert_eq!(one(u, k), v, "{name}: {k}");
        }
        // A transient user of its own, never root.
        assert!(
            !u["Service"].contains_key("User") && !u["Service"].contains_key("Group"),
            "{name}: DynamicUser picks the user; User=/Group= would name one"
        );
        assert_ne!(one(u, "ProtectHome"), "no", "{name}: ProtectHome");
        // The capabilities it holds are the ones it may ever hold.
        assert_eq!(
            one(u, "CapabilityBoundingSet"),
            one(u, "AmbientCapabilities"),
            "{name}: the bounding set is what it holds"
        );
        assert!(!one(u, "ReadOnlyPaths").is_empty(), "{name}: ReadOnlyPaths");
        assert!(u["Install"].contains_key("WantedBy"), "{name}: installable");
    }
    assert_eq!(one(&agent, "CapabilityBoundingSet"), "CAP_SYSLOG");
    assert_eq!(one(&agent, "AmbientCapabilities"), "CAP_SYSLOG");
    assert_eq!(
        one(&ctl, "CapabilityBoundingSet"),
        "",
        "the controller holds no capability"
    );
    // What only the controller can give up: the agent reads the kernel log and opens
    // the NVIDIA device nodes, and NVML's library is not checked for W^X mappings.
    for k in [
        "PrivateDevices",
        "ProtectKernelLogs",
        "MemoryDenyWriteExecute",
    ] {
        assert_eq!(one(&ctl, k), "yes", "controller: {k}");
    }
    assert!(
        megabytes(one(&agent, "MemoryMax")) <= 128,
        "agent budget: 25 MB RSS"
    );
    assert!(megabytes(one(&ctl, "MemoryMax")) >= 1024);

    let agent_cfg = warden_agent::config::AgentConfig::load(
        Some(&config_of(&agent)),
        |_| None,
        &Default::default(),
        Some("gpu-node-001".into()),
    )
    .unwrap_or_else(|e| panic!("deploy/slurm/agent.yaml: {e}"));
    let token = agent_cfg
        .ship
        .token_file
        .clone()
        .expect("the agent sends a token");
    assert!(
        credential(&agent, "warden-agent.service").contains(&token),
        "{} is loaded by the unit",
        token.display()
    );
    assert!(agent_cfg.ship.url.is_some(), "the agent ships somewhere");
    assert_eq!(agent_cfg.listen.port(), 9461);

    let ctl_cfg = warden_controller::config::ControllerConfig::load(
        Some(&config_of(&ctl)),
        |_| None,
        &Default::default(),
    )
    .unwrap_or_else(|e| panic!("deploy/slurm/controller.yaml: {e}"));
    let token = ctl_cfg
        .diagnosis
        .agent_token_file
        .clone()
        .expect("agent token");
    assert!(credential(&ctl, "warden-controller.service").contains(&token));
    let tokens = ctl_cfg.tokens_file.clone().expect("the API needs tokens");
    assert!(
        credential(&ctl, "warden-controller.service").contains(&tokens),
        "{} is loaded by the unit",
        tokens.display()
    );
    assert_eq!(ctl_cfg.listen.port(), 9460);
    assert!(ctl_cfg.diagnosis.agent_url.ends_with(":9461"));
}

/// A request as the listener saw it.
#[derive(Debug)]
struct Seen {
    request_line: String,
    headers: BTreeMap<String, String>,
    body: String,
}

/// Listen on loopback; answer each of `answers` (a status line) to one request.
fn server(answers: Vec<&'static str>) -> (String, std::thread::JoinHandle<Vec<Seen>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let handle = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for status in answers {
            let (stream, _) = listener.accept().expect("accept");
            stream
                .set_read_timeout(Some(Duration::from_secs(10)))
                .expect("timeout");
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut request_line = String::new();
            reader.read_line(&mut request_line).expect("request line");
            let mut headers = BTreeMap::new();
            loop {
                let mut l = String::new();
                reader.read_line(&mut l).expect("header");
                let l = l.trim_end();
                if l.is_empty() {
                    break;
                }
                if let Some((k, v)) = l.split_once(':') {
                    headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
                }
            }
            let len: usize = headers
                .get("content-length")
                .map_or(0, |v| v.parse().expect("length"));
            let mut body = vec![0; len];
            reader.read_exact(&mut body).expect("body");
            let mut w = stream;
            write!(
                w,
                "HTTP/1.1 {status}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
            )
            .expect("answer");
            seen.push(Seen {
                request_line: request_line.trim_end().to_owned(),
                headers,
                body: String::from_utf8(body).expect("utf-8 body"),
            });
        }
        seen
    });
    (url, handle)
}

struct Hook {
    dir: tempfile::TempDir,
}

impl Hook {
    fn new() -> Hook {
        let dir = tempfile::tempdir().expect("temp dir");
        let scontrol = dir.path().join("scontrol");
        std::fs::write(
            &scontrol,
            "#!/bin/bash\ncase \"$1 $2\" in\n\
             'show hostnames') [ \"$3\" = 'gpu[01-02]' ] && printf 'gpu01\\ngpu02\\n' ;;\n\
             'show job') echo 'JobId=4242 JobName=x NumNodes=2 NumTasks=16 NumCPUs=32' ;;\n\
             *) exit 1 ;;\nesac\n",
        )
        .expect("fake scontrol");
        let mut perms = std::fs::metadata(&scontrol).expect("meta").permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&scontrol, perms).expect("chmod");
        std::fs::write(dir.path().join("token"), "s3cret-token\n").expect("token");
        Hook { dir }
    }

    /// Run `script` (a file in deploy/slurm) as slurmctld would, with `url` in the
    /// hook's config file and `env` on top of a Slurm job's environment.
    fn run(&self, script: &str, url: &str, env: &[(&str, &str)]) -> (Output, Duration) {
        let conf = self.dir.path().join("slurm-hook.env");
        std::fs::write(
            &conf,
            format!(
                "WARDEN_CONTROLLER_URL={url}\nWARDEN_HOOK_TIMEOUT_SECS=2\nWARDEN_TOKEN_FILE={}\n",
                self.dir.path().join("token").display()
            ),
        )
        .expect("hook config");
        let mut cmd = Command::new("bash");
        cmd.arg(slurm_dir().join(script))
            .env_clear()
            .env("WARDEN_HOOK_CONFIG", &conf)
            .env("WARDEN_SCONTROL", self.dir.path().join("scontrol"))
            .env("SLURM_JOB_ID", "4242")
            .env("SLURM_JOB_NAME", "llama \"70b\"\\\tpretrain")
            .env("SLURM_JOB_NODELIST", "gpu[01-02]");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let start = Instant::now();
        let out = cmd.output().expect("bash runs the hook");
        (out, start.elapsed())
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The body the hook posts for job 4242 of [`Hook::run`], with `exit` (the exit state
/// fields) added.
fn expected_body(event: &str, exit: serde_json::Value) -> serde_json::Value {
    let mut body = serde_json::json!({
        "event": event,
        "scheduler": "slurm",
        "scheduler_job_id": "4242",
        "name": "llama \"70b\"\\\tpretrain",
        "nodes": ["gpu01", "gpu02"],
        "ranks": 16,
    });
    let fields = body.as_object_mut().expect("an object");
    for (k, v) in exit.as_object().expect("an object") {
        fields.insert(k.clone(), v.clone());
    }
    body
}

#[test]
fn job_hook_reports_start_and_end_with_nodes_ranks_and_exit_state() {
    use serde_json::json;
    let hook = Hook::new();
    // slurmctld's EpilogSlurmctld environment: SLURM_JOB_EXIT_CODE is the wait(2)
    // status (256: exit code 1; 15: killed by SIGTERM), SLURM_JOB_EXIT_CODE2 the same
    // as "exit:signal", SLURM_JOB_DERIVED_EC the highest status of the steps.
    let runs = [
        // A start never carries exit state, whatever the environment says.
        (
            "prolog.sh",
            vec![("SLURM_JOB_EXIT_CODE", "256")],
            "start",
            json!({}),
        ),
        // slurmd's Epilog, or an older Slurm: no exit state to send.
        ("epilog.sh", vec![], "end", json!({})),
        (
            "warden-job-hook.sh",
            vec![
                ("SLURM_SCRIPT_CONTEXT", "epilog_slurmctld"),
                ("SLURM_JOB_EXIT_CODE", "256"),
                ("SLURM_JOB_EXIT_CODE2", "1:0"),
                ("SLURM_JOB_DERIVED_EC", "9"),
            ],
            "end",
            json!({"exit_code": 1, "derived_signal": 9}),
        ),
        (
            "epilog.sh",
            vec![
                ("SLURM_JOB_EXIT_CODE", "15"),
                ("SLURM_JOB_EXIT_CODE2", "0:15"),
                ("SLURM_JOB_DERIVED_EC", "0"),
            ],
            "end",
            json!({"signal": 15, "derived_exit_code": 0}),
        ),
        (
            "epilog.sh",
            vec![
                ("SLURM_JOB_EXIT_CODE", "0"),
                ("SLURM_JOB_DERIVED_EC", "512"),
            ],
            "end",
            json!({"exit_code": 0, "derived_exit_code": 2}),
        ),
        // Only the "exit:signal" form: it is used instead.
        (
            "epilog.sh",
            vec![("SLURM_JOB_EXIT_CODE2", "3:0")],
            "end",
            json!({"exit_code": 3}),
        ),
    ];
    let (url, seen) = server(vec!["202 Accepted"; runs.len()]);
    for (script, env, _, _) in &runs {
        let (out, _) = hook.run(script, &url, env);
        assert!(out.status.success(), "{script}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("reported job 4242"),
            "{script}: {}",
            stderr(&out)
        );
    }
    let seen = seen.join().expect("server thread");
    assert_eq!(seen.len(), runs.len());
    for (s, (script, env, event, exit)) in seen.iter().zip(&runs) {
        assert_eq!(
            s.request_line, "POST /api/v1/jobs/4242/lifecycle HTTP/1.1",
            "{script}"
        );
        assert_eq!(
            s.headers.get("authorization").map(String::as_str),
            Some("Bearer s3cret-token")
        );
        assert_eq!(
            s.headers.get("content-type").map(String::as_str),
            Some("application/json")
        );
        let body: serde_json::Value = serde_json::from_str(&s.body)
            .unwrap_or_else(|e| panic!("{script}: body is not JSON ({e}): {}", s.body));
        assert_eq!(body, expected_body(event, exit.clone()), "{script} {env:?}");
    }
}

#[test]
fn job_hook_leaves_out_a_malformed_exit_state_and_still_reports_the_end() {
    use serde_json::json;
    let hook = Hook::new();
    // Each of these is not a wait status (or not "exit:signal"): the end goes without
    // the field, the hook logs why and exits 0 (a failing epilog can drain the node).
    let runs: Vec<(Vec<(&str, &str)>, serde_json::Value)> = vec![
        (vec![("SLURM_JOB_EXIT_CODE", "abc")], json!({})),
        (vec![("SLURM_JOB_EXIT_CODE", "-1")], json!({})),
        (vec![("SLURM_JOB_EXIT_CODE", "65536")], json!({})),
        (
            vec![("SLURM_JOB_EXIT_CODE", "99999999999999999999999")],
            json!({}),
        ),
        (vec![("SLURM_JOB_EXIT_CODE", "1; echo x")], json!({})),
        (vec![("SLURM_JOB_EXIT_CODE", "256\n")], json!({})),
        (vec![("SLURM_JOB_EXIT_CODE", " 256")], json!({})),
        // A stopped process (0x7f), an exit code beside a signal, a core flag alone.
        (vec![("SLURM_JOB_EXIT_CODE", "127")], json!({})),
        (vec![("SLURM_JOB_EXIT_CODE", "265")], json!({})),
        (vec![("SLURM_JOB_EXIT_CODE", "128")], json!({})),
        (vec![("SLURM_JOB_EXIT_CODE2", "1:9")], json!({})),
        (vec![("SLURM_JOB_EXIT_CODE2", "256:0")], json!({})),
        (vec![("SLURM_JOB_EXIT_CODE2", "0:128")], json!({})),
        (vec![("SLURM_JOB_EXIT_CODE2", "1")], json!({})),
        (vec![("SLURM_JOB_DERIVED_EC", "1e3")], json!({})),
        (vec![("SLURM_JOB_DERIVED_EC", "\u{7}")], json!({})),
        // A malformed status beside a good "exit:signal": that one is sent.
        (
            vec![
                ("SLURM_JOB_EXIT_CODE", "x"),
                ("SLURM_JOB_EXIT_CODE2", "0:9"),
                ("SLURM_JOB_DERIVED_EC", "bad"),
            ],
            json!({"signal": 9}),
        ),
    ];
    let (url, seen) = server(vec!["202 Accepted"; runs.len()]);
    for (env, _) in &runs {
        let (out, _) = hook.run("epilog.sh", &url, env);
        let err = stderr(&out);
        assert!(out.status.success(), "{env:?}: {err}");
        assert!(err.contains("reported job 4242: end"), "{env:?}: {err}");
        assert!(err.contains("the end goes without it"), "{env:?}: {err}");
        assert!(
            !err.contains('\u{7}'),
            "control characters stay out of the log"
        );
    }
    let seen = seen.join().expect("server thread");
    assert_eq!(seen.len(), runs.len());
    for (s, (env, exit)) in seen.iter().zip(&runs) {
        let body: serde_json::Value = serde_json::from_str(&s.body)
            .unwrap_or_else(|e| panic!("{env:?}: body is not JSON ({e}): {}", s.body));
        assert_eq!(body, expected_body("end", exit.clone()), "{env:?}");
    }
}

#[test]
fn job_hook_never_fails_the_job() {
    let hook = Hook::new();
    // Nothing listens: a port that was just free.
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("http://{}", l.local_addr().expect("address"))
    };
    // The hook's own timeout is 2 s; the bound leaves room for a loaded machine to
    // start bash, scontrol and curl (and grows with WARDEN_TEST_PATIENCE).
    let bound = warden_testkit::scaled(Duration::from_secs(10));
    let (out, took) = hook.run("prolog.sh", &closed, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("unreachable"), "{}", stderr(&out));
    eprintln!("the hook gave up on a closed port after {took:?}");
    assert!(took < bound, "{took:?}");

    // A listener that never answers: the hook's timeout ends it.
    let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", silent.local_addr().expect("address"));
    let (out, took) = hook.run("prolog.sh", &url, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    eprintln!("the hook gave up on a silent listener after {took:?} (timeout 2 s)");
    assert!(took < bound, "bounded by the timeout: {took:?}");
    drop(silent);

    // A controller without the endpoint, a job without an id, no way to tell the
    // event, scontrol failing: logged, exit 0.
    let (url, seen) = server(vec!["404 Not Found", "500 Internal Server Error"]);
    let (out, _) = hook.run("epilog.sh", &url, &[]);
    assert!(out.status.success());
    assert!(stderr(&out).contains("404"), "{}", stderr(&out));
    let (out, _) = hook.run(
        "prolog.sh",
        &url,
        &[("SLURM_JOB_NODELIST", "bad[list"), ("SLURM_NTASKS", "8")],
    );
    assert!(out.status.success());
    assert!(stderr(&out).contains("500"), "{}", stderr(&out));
    let seen = seen.join().expect("server thread");
    let body: serde_json::Value = serde_json::from_str(&seen[1].body).expect("JSON");
    assert_eq!(
        body["nodes"],
        serde_json::json!([]),
        "no nodes when scontrol fails"
    );
    assert_eq!(body["ranks"], 8, "SLURM_NTASKS wins");

    let (out, _) = hook.run("prolog.sh", &closed, &[("SLURM_JOB_ID", "")]);
    assert!(out.status.success());
    assert!(stderr(&out).contains("not a job id"), "{}", stderr(&out));
    let (out, _) = hook.run("warden-job-hook.sh", &closed, &[]);
    assert!(out.status.success());
    assert!(
        stderr(&out).contains("cannot tell start from end"),
        "{}",
        stderr(&out)
    );

    let text = std::fs::read_to_string(slurm_dir().join("warden-job-hook.sh")).expect("hook");
    assert!(text.starts_with("#!/usr/bin/env bash\n"));
    assert!(text.contains("\nset -euo pipefail\n"));
    let syntax = Command::new("bash")
        .arg("-n")
        .arg(slurm_dir().join("warden-job-hook.sh"))
        .status()
        .expect("bash -n");
    assert!(syntax.success());
}

#[test]
fn systemd_accepts_every_unit_setting() {
    let Ok(probe) = Command::new("systemd-analyze").arg("--version").output() else {
        let msg = "systemd-analyze is missing (Debian package systemd)";
        assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "{msg}");
        eprintln!("NOT CHECKED by systemd: {msg}");
        return;
    };
    assert!(probe.status.success());
    // `verify` wants the binaries to exist: point ExecStart at one that does.
    let dir = tempfile::tempdir().expect("temp dir");
    let mut units = Vec::new();
    for name in ["warden-agent.service", "warden-controller.service"] {
        let text = std::fs::read_to_string(slurm_dir().join(name)).expect("unit");
        let bin = format!("/usr/local/bin/{}", name.trim_end_matches(".service"));
        assert!(text.contains(&format!("ExecStart={bin} ")), "{name}");
        let path = dir.path().join(name);
        std::fs::write(&path, text.replace(&bin, "/bin/true")).expect("write unit");
        units.push(path);
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&units)
        .output()
        .expect("systemd-analyze verify runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Unknown or misspelled settings are only warnings to systemd: refuse them here.
    assert!(out.status.success() && text.trim().is_empty(), "{text}");
}
