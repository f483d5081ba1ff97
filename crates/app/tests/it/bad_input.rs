//! Bad input: random methods, paths, headers and bodies (huge, deeply
//! nested, invalid UTF-8, wrong content types) against a running service.
//! Every answer is a 2xx or a 4xx (problem+json), never a 5xx or a hang, and
//! a refused request changes nothing that can be read back.
//!
//! `PARLANCE_HTTP_CASES` sets the number of cases (default 200).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parlance_app::flow::{FlowCatalog, Invokers};
use parlance_testkit::ManualClock;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::Value;

use crate::support::{KEY, TestServer};

const CONVERSATION: &str = "00000000-0000-0000-0000-00000000c0de";

/// One request, as generated.
#[derive(Debug, Clone)]
struct Req {
    method: String,
    path: String,
    auth: Option<Vec<u8>>,
    content_type: Option<Vec<u8>>,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => Just("s1".to_owned()),
        2 => Just("u1".to_owned()),
        2 => Just(CONVERSATION.to_owned()),
        1 => Just("%FF%FE".to_owned()),
        1 => Just("..".to_owned()),
        1 => Just("%2e%2e%2f".to_owned()),
        1 => Just("%00".to_owned()),
        1 => Just("x".repeat(300)),
        3 => "[a-zA-Z0-9._~-]{0,24}",
        2 => "(%[0-9A-F]{2}){1,6}",
    ]
}

fn path() -> impl Strategy<Value = String> {
    let templates = prop::sample::select(vec![
        "/v1/products/{p}/sessions/{a}/events",
        "/v1/products/{p}/sessions/{a}",
        "/v1/products/{p}/sessions/{a}/proactive-gate",
        "/v1/products/{p}/sessions/{a}/audit?limit={a}&after_seq={a}",
        "/v1/products/{p}/tours",
        "/v1/products/{p}/users/{a}/adoption",
        "/v1/products/{p}/users/{a}/adoption/events",
        "/v1/products/{p}/users/{a}/adoption/activity",
        "/v1/products/{p}/users/{a}/adoption/gate",
        "/v1/products/{p}/users/{a}/adoption/prompt-block",
        "/v1/products/{p}/users/{a}/adoption/judge",
        "/v1/products/{p}/users/{a}/adoption/welcome",
        "/v1/products/{p}/onboarding-plan",
        "/v1/products/{p}/tour-catalog",
        "/v1/products/{p}/tours/match",
        "/v1/products/{p}/conversations",
        "/v1/products/{p}/conversations?state={a}&limit={a}",
        "/v1/products/{p}/conversations/{a}",
        "/v1/products/{p}/conversations/{a}/replies",
        "/v1/products/{p}/conversations/{a}/pause",
        "/v1/products/{p}/conversations/{a}/cancel",
        "/v1/products/{p}/conversations/{a}/send",
        "/v1/products/{p}/contacts/{a}/replies",
        "/v1/products/{p}/flows",
        "/v1/ai/{f}/start_session",
        "/v1/ai/{f}/event",
        "/v1/ai/{f}/task_state/{a}",
        "/v1/ai/{f}/model/{a}",
        "/healthz",
        "/readyz",
        "/{a}/{a}",
        "/v1/{a}",
        "/v1/products/{p}/{a}/{a}/{a}/{a}",
    ]);
    let product =
        prop_oneof![6 => Just("acme".to_owned()), 1 => Just("beta".to_owned()), 1 => segment()];
    let flow = prop_oneof![3 => Just("qa".to_owned()), 1 => segment()];
    (templates, product, flow, segment(), segment()).prop_map(|(t, p, f, a, b)| {
        let mut path = t.replace("{p}", &p).replace("{f}", &f);
        // Each `{a}` in turn takes one of the two segments.
        let mut second = false;
        while let Some(i) = path.find("{a}") {
            let seg = if second { &b } else { &a };
            second = !second;
            path.replace_range(i..i + 3, seg);
        }
        path
    })
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        prop::sample::select(vec![
            "open_chat",
            "proactive_trigger",
            "option_click",
            "mark_welcomed",
            "set_mastery",
            "user_input",
            "poll",
            "cancel",
            "retry",
            "s1",
            "u1",
            CONVERSATION,
            "",
            " ",
            "\u{0}",
            "é",
            "onboarded",
            "qa",
        ])
        .prop_map(|s| Value::String(s.to_owned())),
        "\\PC{0,40}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop::sample::select(vec![
                        "type",
                        "kind",
                        "events",
                        "text",
                        "session_id",
                        "event",
                        "event_input",
                        "state",
                        "tours",
                        "workflows",
                        "contact_id",
                        "objective",
                        "todos",
                        "actions",
                        "metadata",
                        "seconds_on_app",
                        "trigger_id",
                        "rating",
                        "id",
                        "instance_id",
                        "version",
                        "query",
                    ]),
                    inner,
                ),
                0..6,
            )
            .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
        ]
    })
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        2 => Just(Vec::new()),
        6 => json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        2 => prop::collection::vec(any::<u8>(), 0..256),
        1 => Just(b"{\"text\": \"\xff\xfe broken\"}".to_vec()),
        1 => (1usize..20_000).prop_map(|depth| {
            let mut v = "[".repeat(depth).into_bytes();
            v.extend(std::iter::repeat_n(b']', depth));
            v
        }),
        1 => (1usize..5_000).prop_map(|depth| {
            let mut v = "{\"a\":".repeat(depth).into_bytes();
            v.extend(b"1");
            v.extend(std::iter::repeat_n(b'}', depth));
            v
        }),
        1 => Just({
            let mut v = b"{\"text\": \"".to_vec();
            v.extend(std::iter::repeat_n(b'a', 1024 * 1024 + 10));
            v.extend(b"\"}");
            v
        }),
    ]
}

