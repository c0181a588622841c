//! The controller's traces of the incident pipeline, sent over OTLP/HTTP to a collector
//! that this test plays: a fault is ingested, detected, written to the store and
//! acknowledged, and each step arrives as a span — decoded from the protobuf the real
//! exporter sends — with the incident it concerns. A collector that is not there costs
//! the pipeline nothing.

mod support;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use support::ctl::Ctl;
use warden_testkit::{PATIENCE, wait_until};

/// What the collector received: (path, content type, body) per request.
type Received = Arc<Mutex<Vec<(String, String, Vec<u8>)>>>;

/// A minimal OTLP/HTTP collector: answers every POST with 200 and keeps the body.
fn collector() -> (u16, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let got: Received = Arc::default();
    let keep = got.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let keep = keep.clone();
            std::thread::spawn(move || serve(conn, &keep));
        }
    });
    (port, got)
}

fn serve(conn: TcpStream, keep: &Received) {
    let mut out = conn.try_clone().expect("clone");
    let mut r = BufReader::new(conn);
    loop {
        let mut request_line = String::new();
        if r.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let path = request_line
            .split(' ')
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        let mut headers = HashMap::new();
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
            }
        }
        let len: usize = headers
            .get("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let ct = headers.get("content-type").cloned().unwrap_or_default();
        keep.lock().expect("lock").push((path, ct, body));
        let answer = "HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\n\
                      Content-Length: 0\r\n\r\n";
        if out.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

fn text(v: &Option<AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        _ => String::new(),
    }
}

fn attr(attrs: &[KeyValue], key: &str) -> Option<String> {
    attrs.iter().find(|a| a.key == key).map(|a| text(&a.value))
}

/// Every span received so far, with its resource's service name.
fn spans(got: &Received) -> Vec<(String, Span)> {
    let mut out = Vec::new();
    for (path, ct, body) in got.lock().expect("lock").iter() {
        assert_eq!(path, "/v1/traces", "OTLP/HTTP traces path");
        assert_eq!(ct, "application/x-protobuf");
        let req = ExportTraceServiceRequest::decode(body.as_slice()).expect("OTLP protobuf");
        for rs in req.resource_spans {
            let service = rs
                .resource
                .as_ref()
                .and_then(|r| attr(&r.attributes, "service.name"))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    out.push((service.clone(), s));
                }
            }
        }
    }
    out
}

