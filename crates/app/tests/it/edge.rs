//! What every answer passes through: request ids, the access line of each
//! request, CORS and per-key rate limits.

use std::io::Read as _;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use parlance_app::auth::ApiKey;
use parlance_app::config::CorsConfig;
use parlance_app::http::{Edge, RateLimit};
use parlance_core::ProductId;
use parlance_memory::{OfflineLlm, Reply, When};
use parlance_ports::LlmError;
use parlance_testkit::ManualClock;
use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::load::{Proc, free_port};
use crate::support::{
    Captured, KEY, TestServer, components, register_request_callsites, wait_until,
};

const TOURS: &str = "/v1/products/acme/tours";
const ORIGIN: &str = "https://app.example.com";

/// Sends `method path` with `headers` (and the test key when `auth`).
async fn raw(
    s: &TestServer,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    auth: bool,
) -> reqwest::Response {
    let mut req = s.client.request(method, format!("http://{}{path}", s.addr));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    if auth {
        req = req.bearer_auth(KEY);
    }
    req.send().await.unwrap()
}

fn request_id(h: &HeaderMap) -> &str {
    h.get("x-request-id")
        .expect("an x-request-id on the answer")
        .to_str()
        .unwrap()
}

fn is_uuid(id: &str) -> bool {
    uuid::Uuid::parse_str(id).is_ok()
}

#[tokio::test]
async fn every_answer_carries_a_request_id() {
    let s = TestServer::memory().await;
    let cases: [(Method, &str, bool, StatusCode); 5] = [
        (Method::GET, "/healthz", false, StatusCode::OK),
        (Method::GET, TOURS, true, StatusCode::OK),
        (Method::GET, TOURS, false, StatusCode::UNAUTHORIZED),
        (Method::GET, "/nowhere", false, StatusCode::NOT_FOUND),
        (
            Method::DELETE,
            "/healthz",
            false,
            StatusCode::METHOD_NOT_ALLOWED,
        ),
    ];
    let mut seen = Vec::new();
    for (method, path, auth, status) in cases {
        let res = raw(&s, method.clone(), path, &[], auth).await;
        assert_eq!(res.status(), status, "{method} {path}");
        let id = request_id(res.headers()).to_owned();
        assert!(
            is_uuid(&id),
            "{method} {path}: a generated id is a UUID: {id}"
        );
        seen.push(id);
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 5, "each request gets its own id");

    // A usable id sent by the client comes back, on errors too.
    for (path, auth) in [
        ("/healthz", false),
        (TOURS, true),
        (TOURS, false),
        ("/nowhere", false),
    ] {
        let res = raw(
            &s,
            Method::GET,
            path,
            &[("x-request-id", "client-id.42")],
            auth,
        )
        .await;
        assert_eq!(request_id(res.headers()), "client-id.42", "{path}");
    }
    // One too long, or with characters that would break a log line, is
    // replaced.
    let long = "a".repeat(parlance_app::http::MAX_REQUEST_ID_BYTES + 1);
    for bad in ["two words", "quote\"d", long.as_str()] {
        let res = raw(&s, Method::GET, "/healthz", &[("x-request-id", bad)], false).await;
        let id = request_id(res.headers());
        assert!(is_uuid(id), "{bad:?} was replaced by {id}");
    }
    // So are two ids at once.
    let res = s
        .client
        .get(format!("http://{}/healthz", s.addr))
        .header("x-request-id", "one")
        .header("x-request-id", "two")
        .send()
        .await
        .unwrap();
    assert!(is_uuid(request_id(res.headers())));
    // A body over the limit, refused before any handler, has one too.
    let res = s
        .client
        .post(format!("http://{}{TOURS}", s.addr))
        .bearer_auth(KEY)
        .header("x-request-id", "big-body")
        .header("content-type", "application/json")
        .body(vec![b' '; 1024 * 1024 + 1])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(request_id(res.headers()), "big-body");
}

/// A model whose reply stage fails, so that an agent turn logs a warning
/// from inside its handler.
fn failing_reply_model() -> OfflineLlm {
    OfflineLlm::new()
        .with_rule(
            When::PromptName("crisis_gate".into()),
            Reply::json(&json!({
                "level": 0, "confidence": 0.9, "reason": "no risk",
                "needs_crisis_response": false, "needs_clarification": false
            })),
        )
        .with_rule(
            When::PromptName("therapeutic_reply".into()),
            Reply::Error(LlmError::Unavailable {
                message: "upstream down".into(),
                retry_after: None,
            }),
        )
        .with_rule(
            When::PromptName("memory_extraction".into()),
            Reply::json(&json!({"facts": []})),
        )
}