fn request() -> impl Strategy<Value = Req> {
    let method = prop::sample::select(vec![
        "GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "BREW",
    ]);
    let auth = prop_oneof![
        6 => Just(Some(format!("Bearer {KEY}").into_bytes())),
        1 => Just(None),
        1 => Just(Some(b"Bearer pk_wrong".to_vec())),
        1 => Just(Some(b"Basic YWxhZGRpbjpvcGVuc2VzYW1l".to_vec())),
        1 => prop::collection::vec(0x20u8..0xff, 0..80).prop_map(|mut v| {
            let mut h = b"Bearer ".to_vec();
            v.retain(|b| *b != 0x7f);
            h.extend(v);
            Some(h)
        }),
    ];
    let content_type = prop_oneof![
        6 => Just(Some(b"application/json".to_vec())),
        1 => Just(None),
        1 => Just(Some(b"application/json; charset=utf-8".to_vec())),
        1 => Just(Some(b"text/plain".to_vec())),
        1 => Just(Some(b"application/x-www-form-urlencoded".to_vec())),
        1 => Just(Some(b"multipart/form-data; boundary=x".to_vec())),
        1 => Just(Some(b"application/\xffjson".to_vec())),
    ];
    let headers = prop::collection::vec(
        (
            prop::sample::select(vec![
                "accept",
                "x-request-id",
                "content-encoding",
                "transfer-encoding-x",
                "x-a",
                "accept-language",
                "if-match",
            ]),
            prop::collection::vec(0x20u8..0xff, 0..64),
        )
            .prop_map(|(k, mut v)| {
                v.retain(|b| *b != 0x7f);
                (k.to_owned(), v)
            }),
        0..3,
    );
    (method, path(), auth, content_type, headers, body()).prop_map(
        |(method, path, auth, content_type, headers, body)| Req {
            method: method.to_owned(),
            path,
            auth,
            content_type,
            headers,
            body,
        },
    )
}

/// A client keeping no idle connections: the service may close one after
/// refusing a body it did not read.
fn fresh_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

/// Everything a refused request must leave as it was, read through the API.
async fn fingerprint(server: &TestServer, flow_session: &str) -> Vec<(u16, String)> {
    let client = fresh_client();
    let mut out = Vec::new();
    for path in [
        "/v1/products/acme/sessions/s1".to_owned(),
        "/v1/products/acme/sessions/s1/audit".to_owned(),
        "/v1/products/acme/tours".to_owned(),
        "/v1/products/acme/users/u1/adoption".to_owned(),
        "/v1/products/acme/onboarding-plan".to_owned(),
        "/v1/products/acme/tour-catalog".to_owned(),
        "/v1/products/acme/conversations?limit=1000".to_owned(),
        format!("/v1/products/acme/conversations/{CONVERSATION}"),
        format!("/v1/products/acme/conversations/{CONVERSATION}/audit"),
        format!("/v1/ai/qa/model/{flow_session}"),
    ] {
        let res = client
            .get(format!("http://{}{}", server.addr, path))
            .bearer_auth(KEY)
            .send()
            .await
            .unwrap();
        out.push((res.status().as_u16(), res.text().await.unwrap()));
    }
    out
}