fn pipeline_is_traced_with(got: &Received, env: &[(&str, &str)], config: Option<String>) {
    let data = tempfile::tempdir().expect("temp dir");
    let conf = data.path().join("controller.yaml");
    let mut args = vec![OsStr::new("--data-dir"), data.path().as_os_str()];
    if let Some(c) = &config {
        std::fs::write(&conf, c).expect("write config");
        args.extend([OsStr::new("--config"), conf.as_os_str()]);
    }
    let mut env = env.to_vec();
    env.push(("OTEL_BSP_SCHEDULE_DELAY", "100"));
    let c = Ctl::start_env(&args, None, &env);
    c.ingest_xid("node-7", 1);
    wait_until("the GPU fault incident", PATIENCE, || {
        c.incidents().len() == 1
    });
    let id = c.incidents()[0]["id"].as_str().expect("id").to_owned();
    let (status, body) = c.call(
        "POST",
        &format!("/api/v1/incidents/{id}/ack"),
        "application/json",
        br#"{"note":"on it"}"#,
    );
    assert_eq!(status, 200, "{body}");
    // Spans are exported in batches as they end: wait for every one the checks below
    // read, not only for the last to end.
    let names_incident = |s: &Span| {
        s.events.iter().any(|e| {
            e.name == "incident changed"
                && attr(&e.attributes, "incident").as_deref() == Some(id.as_str())
        })
    };
    wait_until(
        "the spans of the ingest, the pass that opened the incident, its store write \
         and the acknowledgement",
        PATIENCE,
        || {
            let all = spans(got);
            let has = |n: &str, also: &dyn Fn(&Span) -> bool| {
                all.iter().any(|(_, s)| s.name == n && also(s))
            };
            let opening = all
                .iter()
                .find(|(_, s)| s.name == "detect_pass" && names_incident(s));
            has("ingest", &|_| true)
                && has("action", &|s| {
                    attr(&s.attributes, "kind").as_deref() == Some("acknowledge")
                })
                && opening.is_some_and(|(_, p)| {
                    has("store.sync", &|s| {
                        s.parent_span_id == p.span_id && s.trace_id == p.trace_id
                    })
                })
        },
    );
    let all = spans(got);
    assert!(
        all.iter().all(|(svc, _)| svc == "warden-controller"),
        "service name"
    );
    let named = |n: &str| -> Vec<&Span> {
        all.iter()
            .filter(|(_, s)| s.name == n)
            .map(|(_, s)| s)
            .collect()
    };
    // The batch came in.
    let ingest = named("ingest");
    assert!(
        ingest.iter().any(|s| {
            attr(&s.attributes, "accepted").is_some_and(|n| n.parse::<u64>().is_ok_and(|n| n > 0))
                && attr(&s.attributes, "bytes").is_some()
        }),
        "an ingest span for the accepted batch: {ingest:?}"
    );
    // A detector pass opened the incident, said so in an event, and its store write is
    // its child.
    let passes = named("detect_pass");
    let opening = passes
        .iter()
        .find(|s| names_incident(s))
        .expect("a detector pass whose event names the incident");
    assert_eq!(
        attr(&opening.attributes, "changes").as_deref(),
        Some("1"),
        "the pass that opened it made one change"
    );
    assert!(
        named("store.sync")
            .iter()
            .any(|s| s.parent_span_id == opening.span_id && s.trace_id == opening.trace_id),
        "the pass's store write is its child span"
    );
    // The acknowledgement is an action span naming the incident.
    let action = named("action");
    let ack = action
        .iter()
        .find(|s| attr(&s.attributes, "kind").as_deref() == Some("acknowledge"))
        .expect("an acknowledge action span");
    assert_eq!(
        attr(&ack.attributes, "subject").as_deref(),
        Some(id.as_str())
    );
    assert_eq!(
        attr(&ack.attributes, "result").as_deref(),
        Some("acknowledged")
    );
    assert!(ack.end_time_unix_nano >= ack.start_time_unix_nano);
    // The diagnosis of the new incident (from the lines the controller holds: no agent
    // answers here) is a span with its answer.
    wait_until("the diagnosis span", PATIENCE, || {
        spans(got).iter().any(|(_, s)| s.name == "diagnose")
    });
    let all = spans(got);
    let diagnose = all
        .iter()
        .map(|(_, s)| s)
        .find(|s| s.name == "diagnose")
        .expect("a diagnose span");
    assert_eq!(
        attr(&diagnose.attributes, "incident").as_deref(),
        Some(id.as_str())
    );
    assert_eq!(
        attr(&diagnose.attributes, "category").as_deref(),
        Some("gpu_hardware_xid")
    );
    c.kill();
}

#[test]
fn pipeline_spans_reach_the_collector_named_by_the_standard_variable() {
    let (port, got) = collector();
    let endpoint = format!("http://127.0.0.1:{port}");
    pipeline_is_traced_with(&got, &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)], None);
}

#[test]
fn pipeline_spans_reach_the_collector_named_in_the_config_file() {
    let (port, got) = collector();
    let config = format!("traces:\n  otlp_endpoint: http://127.0.0.1:{port}\n");
    pipeline_is_traced_with(&got, &[], Some(config));
}

#[test]
fn a_collector_that_is_not_there_does_not_stop_the_pipeline() {
    let gone = support::free_port();
    let data = tempfile::tempdir().expect("temp dir");
    let endpoint = format!("http://127.0.0.1:{gone}");
    let c = Ctl::start_env(
        &[OsStr::new("--data-dir"), data.path().as_os_str()],
        None,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    );
    for seq in 1..=3 {
        c.ingest_xid(&format!("node-{seq}"), seq);
    }
    wait_until("three incidents", PATIENCE, || c.incidents().len() == 3);
    c.kill();
}