/// Everything runs on this thread (a current-thread runtime), so the
/// capturing subscriber sees the server's logs.
#[tokio::test(flavor = "current_thread")]
async fn each_request_logs_one_access_line_and_its_logs_carry_the_request_id() {
    let logs = Captured::default();
    let _guard = tracing::subscriber::set_default(logs.subscriber());
    register_request_callsites().await;
    let clock = Arc::new(ManualClock::new());
    let mut c = components(&clock);
    c.llm = Arc::new(failing_reply_model());
    c.agent_data = parlance_app::agent::AgentData::examples().unwrap();
    let s = TestServer::start(c.build(), clock).await;

    let sent = [
        ("log-health", Method::GET, "/healthz", false),
        ("log-tours", Method::GET, TOURS, true),
        ("log-no-key", Method::GET, TOURS, false),
        ("log-nowhere", Method::GET, "/nowhere", false),
    ];
    for (id, method, path, auth) in &sent {
        let res = raw(&s, method.clone(), path, &[("x-request-id", id)], *auth).await;
        assert_eq!(request_id(res.headers()), *id);
    }
    let res = s
        .client
        .post(format!("http://{}/v1/products/acme/agent/turns", s.addr))
        .bearer_auth(KEY)
        .header("x-request-id", "log-turn")
        .json(
            &json!({"message": "Work has been hard lately", "user_id": "ana",
                      "session_id": "s1", "channel": "WEB"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);

    let lines = logs.lines();
    let served = |id: &str| -> Vec<&Value> {
        lines
            .iter()
            .filter(|l| l["fields"]["message"] == "served" && l["span"]["request_id"] == id)
            .collect()
    };
    let expect = [
        ("log-health", Some("/healthz"), 200, None),
        (
            "log-tours",
            Some("/v1/products/{product_id}/tours"),
            200,
            Some("acme"),
        ),
        (
            "log-no-key",
            Some("/v1/products/{product_id}/tours"),
            401,
            None,
        ),
        ("log-nowhere", None, 404, None),
        (
            "log-turn",
            Some("/v1/products/{product_id}/agent/turns"),
            200,
            Some("acme"),
        ),
    ];
    for (id, route, status, product) in expect {
        let found = served(id);
        assert_eq!(found.len(), 1, "one access line for {id}:\n{}", logs.text());
        let line = found[0];
        assert_eq!(line["level"], "INFO", "{line}");
        assert_eq!(line["span"]["name"], "request", "{line}");
        assert_eq!(
            line["span"]["method"],
            if id == "log-turn" { "POST" } else { "GET" }
        );
        assert_eq!(line["span"]["route"].as_str(), route, "{line}");
        assert_eq!(line["span"]["product"].as_str(), product, "{line}");
        assert_eq!(line["fields"]["status"], status, "{line}");
        assert!(line["fields"]["latency_ms"].as_f64().is_some(), "{line}");
    }
    assert_eq!(
        lines
            .iter()
            .filter(|l| l["fields"]["message"] == "served"
                && l["span"]["request_id"]
                    .as_str()
                    .is_some_and(|id| id.starts_with("log-")))
            .count(),
        expect.len(),
        "no other access line for these requests"
    );

    // The handler's own warning is written inside the request's span.
    let warning = lines
        .iter()
        .find(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("response model failed"))
        })
        .unwrap_or_else(|| panic!("the failing reply stage logged:\n{}", logs.text()));
    assert_eq!(warning["span"]["request_id"], "log-turn", "{warning}");
    assert!(
        warning["spans"][0]["request_id"] == "log-turn",
        "the request span is the outermost: {warning}"
    );
    // The key is in no line.
    assert!(!logs.text().contains(KEY));
}

