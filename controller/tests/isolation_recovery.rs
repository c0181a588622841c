//! The `warden-controller` binary killed with SIGKILL in the middle of isolating a node
//! for a fatal XID, ten times on SQLite and ten on PostgreSQL, alternately between
//! "isolation intended" and the actuator having run, and between the actuator having run
//! and the action recorded as done (failpoints park it at the exact point). On the next
//! start every such node is isolated: the actuator ran, the node table holds it drained,
//! the action is done and says it was finished on recovery, and the incident's timeline
//! says so. Where the actuator fails on recovery, the node table, the incident's
//! timeline and its alert say "isolation interrupted".

mod support;

use std::ffi::OsString;
use std::path::Path;

use serde_json::Value;
use support::ctl::Ctl;
use support::pg::TestDb;
use warden_testkit::{PATIENCE, wait_until};

/// Kills per store.
const KILLS: usize = 10;
/// Nodes whose agents report.
const FLEET: usize = 40;

fn start(store: &[OsString], config: &Path, failpoint: Option<&str>) -> Ctl {
    let mut args: Vec<&std::ffi::OsStr> = store.iter().map(OsString::as_os_str).collect();
    args.push("--config".as_ref());
    args.push(config.as_os_str());
    Ctl::start_env(&args, failpoint, &[("RUST_LOG", "warn")])
}

fn node_state(c: &Ctl, node: &str) -> Option<Value> {
    c.get("/api/v1/nodes")
        .as_array()?
        .iter()
        .find(|n| n["name"] == node)
        .cloned()
}

fn incident_of(c: &Ctl, node: &str) -> Option<Value> {
    c.incidents().into_iter().find(|i| {
        i["gpus"]
            .as_array()
            .is_some_and(|g| g.iter().any(|g| g["node"] == node))
    })
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

fn kills_mid_isolation(label: &str, store: &[OsString]) {
    let dir = tempfile::tempdir().expect("temp dir");
    // The actuator fails while the flag file exists.
    let flag = dir.path().join("fail");
    let (script, log) = support::recording_actuator(
        dir.path(),
        &format!("sleep 0.1\n[ -e {} ] && exit 1\n", flag.display()),
        "$WARDEN_ACTION $WARDEN_NODE $WARDEN_INCIDENT",
    );
    let config = support::script_remediation_config(dir.path(), &script);
    for k in 0..=KILLS {
        let node = format!("node-{k:02}");
        let point = if k % 2 == 0 {
            "isolate-intended"
        } else {
            "isolate-applied"
        };
        let c = start(store, &config, Some(point));
        // A fleet heard from, so the breaker's cap (a share of the nodes known) has room.
        for n in 0..FLEET {
            c.ingest_heartbeat(&format!("node-{n:02}"), 2 * k as u64 + 1);
        }
        c.ingest_xid(&node, 2 * k as u64 + 2);
        c.wait_for(&format!("failpoint {point} reached"));
        c.kill();
        // The last round: the actuator fails when the isolation is finished.
        let failing = k == KILLS;
        if failing {
            std::fs::write(&flag, "").expect("flag");
        }
        let c = start(store, &config, None);
        let want = if failing {
            "isolation_interrupted"
        } else {
            "drained"
        };
        wait_until(&format!("{node} {want} ({label})"), PATIENCE, || {
            node_state(&c, &node).is_some_and(|n| n["state"] == want)
        });
        wait_until("the isolation finished in the audit log", PATIENCE, || {
            c.actions()
                .iter()
                .filter(|a| a["kind"] == "isolate" && a["target"] == node.as_str())
                .all(|a| a["status"] == "done")
        });
        let isolate: Vec<Value> = c
            .actions()
            .into_iter()
            .filter(|a| a["kind"] == "isolate" && a["target"] == node.as_str())
            .collect();
        assert_eq!(isolate.len(), 1, "one isolation recorded: {isolate:?}");
        let result = isolate[0]["result"].as_str().unwrap_or_default();
        let inc = incident_of(&c, &node).expect("the node's incident");
        let said = timeline(&inc);
        if failing {
            assert!(result.starts_with("isolation interrupted"), "{result}");
            assert!(
                said.iter().any(|w| w.starts_with("isolation interrupted")),
                "{said:?}"
            );
            std::fs::remove_file(&flag).expect("unflag");
        } else {
            assert!(result.contains("finished on recovery"), "{result}");
            assert!(
                said.iter().any(|w| w.contains("finished on recovery")),
                "{said:?}"
            );
            let runs = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(
                runs.lines()
                    .any(|l| l.starts_with(&format!("isolate {node} "))),
                "the actuator isolated {node}: {runs}"
            );
        }
        c.kill();
    }
    eprintln!(
        "{label}: {KILLS} kills mid-isolation, every node isolated on the next start, and one failed finish shown as interrupted"
    );
}

#[test]
fn an_isolation_cut_short_by_a_kill_is_finished_on_the_next_start_on_sqlite() {
    let data = tempfile::tempdir().expect("temp dir");
    kills_mid_isolation(
        "SQLite",
        &["--data-dir".into(), data.path().as_os_str().to_owned()],
    );
}

#[test]
fn an_isolation_cut_short_by_a_kill_is_finished_on_the_next_start_on_postgres() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let db: TestDb = rt.block_on(TestDb::create());
    kills_mid_isolation("PostgreSQL", &["--database-url".into(), db.url().into()]);
}
