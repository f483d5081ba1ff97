//! The operator console: its pages and files are served without a key, with
//! a strict security policy, and hold no data; `/v1/me` tells a key its
//! product and nothing of another product.

use std::sync::Arc;

use parlance_app::AppState;
use parlance_app::auth::{ApiKey, ApiKeys};
use parlance_core::ProductId;
use parlance_testkit::{ManualClock, SequentialIds};
use reqwest::header::{HeaderMap, IF_NONE_MATCH};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{KEY, TestServer};

const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
                   connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; \
                   base-uri 'none'; form-action 'none'";

/// The second product's key.
const OTHER_KEY: &str = "pk_test_beta";

/// A server whose keys open `acme` (the test key) and `beta`.
async fn two_products() -> TestServer {
    let mut keys = ApiKeys::single(&ApiKey::new(KEY), ProductId::parse("acme").unwrap());
    keys.insert(&ApiKey::new(OTHER_KEY), ProductId::parse("beta").unwrap());
    let clock = Arc::new(ManualClock::new());
    let state = AppState::memory_with(keys, clock.clone(), Arc::new(SequentialIds::new()));
    TestServer::start(state, clock).await
}

/// A GET without a key: status, headers and body text.
async fn get(
    server: &TestServer,
    path: &str,
    extra: &[(reqwest::header::HeaderName, &str)],
) -> (StatusCode, HeaderMap, String) {
    let mut req = server.client.get(format!("http://{}{}", server.addr, path));
    for (name, value) in extra {
        req = req.header(name, *value);
    }
    let res = req.send().await.unwrap();
    let status = res.status();
    let headers = res.headers().clone();
    (status, headers, res.text().await.unwrap())
}

/// A GET with `key` as bearer: status and JSON body.
async fn get_with(server: &TestServer, path: &str, key: Option<&str>) -> (StatusCode, Value) {
    let mut req = server.client.get(format!("http://{}{}", server.addr, path));
    if let Some(key) = key {
        req = req.bearer_auth(key);
    }
    let res = req.send().await.unwrap();
    let status = res.status();
    (status, res.json().await.unwrap_or(Value::Null))
}

fn header<'h>(headers: &'h HeaderMap, name: &str) -> &'h str {
    headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
}

fn assert_secured(headers: &HeaderMap, what: &str) {
    assert_eq!(header(headers, "content-security-policy"), CSP, "{what}");
    assert_eq!(header(headers, "referrer-policy"), "no-referrer", "{what}");
    assert_eq!(
        header(headers, "x-content-type-options"),
        "nosniff",
        "{what}"
    );
}

