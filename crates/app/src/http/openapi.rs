//! The API document (OpenAPI 3.1), generated from the routes themselves:
//! every route is registered through `utoipa_axum::routes!`, which takes its
//! method, path, parameters, bodies and answers from the handler's
//! `#[utoipa::path]`, so what is served and what is described are one list.
//!
//! This module holds what every operation shares: the document's head, the
//! bearer scheme, the problem+json schema, the sets of error answers, and
//! the entity tags of every read (`If-None-Match`, `ETag`, 304).

use std::collections::BTreeMap;

use axum::Extension;
use axum::body::Bytes;
use axum::http::header;
use axum::response::IntoResponse;
use serde_json::json;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, Schema, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi, Ref, RefOr, Required, Response, ResponseBuilder};
use utoipa::{IntoResponses, Modify, PartialSchema, ToSchema};

/// A problem details answer (RFC 9457), the body of every error.
///
/// Besides `type`, `title`, `status` and `detail`, a problem may carry
/// members of its own kind: `field` (the offending request field), `state`,
/// `command` and `reason` (on `not-allowed`), `max` (on limits), and the
/// entity as it is now.
pub(crate) struct Problem;

impl PartialSchema for Problem {
    fn schema() -> RefOr<Schema> {
        let text = |description: &str, example: serde_json::Value| {
            ObjectBuilder::new()
                .schema_type(Type::String)
                .description(Some(description))
                .examples([example])
        };
        ObjectBuilder::new()
            .description(Some(
                "A problem details answer (RFC 9457). Problems of some kinds carry more \
                 members: `field`, `state`, `command`, `reason`, `max`, the entity as it is now.",
            ))
            .property(
                "type",
                text(
                    "`urn:parlance:problem:<kind>`; the kinds are listed in docs/api.md.",
                    json!("urn:parlance:problem:not-found"),
                ),
            )
            .property(
                "title",
                text("The status's reason phrase.", json!("Not Found")),
            )
            .property(
                "status",
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .description(Some("The HTTP status."))
                    .examples([json!(404)]),
            )
            .property(
                "detail",
                text("What went wrong, for the caller.", json!("no session s-1")),
            )
            .required("type")
            .required("title")
            .required("status")
            .required("detail")
            .additional_properties(Some(AdditionalProperties::FreeForm(true)))
            .into()
    }
}

impl ToSchema for Problem {}

/// The path of a product's routes.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // read by `Tenant`; here for the document
pub(crate) struct ProductPath {
    /// The product (the key's).
    #[param(value_type = parlance_core::ProductId)]
    product_id: String,
}

/// Registers the bearer scheme (`Authorization: Bearer <API key>`).
struct BearerKey;

impl Modify for BearerKey {
    fn modify(&self, doc: &mut OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An API key, as `Authorization: Bearer <key>`. A key opens one \
                         product: its routes under `/v1/products/{product_id}` and the flows.",
                    ))
                    .build(),
            ),
        );
    }
}

/// The document's head: title, licence, the bearer scheme (required by
/// every operation that does not say otherwise) and the problem schema.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "Parlance",
        description = "The state layer for conversational agents: the session assistance \
                       machine, user adoption, conversation instances, agent turns and flows.\n\n\
                       Every body is JSON. Text anywhere in a body may not hold NUL (U+0000) and \
                       integers must fit a signed 64-bit integer: no store can keep them, and \
                       they answer 422 `invalid-request` naming the `field`, whether or not the \
                       route reads it. Ids are checked by length in bytes of UTF-8.",
    ),
    modifiers(&BearerKey),
    security(("api_key" = [])),
    components(schemas(Problem)),
    tags(
        (name = "sessions", description = "The session assistance machine: thinking, proactive, reactive."),
        (name = "adoption", description = "User adoption: journey, mastery, onboarding, tours, judge prompts."),
        (name = "conversations", description = "Conversation instances: replies, follow-ups, pause, hand-off to a person."),
        (name = "agent", description = "Agent turns, threads, memory and the crisis log."),
        (name = "flows", description = "Flows: sessions driven by YAML flow definitions (genie-flow compatible routes)."),
        (name = "keys", description = "What the presented key opens."),
        (name = "service", description = "Probes and the API document; no key needed."),
    )
)]
pub(crate) struct Head;

/// Problem answers by status, each `application/problem+json`.
fn problems(statuses: &[(u16, &str)]) -> BTreeMap<String, RefOr<Response>> {
    statuses
        .iter()
        .map(|&(status, description)| {
            let response = ResponseBuilder::new()
                .description(description)
                .content(
                    "application/problem+json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("Problem")))
                        .build(),
                )
                .build();
            (status.to_string(), RefOr::T(response))
        })
        .collect()
}

/// What any request may be answered before its handler runs, and what any
/// handler may answer when a dependency fails.
const ANY: &[(u16, &str)] = &[
    (400, "The request cannot be read (`bad-request`)."),
    (401, "No key, or an unknown key (`unauthorized`)."),
    (
        404,
        "No such record for this product, or the key opens another product (`not-found`).",
    ),
    (408, "The body did not arrive in time (`request-timeout`)."),
    (414, "The request target is too long (`uri-too-long`)."),
    (
        422,
        "Well-formed but not a valid request (`invalid-request`, naming the `field`), or over \
         a limit (`limit-exceeded`).",
    ),
    (
        429,
        "Too many requests for this key (`rate-limited`); see `Retry-After`.",
    ),
    (
        431,
        "The request's headers are too large (`headers-too-large`).",
    ),
    (
        500,
        "A defect; the detail says nothing, the log says what (`internal`).",
    ),
    (
        503,
        "A dependency is unavailable, or commits kept conflicting (`unavailable`, \
         `contended`); see `Retry-After`.",
    ),
    (
        504,
        "The request's time budget ran out (`deadline-exceeded`).",
    ),
];