async fn check(server: &TestServer, flow_session: &str, req: Req) -> Result<(), TestCaseError> {
    let before = fingerprint(server, flow_session).await;
    let path = req.path.replace("{flow_session}", flow_session);
    let method = reqwest::Method::from_bytes(req.method.as_bytes()).unwrap();
    let mut r = fresh_client()
        .request(method, format!("http://{}{}", server.addr, path))
        .timeout(Duration::from_secs(20));
    if let Some(a) = &req.auth {
        r = r.header(
            reqwest::header::AUTHORIZATION,
            HeaderValue::from_bytes(a).unwrap(),
        );
    }
    if let Some(c) = &req.content_type {
        r = r.header(
            reqwest::header::CONTENT_TYPE,
            HeaderValue::from_bytes(c).unwrap(),
        );
    }
    for (k, v) in &req.headers {
        r = r.header(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_bytes(v).unwrap(),
        );
    }
    let res = r.body(req.body.clone()).send().await;
    let res = match res {
        Ok(res) => res,
        Err(e) => return Err(TestCaseError::fail(format!("no answer ({e}) to {req:?}"))),
    };
    let status = res.status();
    let ctype = res
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap_or("").to_owned())
        .unwrap_or_default();
    let text = res.text().await.unwrap_or_default();
    let shown = format!(
        "{} {path} -> {status} {}",
        req.method,
        &text[..text.len().min(300)]
    );
    prop_assert!(status.is_success() || status.is_client_error(), "{shown}");
    if status.is_client_error() {
        if req.method != "HEAD" {
            prop_assert_eq!(ctype.as_str(), "application/problem+json", "{}", shown);
        }
        let after = fingerprint(server, flow_session).await;
        prop_assert!(
            before == after,
            "a refused request changed state: {}",
            shown
        );
    }
    Ok(())
}

#[test]
fn random_requests_get_a_2xx_or_4xx_and_refusals_change_nothing() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (server, flow_session) = rt.block_on(async {
        let clock = Arc::new(ManualClock::new());
        let mut c = crate::support::components(&clock);
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/flows");
        c.flows = FlowCatalog::load_dir(&dir, &Invokers::is_builtin).unwrap();
        let state = c.build();
        let server = TestServer::start(state, clock).await;
        let (_, _, started) = server
            .send(reqwest::Method::POST, "/v1/ai/qa/start_session", None, true)
            .await;
        let sid = started["session_id"].as_str().unwrap().to_owned();
        (server, sid)
    });
    let cases = std::env::var("PARLANCE_HTTP_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    // Half the flow requests name the live flow session.
    let strategy = (request(), any::<bool>()).prop_map(|(mut r, live)| {
        if live
            && (r.path.starts_with("/v1/ai/qa/model/")
                || r.path.starts_with("/v1/ai/qa/task_state/"))
            && let Some(i) = r.path.rfind('/')
        {
            r.path.replace_range(i + 1.., "{flow_session}");
        }
        r
    });
    let result = runner.run(&strategy, |req| {
        rt.block_on(check(&server, &flow_session, req))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[tokio::test]
async fn a_query_string_that_does_not_parse_is_a_problem_json_400() {
    let s = TestServer::memory().await;
    let (status, ctype, v) = s
        .send(
            reqwest::Method::GET,
            "/v1/products/acme/sessions/s1/audit?limit=many",
            None,
            true,
        )
        .await;
    assert_eq!(
        (status.as_u16(), ctype.as_str()),
        (400, "application/problem+json")
    );
    assert_eq!(v["type"], "urn:parlance:problem:bad-request");
    let (status, ctype, _) = s
        .send(
            reqwest::Method::PATCH,
            "/v1/products/acme/tours",
            None,
            true,
        )
        .await;
    assert_eq!(
        (status.as_u16(), ctype.as_str()),
        (405, "application/problem+json")
    );
}