/// `parlance serve` started as a user starts it, with the default filter:
/// one line per request with the method, the route, the status, the
/// latency, the product when a key was given, and the request id.
#[tokio::test]
async fn parlance_serve_logs_one_access_line_per_request_by_default() {
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_parlance"))
        .args([
            "serve",
            "--no-worker",
            "--bind",
            &format!("127.0.0.1:{port}"),
        ])
        .env("PARLANCE_API_KEY", KEY)
        .env_remove("RUST_LOG")
        .env_remove("PARLANCE_LOG_FORMAT")
        .env_remove("DATABASE_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start parlance serve");
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        stderr.read_to_string(&mut text).unwrap();
        text
    });
    let mut proc = Proc::from(child);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    wait_until(
        "parlance serve to listen",
        Duration::from_secs(60),
        || async { tokio::net::TcpStream::connect(addr).await.is_ok() },
    )
    .await;
    let client = reqwest::Client::new();
    let tours = "/v1/products/default/tours";
    let sent = [
        ("serve-health", "/healthz", false, 200),
        ("serve-tours", tours, true, 200),
        ("serve-no-key", tours, false, 401),
        ("serve-nowhere", "/nowhere", false, 404),
    ];
    for (id, path, auth, status) in sent {
        let mut req = client
            .get(format!("http://{addr}{path}"))
            .header("x-request-id", HeaderValue::from_static(id));
        if auth {
            req = req.bearer_auth(KEY);
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status().as_u16(), status, "{path}");
        assert_eq!(request_id(res.headers()), id);
    }
    proc.kill();
    let text = reader.join().unwrap();

    let access: Vec<&str> = text.lines().filter(|l| l.contains(" served ")).collect();
    assert_eq!(access.len(), sent.len(), "one line per request:\n{text}");
    let expect = [
        ("serve-health", Some("/healthz"), "200", None),
        (
            "serve-tours",
            Some("/v1/products/{product_id}/tours"),
            "200",
            Some("default"),
        ),
        (
            "serve-no-key",
            Some("/v1/products/{product_id}/tours"),
            "401",
            None,
        ),
        ("serve-nowhere", None, "404", None),
    ];
    for (id, route, status, product) in expect {
        let line = access
            .iter()
            .find(|l| l.contains(&format!("request_id={id} ")))
            .unwrap_or_else(|| panic!("no access line for {id}:\n{text}"));
        assert!(line.contains(" INFO "), "{line}");
        assert!(line.contains("method=GET"), "{line}");
        match route {
            Some(r) => assert!(line.contains(&format!("route={r}")), "{line}"),
            None => assert!(!line.contains("route="), "{line}"),
        }
        match product {
            Some(p) => assert!(line.contains(&format!("product={p}")), "{line}"),
            None => assert!(!line.contains("product="), "{line}"),
        }
        assert!(line.contains(&format!("status={status}")), "{line}");
        assert!(line.contains("latency_ms="), "{line}");
        assert!(
            !line.contains('\u{1b}'),
            "no colour codes off a terminal: {line:?}"
        );
    }
    assert!(!text.contains(KEY), "the key was logged:\n{text}");
}

/// A memory server whose `[cors]` allows [`ORIGIN`].
async fn cors_server() -> TestServer {
    let clock = Arc::new(ManualClock::new());
    let mut c = components(&clock);
    let cors = CorsConfig {
        allowed_origins: vec![ORIGIN.to_owned()],
        ..CorsConfig::default()
    };
    c.edge = Edge::default().with_cors(cors.policy().unwrap());
    TestServer::start(c.build(), clock).await
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).map(|v| v.to_str().unwrap())
}

fn cors_headers(h: &HeaderMap) -> Vec<String> {
    h.keys()
        .map(|k| k.as_str().to_owned())
        .filter(|k| k.starts_with("access-control-"))
        .collect()
}

fn preflight(origin: &str) -> [(&str, &str); 3] {
    [
        ("origin", origin),
        ("access-control-request-method", "POST"),
        (
            "access-control-request-headers",
            "authorization,content-type",
        ),
    ]
}

#[tokio::test]
async fn a_preflight_from_an_allowed_origin_is_answered_without_a_key() {
    let s = cors_server().await;
    let res = raw(&s, Method::OPTIONS, TOURS, &preflight(ORIGIN), false).await;
    assert_eq!(res.status(), StatusCode::OK, "not a 401: no key is asked");
    let h = res.headers();
    assert_eq!(header(h, "access-control-allow-origin"), Some(ORIGIN));
    let methods = header(h, "access-control-allow-methods").unwrap();
    assert!(
        methods.contains("POST") && methods.contains("GET"),
        "{methods}"
    );
    let headers = header(h, "access-control-allow-headers").unwrap();
    assert!(
        headers.contains("authorization") && headers.contains("content-type"),
        "{headers}"
    );
    assert_eq!(header(h, "access-control-max-age"), Some("600"));
    assert!(is_uuid(request_id(h)));
}

