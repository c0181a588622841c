//! The queries of a Grafana dashboard as Grafana runs them: every panel's targets
//! (panels nested in rows too) and the annotation queries. Shared by the promtool
//! checks (controller/tests/observability.rs) and the live check against a real
//! Prometheus (agent/tests/prometheus_live.rs), so both see the same queries.

use serde_json::Value as Json;

/// One query of a dashboard.
#[derive(Debug, Clone)]
pub struct Query {
    /// The dashboard's file name.
    pub dashboard: String,
    /// The panel's id; 0 for an annotation.
    pub id: u64,
    /// The panel's title, or `annotation: NAME`.
    pub panel: String,
    /// The target's `refId` (`A` for an annotation).
    pub ref_id: String,
    /// The PromQL, Grafana variables and all.
    pub expr: String,
}

/// Every query of dashboard `d`, read from the file named `dashboard`.
pub fn queries(dashboard: &str, d: &Json) -> Vec<Query> {
    let mut panels: Vec<&Json> = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        panels.push(p);
        panels.extend(p["panels"].as_array().into_iter().flatten());
    }
    let mut out = Vec::new();
    for p in panels {
        let title = p["title"].as_str().expect("panel title");
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(Query {
                dashboard: dashboard.to_owned(),
                id: p["id"].as_u64().expect("panel id"),
                panel: title.to_owned(),
                ref_id: t["refId"].as_str().expect("refId").to_owned(),
                expr: t["expr"]
                    .as_str()
                    .expect("a target without expr")
                    .to_owned(),
            });
        }
    }
    for a in d["annotations"]["list"].as_array().into_iter().flatten() {
        if let Some(expr) = a["expr"].as_str() {
            out.push(Query {
                dashboard: dashboard.to_owned(),
                id: 0,
                panel: format!("annotation: {}", a["name"].as_str().expect("name")),
                ref_id: "A".to_owned(),
                expr: expr.to_owned(),
            });
        }
    }
    out
}
