//! The controller's OpenAPI 3.1 document, derived from the API's handlers and types
//! (utoipa); `docs/openapi.json` is this document, committed, and a test fails when the
//! two differ. Regenerate with `cargo run -p warden-controller -- openapi > docs/openapi.json`.

use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
use utoipa::{Modify, OpenApi};

use crate::api::{self, ROUTES};
use crate::auth::{Need, Role};

/// Name of the bearer-token security scheme in the document.
pub const SECURITY_SCHEME: &str = "bearer";

/// The document: every route of [`api::router`].
#[derive(Debug, OpenApi)]
#[openapi(
    info(
        title = "Warden controller API",
        description = "Batch ingest from agents, job lifecycle from schedulers, incidents, \
                       nodes, jobs and rank progress, the audit log, probes and metrics. \
                       Every error answer is JSON (`ApiError`). Every route under `/api/v1` \
                       needs a bearer token whose role allows it (docs/API.md)."
    ),
    paths(
        api::ingest,
        api::job_lifecycle,
        api::list_incidents,
        api::get_incident,
        api::ack_incident,
        api::resolve_incident,
        api::list_nodes,
        api::drain_node,
        api::undrain_node,
        api::node_health,
        api::fleet_health,
        api::list_jobs,
        api::job_ranks,
        api::list_actions,
        api::whoami,
        api::remediation_status,
        api::reset_breaker,
        api::healthz,
        api::readyz,
        api::render_metrics,
    ),
    components(schemas(api::ApiError)),
    modifiers(&BearerAuth),
)]
pub struct ApiDoc;

/// Adds the bearer scheme and, on every `/api/v1` operation, the security requirement,
/// the 401 and 403 answers of the token check and the roles [`ROUTES`] allows.
#[derive(Debug)]
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            SECURITY_SCHEME,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A token from the controller's token file (`warden-controller token`).",
                    ))
                    .build(),
            ),
        );
        for (method, path, need) in ROUTES {
            let Some(op) = doc
                .paths
                .paths
                .get_mut(*path)
                .and_then(|item| operation_mut(item, method))
            else {
                // The drift test reports a route without an operation.
                continue;
            };
            let roles: Vec<&str> = Role::ALL
                .into_iter()
                .filter(|r| r.allows(*need))
                .map(Role::as_str)
                .collect();
            let note = format!("Roles: {}.", roles.join(", "));
            op.description = Some(match op.description.take() {
                Some(d) if !d.is_empty() => format!("{d}\n\n{note}"),
                _ => note,
            });
            op.security = Some(vec![SecurityRequirement::new(
                SECURITY_SCHEME,
                Vec::<String>::new(),
            )]);
            let error = |text: &str| {
                ResponseBuilder::new()
                    .description(text)
                    .content(
                        "application/json",
                        ContentBuilder::new()
                            .schema(Some(Ref::from_schema_name("ApiError")))
                            .build(),
                    )
                    .build()
            };
            op.responses.responses.insert(
                "401".into(),
                error("No bearer token, or one nobody holds.").into(),
            );
            op.responses.responses.insert(
                "403".into(),
                error("The token's role may not call this route.").into(),
            );
            if matches!(need, Need::Report | Need::Operate) {
                // A follower relays these to the leader; with none known, or none
                // answering, the answer is 503 with Retry-After.
                op.responses
                    .responses
                    .entry("503".into())
                    .or_insert_with(|| {
                        error("This controller follows and cannot reach a leader; retry.").into()
                    });
            }
        }
    }
}

/// The operation of `item` for an upper-case HTTP `method`.
fn operation_mut<'a>(
    item: &'a mut utoipa::openapi::PathItem,
    method: &str,
) -> Option<&'a mut Operation> {
    match method {
        "GET" => item.get.as_mut(),
        "POST" => item.post.as_mut(),
        "PUT" => item.put.as_mut(),
        "DELETE" => item.delete.as_mut(),
        "PATCH" => item.patch.as_mut(),
        _ => None,
    }
}

/// The document as pretty JSON with a final newline, in a stable order (paths, schemas
/// and properties sorted by name): what `docs/openapi.json` holds.
pub fn openapi_json() -> String {
    let doc = ApiDoc::openapi();
    match doc.to_pretty_json() {
        Ok(mut text) => {
            text.push('\n');
            text
        }
        // Serializing plain structs and maps to JSON does not fail.
        Err(e) => format!("{{\"error\": {:?}}}\n", e.to_string()),
    }
}