#[tokio::test]
async fn every_console_path_answers_the_page_without_a_key_and_with_no_data() {
    let server = TestServer::memory().await;
    let (status, _, _) = server
        .send(
            Method::POST,
            "/v1/products/acme/conversations",
            Some(&json!({"contact_id": "+15559990001", "objective": "confidential-objective-7"})),
            true,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    for path in [
        "/console",
        "/console/",
        "/console/conversations/0190b5a0-0000-7000-8000-000000000001",
        "/console/anything/else",
    ] {
        let (status, headers, body) = get(&server, path, &[]).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(header(&headers, "content-type"), "text/html; charset=utf-8");
        assert_eq!(header(&headers, "cache-control"), "no-cache");
        assert!(headers.contains_key("etag"), "{path}");
        assert_secured(&headers, path);
        assert!(body.contains(r#"<script type="module" src="/console/assets/console.js">"#));
        assert!(body.contains(r#"href="/console/assets/console.css""#));
        assert!(body.contains(r#"data-test="sign-in""#));
        assert!(
            !body.contains("confidential-objective-7") && !body.contains("+15559990001"),
            "the page holds no conversation data"
        );
        assert!(
            !body.contains("http://") && !body.contains("https://"),
            "nothing from elsewhere"
        );
    }
}

#[tokio::test]
async fn assets_carry_their_type_a_tag_and_answer_not_modified() {
    let server = TestServer::memory().await;
    for (file, ctype, needle) in [
        (
            "console.js",
            "text/javascript; charset=utf-8",
            "sessionStorage",
        ),
        ("console.css", "text/css; charset=utf-8", "font-family"),
    ] {
        let path = format!("/console/assets/{file}");
        let (status, headers, body) = get(&server, &path, &[]).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(header(&headers, "content-type"), ctype);
        assert_eq!(header(&headers, "cache-control"), "no-cache");
        assert_secured(&headers, &path);
        assert!(body.contains(needle), "{path}");
        let etag = header(&headers, "etag").to_owned();
        assert!(etag.starts_with('"') && etag.ends_with('"') && etag.len() > 10);

        let (status, again, body) = get(&server, &path, &[(IF_NONE_MATCH, &etag)]).await;
        assert_eq!(status, StatusCode::NOT_MODIFIED, "{path}");
        assert!(body.is_empty());
        assert_eq!(header(&again, "etag"), etag);
        assert_eq!(header(&again, "cache-control"), "no-cache");
        assert_secured(&again, &path);

        let listed = format!("\"stale\", {etag}");
        let (status, _, _) = get(&server, &path, &[(IF_NONE_MATCH, &listed)]).await;
        assert_eq!(status, StatusCode::NOT_MODIFIED, "a tag in a list matches");

        let (status, _, body) = get(&server, &path, &[(IF_NONE_MATCH, "\"stale\"")]).await;
        assert_eq!(status, StatusCode::OK, "another tag gets the file");
        assert!(body.contains(needle));
    }
    let (_, js, _) = get(&server, "/console/assets/console.js", &[]).await;
    let (_, css, _) = get(&server, "/console/assets/console.css", &[]).await;
    assert_ne!(header(&js, "etag"), header(&css, "etag"));
}

#[tokio::test]
async fn an_unknown_asset_is_a_not_found_problem() {
    let server = TestServer::memory().await;
    for file in ["nope.js", "index.html", "..%2Fmod.rs"] {
        let path = format!("/console/assets/{file}");
        let (status, headers, body) = get(&server, &path, &[]).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(header(&headers, "content-type"), "application/problem+json");
        assert_secured(&headers, &path);
        let problem: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(problem["type"], "urn:parlance:problem:not-found");
        assert_eq!(problem["status"], 404);
    }
}

#[tokio::test]
async fn me_answers_the_keys_product_and_401_without_a_valid_key() {
    let server = TestServer::memory().await;
    let (status, body) = get_with(&server, "/v1/me", Some(KEY)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"product_id": "acme"}));

    for key in [None, Some("pk_wrong")] {
        let res = server.client.get(format!("http://{}/v1/me", server.addr));
        let res = match key {
            Some(k) => res.bearer_auth(k),
            None => res,
        };
        let res = res.send().await.unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{key:?}");
        assert_eq!(
            res.headers()["content-type"].to_str().unwrap(),
            "application/problem+json"
        );
        let problem: Value = res.json().await.unwrap();
        assert_eq!(problem["status"], 401);
        assert!(problem.get("product_id").is_none());
    }
}

#[tokio::test]
async fn another_products_key_sees_its_own_product_and_not_the_first_ones_conversations() {
    let server = two_products().await;
    let (status, _, created) = server
        .send(
            Method::POST,
            "/v1/products/acme/conversations",
            Some(&json!({"contact_id": "+15559990002", "objective": "acme only"})),
            true,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let id = created["conversation"]["instance_id"].as_str().unwrap();

    let (status, me) = get_with(&server, "/v1/me", Some(OTHER_KEY)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(me, json!({"product_id": "beta"}));

    let (status, body) = get_with(
        &server,
        &format!("/v1/products/acme/conversations/{id}"),
        Some(KEY),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "the owner sees it: {body}");

    for path in [
        format!("/v1/products/acme/conversations/{id}"),
        format!("/v1/products/acme/conversations/{id}/audit"),
        format!("/v1/products/beta/conversations/{id}"),
        "/v1/products/acme/conversations".to_owned(),
    ] {
        let (status, body) = get_with(&server, &path, Some(OTHER_KEY)).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
        assert!(!body.to_string().contains("acme only"));
    }
    let (status, list) =
        get_with(&server, "/v1/products/beta/conversations", Some(OTHER_KEY)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["items"], json!([]), "beta has no conversations");
}

#[tokio::test]
async fn the_machines_are_served_without_a_key_with_every_edge_between_their_states() {
    let server = TestServer::memory().await;
    let (status, headers, body) = get(&server, "/console/machines.json", &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header(&headers, "content-type"), "application/json");
    assert_eq!(header(&headers, "cache-control"), "no-cache");
    assert!(headers.contains_key("etag"));
    assert_secured(&headers, "/console/machines.json");

    let doc: Value = serde_json::from_str(&body).unwrap();
    let machines = doc["machines"].as_array().unwrap();
    let names: Vec<&str> = machines
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["session", "adoption", "conversation", "turn", "flow"]
    );
    for m in machines {
        let name = m["name"].as_str().unwrap();
        let states: Vec<&str> = m["states"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        assert!(!states.is_empty(), "{name}");
        assert!(
            states.contains(&m["initial"].as_str().unwrap()),
            "{name}: the initial state is a state"
        );
        for t in m["terminal"].as_array().unwrap() {
            assert!(states.contains(&t.as_str().unwrap()), "{name}: {t}");
        }
        let edges = m["edges"].as_array().unwrap();
        assert!(!edges.is_empty(), "{name} has edges");
        for e in edges {
            for end in ["from", "to"] {
                let s = e[end].as_str().unwrap();
                assert!(states.contains(&s), "{name}: {end} {s} is not a state");
            }
            assert!(e["cause"].is_string(), "{name}: {e}");
        }
    }
    insta::assert_json_snapshot!("console_machines", doc);
}

#[tokio::test]
async fn the_flows_listing_carries_each_flows_transitions() {
    let mut c = parlance_app::Components::memory(ApiKeys::single(
        &ApiKey::new(KEY),
        ProductId::parse("acme").unwrap(),
    ));
    c.flows = parlance_app::flow::example_catalog().unwrap();
    let clock = Arc::new(ManualClock::new());
    c.clock = clock.clone();
    let server = TestServer::start(c.build(), clock).await;
    let (status, body) = get_with(&server, "/v1/products/acme/flows", Some(KEY)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let flows = body["flows"].as_array().unwrap();
    assert!(!flows.is_empty());
    for flow in flows {
        let states: Vec<&str> = flow["states"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap())
            .collect();
        let transitions = flow["transitions"].as_array().unwrap();
        assert!(!transitions.is_empty(), "{flow}");
        for t in transitions {
            assert!(states.contains(&t["from"].as_str().unwrap()), "{t}");
            assert!(states.contains(&t["to"].as_str().unwrap()), "{t}");
            let from = flow["states"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["id"] == t["from"])
                .unwrap();
            assert!(
                from["events"].as_array().unwrap().contains(&t["event"]),
                "each transition's event is listed on its state: {t}"
            );
        }
    }
}

/// What each console page reads, for one record of each kind of product
/// `acme`: the owner's key reads it all; `beta`'s key gets 404 on `acme`'s
/// paths, and on its own paths with `acme`'s ids what an id it never made
/// gets (404, or an empty listing or audit trail): nothing of `acme`'s
/// data. Without a key, 401.
#[tokio::test]
async fn every_read_a_console_page_makes_is_not_found_with_another_products_key() {
    let mut keys = ApiKeys::single(&ApiKey::new(KEY), ProductId::parse("acme").unwrap());
    keys.insert(&ApiKey::new(OTHER_KEY), ProductId::parse("beta").unwrap());
    let mut c = parlance_app::Components::memory(keys);
    c.flows = parlance_app::flow::example_catalog().unwrap();
    let clock = Arc::new(ManualClock::new());
    c.clock = clock.clone();
    c.ids = Arc::new(SequentialIds::new());
    let server = TestServer::start(c.build(), clock).await;
    let post = |path: &'static str, body: Value| {
        let server = &server;
        async move {
            let res = server
                .client
                .post(format!("http://{}{path}", server.addr))
                .bearer_auth(KEY)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = res.status();
            let body: Value = res.json().await.unwrap();
            assert!(status.is_success(), "{path}: {status} {body}");
            body
        }
    };
    post(
        "/v1/products/acme/sessions/ses-acme/events",
        json!({"type": "proactive_trigger", "trigger_id": "t-acme-secret"}),
    )
    .await;
    post(
        "/v1/products/acme/users/user-acme/adoption/events",
        json!({"events": [{"kind": "set_mastery", "rating": 42, "level": "proficient", "description": "acme secret"}]}),
    )
    .await;
    let conversation = post(
        "/v1/products/acme/conversations",
        json!({"contact_id": "contact-acme", "objective": "acme secret"}),
    )
    .await["conversation"]["instance_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let flow = post("/v1/ai/qa/start_session", json!({})).await["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    post(
        "/v1/products/acme/agent/turns",
        json!({"message": "an acme secret", "user_id": "owner-acme", "session_id": "thread-acme"}),
    )
    .await;

    // Each page's reads, `{p}` for the product.
    let reads = [
        "/v1/products/{p}/sessions/ses-acme".to_owned(),
        "/v1/products/{p}/sessions/ses-acme/audit".to_owned(),
        "/v1/products/{p}/users/user-acme/adoption".to_owned(),
        "/v1/products/{p}/users/user-acme/adoption/audit".to_owned(),
        "/v1/products/{p}/conversations".to_owned(),
        "/v1/products/{p}/conversations?state=CREATED,WAITING_FOR_REPLY&order=newest".to_owned(),
        format!("/v1/products/{{p}}/conversations/{conversation}"),
        format!("/v1/products/{{p}}/conversations/{conversation}/audit"),
        "/v1/products/{p}/agent/threads/thread-acme?user_id=owner-acme".to_owned(),
        "/v1/products/{p}/agent/threads/thread-acme/history?user_id=owner-acme".to_owned(),
        format!("/v1/ai/qa/model/{flow}"),
        format!("/v1/ai/qa/audit/{flow}"),
    ];
    let mut secrets = 0;
    for read in &reads {
        let path = read.replace("{p}", "acme");
        let (status, body) = get_with(&server, &path, Some(KEY)).await;
        assert_eq!(status, StatusCode::OK, "the owner reads {path}: {body}");
        secrets += usize::from(body.to_string().contains("secret"));
    }
    assert!(secrets >= 4, "the owner's reads hold its data ({secrets})");
    for read in &reads {
        for product in ["acme", "beta"] {
            let path = read.replace("{p}", product);
            let (status, body) = get_with(&server, &path, Some(OTHER_KEY)).await;
            // On its own paths, `beta` gets what any id it never made gets:
            // 404, or for a listing and a session's audit, nothing.
            let empty = ["items", "records"]
                .iter()
                .any(|k| body[*k].as_array().is_some_and(Vec::is_empty));
            if product == "beta" && status == StatusCode::OK {
                assert!(empty, "{path}: {body}");
            } else {
                assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
                assert_eq!(body["type"], "urn:parlance:problem:not-found", "{path}");
            }
            assert!(!body.to_string().contains("secret"), "{path} leaks {body}");
        }
        let path = read.replace("{p}", "acme");
        let (status, body) = get_with(&server, &path, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path} without a key");
        assert!(!body.to_string().contains("secret"), "{path} leaks {body}");
    }
}