#[tokio::test]
async fn a_preflight_from_another_origin_gets_no_allowance() {
    let s = cors_server().await;
    let res = raw(
        &s,
        Method::OPTIONS,
        TOURS,
        &preflight("https://evil.example.com"),
        false,
    )
    .await;
    assert_ne!(res.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(cors_headers(res.headers()), Vec::<String>::new());
    // Nor does a request of it.
    let res = raw(
        &s,
        Method::GET,
        TOURS,
        &[("origin", "https://evil.example.com")],
        true,
    )
    .await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(res.headers(), "access-control-allow-origin"), None);
}

#[tokio::test]
async fn requests_from_an_allowed_origin_may_read_answers_and_errors() {
    let s = cors_server().await;
    for (auth, status) in [(true, StatusCode::OK), (false, StatusCode::UNAUTHORIZED)] {
        let res = raw(&s, Method::GET, TOURS, &[("origin", ORIGIN)], auth).await;
        assert_eq!(res.status(), status);
        let h = res.headers();
        assert_eq!(header(h, "access-control-allow-origin"), Some(ORIGIN));
        let exposed = header(h, "access-control-expose-headers").unwrap();
        assert!(
            exposed.contains("x-request-id") && exposed.contains("retry-after"),
            "{exposed}"
        );
    }
}

#[tokio::test]
async fn cors_is_off_by_default() {
    let s = TestServer::memory().await;
    let res = raw(&s, Method::OPTIONS, TOURS, &preflight(ORIGIN), false).await;
    assert_eq!(cors_headers(res.headers()), Vec::<String>::new());
    let res = raw(&s, Method::GET, TOURS, &[("origin", ORIGIN)], true).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(cors_headers(res.headers()), Vec::<String>::new());
}

const OTHER_KEY: &str = "pk_test_acme_second";

/// A memory server limiting each key to 1 request a second, 2 at once,
/// with a second key for the same product.
async fn limited_server() -> TestServer {
    let clock = Arc::new(ManualClock::new());
    let mut c = components(&clock);
    c.keys
        .insert(&ApiKey::new(OTHER_KEY), ProductId::parse("acme").unwrap());
    c.edge = Edge::default().with_rate_limit(RateLimit::new(1, 2));
    TestServer::start(c.build(), clock).await
}

async fn get_with(s: &TestServer, key: &str, path: &str) -> reqwest::Response {
    s.client
        .get(format!("http://{}{path}", s.addr))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_key_past_its_burst_gets_429_and_recovers_after_retry_after() {
    let s = limited_server().await;
    for _ in 0..2 {
        assert_eq!(get_with(&s, KEY, TOURS).await.status(), StatusCode::OK);
    }
    let res = get_with(&s, KEY, TOURS).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(res.headers(), "content-type"),
        Some("application/problem+json")
    );
    assert!(is_uuid(request_id(res.headers())));
    let retry: u64 = header(res.headers(), "retry-after")
        .expect("a Retry-After header")
        .parse()
        .expect("whole seconds");
    assert_eq!(retry, 1, "1 request a second: the next one within a second");
    let body: Value = res.json().await.unwrap();
    insta::assert_json_snapshot!("rate_limited", body);

    // Another key is not affected, the probes are never limited, and a
    // request without a valid key is refused before it is counted.
    assert_eq!(
        get_with(&s, OTHER_KEY, TOURS).await.status(),
        StatusCode::OK
    );
    for _ in 0..5 {
        let (status, _, _) = s.send(Method::GET, "/healthz", None, false).await;
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(
        get_with(&s, "pk_not_a_key", TOURS).await.status(),
        StatusCode::UNAUTHORIZED
    );

    tokio::time::sleep(Duration::from_secs(retry)).await;
    assert_eq!(get_with(&s, KEY, TOURS).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn without_a_rate_limit_nothing_is_limited() {
    let s = TestServer::memory().await;
    for _ in 0..60 {
        assert_eq!(get_with(&s, KEY, TOURS).await.status(), StatusCode::OK);
    }
}