/// What a request with a JSON body may be answered besides [`ANY`].
const BODY: &[(u16, &str)] = &[
    (413, "The body is over the limit (`payload-too-large`)."),
    (415, "The body is not JSON (`unsupported-media-type`)."),
];

/// The answer of a command the record's state does not allow.
const CONFLICT: &[(u16, &str)] = &[(
    409,
    "The record's state does not allow the command (`not-allowed`, with `state`, `command` \
     and `reason`), or another write won (`conflict`).",
)];

/// The error answers of a read.
pub(crate) struct ReadProblems;

impl IntoResponses for ReadProblems {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        problems(ANY)
    }
}

/// The error answers of a command: a JSON body, and a state that may not
/// allow it.
pub(crate) struct CommandProblems;

impl IntoResponses for CommandProblems {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        problems(&[ANY, BODY, CONFLICT].concat())
    }
}

/// The error answers of a command without a body (`pause`, a flow's
/// `start_session` by `GET`): a read's, and a state that may not allow it.
pub(crate) struct StateProblems;

impl IntoResponses for StateProblems {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        problems(&[ANY, CONFLICT].concat())
    }
}

/// The error answers of a read that takes a JSON body (a flow's
/// `user_sessions`): a read's, and a body's.
pub(crate) struct SearchProblems;

impl IntoResponses for SearchProblems {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        problems(&[ANY, BODY].concat())
    }
}

/// The error answers of a write without a state machine behind it (a
/// catalog or plan put).
pub(crate) struct PutProblems;

impl IntoResponses for PutProblems {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        problems(&[ANY, BODY].concat())
    }
}

/// Describes the entity tags of the API's reads ([`super::etag`]) on every
/// `GET` operation of `doc` that answers JSON: the optional `If-None-Match`
/// header, the `ETag` and `Cache-Control` headers of its 200, and its 304
/// (`NotModified` among the document's responses, `EntityTag` among its
/// schemas).
pub(crate) fn document_tags(mut doc: OpenApi) -> OpenApi {
    let tag = || Ref::from_schema_name("EntityTag");
    let etag = || {
        HeaderBuilder::new()
            .schema(tag())
            .description(Some(
                "The body's tag: asked again with it in `If-None-Match`, the answer is 304 \
                 while the body would be the same.",
            ))
            .build()
    };
    let cache = || {
        HeaderBuilder::new()
            .schema(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .examples([json!(super::etag::READ_CACHE_CONTROL)]),
            )
            .description(Some(
                "A browser may keep the answer and must ask again first.",
            ))
            .build()
    };
    let mut tagged = false;
    for item in doc.paths.paths.values_mut() {
        let Some(op) = item.get.as_mut() else {
            continue;
        };
        let Some(RefOr::T(ok)) = op.responses.responses.get_mut("200") else {
            continue;
        };
        if !ok.content.keys().any(|c| c.starts_with("application/json")) {
            continue;
        }
        tagged = true;
        ok.headers.insert("ETag".to_owned(), etag());
        ok.headers.insert("Cache-Control".to_owned(), cache());
        op.responses.responses.insert(
            "304".to_owned(),
            RefOr::Ref(Ref::from_response_name("NotModified")),
        );
        let condition = ParameterBuilder::new()
            .name("If-None-Match")
            .parameter_in(ParameterIn::Header)
            .required(Required::False)
            .description(Some(
                "The `ETag` of an earlier answer (or several, comma-separated): when the \
                 answer would carry the same tag, it is 304 with no body.",
            ))
            .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
            .build();
        op.parameters.get_or_insert_with(Vec::new).push(condition);
    }
    if tagged {
        let components = doc.components.get_or_insert_with(Default::default);
        components.schemas.insert(
            "EntityTag".to_owned(),
            ObjectBuilder::new()
                .schema_type(Type::String)
                .description(Some(
                    "A strong entity tag: a hash of an answer's body, quoted (RFC 9110).",
                ))
                .examples([json!("\"5d41402abc4b2a76b9719d911017c592\"")])
                .into(),
        );
        let not_modified = ResponseBuilder::new()
            .description(
                "`If-None-Match` names the tag the answer would have: nothing changed, and \
                 there is no body.",
            )
            .header("ETag", etag())
            .header("Cache-Control", cache())
            .build();
        components
            .responses
            .insert("NotModified".to_owned(), RefOr::T(not_modified));
    }
    doc
}

/// The document, rendered once when the router is built.
#[derive(Clone)]
pub(crate) struct Document(Bytes);

impl Document {
    /// Renders `doc` as indented JSON.
    pub(crate) fn render(doc: &OpenApi) -> Self {
        Self(serde_json::to_vec_pretty(doc).unwrap_or_default().into())
    }
}

/// The API document (OpenAPI 3.1) of this service.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "service",
    security(()),
    responses((status = 200, description = "This document.", content_type = "application/json", body = Object)),
)]
pub(crate) async fn document(Extension(Document(doc)): Extension<Document>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], doc)
}
