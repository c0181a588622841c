//! The committed OpenAPI document (`docs/openapi.json`) is the one the code generates,
//! and it documents exactly the routes the router serves under `/api/v1`, each with the
//! bearer scheme, plus the unauthenticated probes.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::Value;
use warden_controller::api::ROUTES;
use warden_controller::openapi::{SECURITY_SCHEME, openapi_json};

const REGENERATE: &str = "cargo run -p warden-controller -- openapi > docs/openapi.json";

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json")
}

fn generated() -> Value {
    serde_json::from_str(&openapi_json()).expect("the generated document is JSON")
}

const METHODS: [&str; 5] = ["get", "post", "put", "delete", "patch"];

/// Every (METHOD, path) the document has.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for m in METHODS {
            if item.get(m).is_some() {
                out.insert((m.to_ascii_uppercase(), path.clone()));
            }
        }
    }
    out
}

#[test]
fn committed_openapi_document_matches_the_code() {
    let path = committed_path();
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let now = openapi_json();
    if committed != now {
        let first = committed
            .lines()
            .zip(now.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(now.lines().count()));
        panic!(
            "{} is not the document the code generates (first difference at line {}).\n\
             Regenerate it from the repository root with:\n    {REGENERATE}\n\
             and commit the result.",
            path.display(),
            first + 1
        );
    }
}

#[test]
fn every_route_is_documented_and_every_documented_route_exists() {
    let doc = generated();
    let documented: BTreeSet<(String, String)> = operations(&doc)
        .into_iter()
        .filter(|(_, p)| p.starts_with("/api/v1/"))
        .collect();
    let routed: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p, _)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
    let undocumented: Vec<_> = routed.difference(&documented).collect();
    let unrouted: Vec<_> = documented.difference(&routed).collect();
    assert!(
        undocumented.is_empty() && unrouted.is_empty(),
        "routes without an operation in the document: {undocumented:?}; operations without \
         a route in api::ROUTES: {unrouted:?}"
    );
    let probes: BTreeSet<_> = operations(&doc)
        .into_iter()
        .filter(|(_, p)| !p.starts_with("/api/v1/"))
        .collect();
    let want: BTreeSet<_> = ["/healthz", "/readyz", "/metrics"]
        .into_iter()
        .map(|p| ("GET".to_owned(), p.to_owned()))
        .collect();
    assert_eq!(probes, want);
}

#[test]
fn api_routes_need_the_bearer_scheme_and_probes_do_not() {
    let doc = generated();
    assert_eq!(
        doc["components"]["securitySchemes"][SECURITY_SCHEME],
        serde_json::json!({
            "type": "http",
            "scheme": "bearer",
            "description": doc["components"]["securitySchemes"][SECURITY_SCHEME]["description"],
        })
    );
    for (method, path) in operations(&doc) {
        let op = &doc["paths"][&path][method.to_ascii_lowercase()];
        let secured = op["security"]
            .as_array()
            .is_some_and(|s| s.iter().any(|r| r.get(SECURITY_SCHEME).is_some()));
        let responses = op["responses"].as_object().expect("responses");
        if path.starts_with("/api/v1/") {
            assert!(secured, "{method} {path} lacks the bearer requirement");
            for status in ["401", "403"] {
                assert!(
                    responses.contains_key(status),
                    "{method} {path} lacks {status}"
                );
            }
        } else {
            assert!(op.get("security").is_none(), "{method} {path} is secured");
        }
    }
}

#[test]
fn paged_lists_document_the_next_page_header() {
    let doc = generated();
    for path in ["/api/v1/incidents", "/api/v1/actions"] {
        let headers = &doc["paths"][path]["get"]["responses"]["200"]["headers"];
        assert!(
            headers.get("X-Warden-Next-After").is_some(),
            "{path}: {headers}"
        );
    }
    let ingest = &doc["paths"]["/api/v1/ingest"]["post"]["requestBody"]["content"];
    for ct in ["application/json", "application/vnd.warden.batch"] {
        assert!(ingest.get(ct).is_some(), "ingest lacks {ct}: {ingest}");
    }
}
