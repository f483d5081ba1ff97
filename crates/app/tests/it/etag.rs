//! Entity tags on the API's reads: a repeated `GET` naming the tag it got
//! is 304 with no body until the answer changes, then 200 with a new tag;
//! commands, errors and the routes outside `/v1` carry none; the API
//! document says so for every read.

use reqwest::header::{CACHE_CONTROL, ETAG, IF_NONE_MATCH};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{KEY, TestServer};

const BASE: &str = "/v1/products/acme/conversations";

/// A GET with the test key and, when given, `If-None-Match`: status, the
/// `ETag` and `Cache-Control` headers, and the body's bytes.
async fn get(
    server: &TestServer,
    path: &str,
    if_none_match: Option<&str>,
) -> (StatusCode, Option<String>, Option<String>, Vec<u8>) {
    let mut req = server
        .client
        .get(format!("http://{}{path}", server.addr))
        .bearer_auth(KEY);
    if let Some(tag) = if_none_match {
        req = req.header(IF_NONE_MATCH, tag);
    }
    let res = req.send().await.unwrap();
    let header = |name| {
        res.headers()
            .get(name)
            .map(|v: &reqwest::header::HeaderValue| v.to_str().unwrap().to_owned())
    };
    let (etag, cache) = (header(ETAG), header(CACHE_CONTROL));
    let status = res.status();
    (status, etag, cache, res.bytes().await.unwrap().to_vec())
}

/// `path` answers 200 with a tag, then 304 with no body to that tag, and
/// returns the tag.
async fn settled(server: &TestServer, path: &str) -> String {
    let (status, etag, cache, body) = get(server, path, None).await;
    assert_eq!(status, StatusCode::OK, "{path}");
    assert!(!body.is_empty());
    let etag = etag.unwrap_or_else(|| panic!("{path} has no ETag"));
    assert!(
        etag.starts_with('"') && etag.ends_with('"') && !etag.starts_with("W/"),
        "a strong tag: {etag}"
    );
    assert_eq!(cache.as_deref(), Some("private, no-cache"), "{path}");

    let (status, again, cache, body) = get(server, path, Some(&etag)).await;
    assert_eq!(status, StatusCode::NOT_MODIFIED, "{path}");
    assert!(body.is_empty(), "a 304 has no body");
    assert_eq!(again.as_deref(), Some(etag.as_str()), "{path}");
    assert_eq!(cache.as_deref(), Some("private, no-cache"), "{path}");
    let (status, _, _, _) = get(server, path, Some(&format!("\"other\", W/{etag}"))).await;
    assert_eq!(
        status,
        StatusCode::NOT_MODIFIED,
        "a tag in a list, weak or not"
    );
    let (status, _, _, body) = get(server, path, Some("\"other\"")).await;
    assert_eq!(status, StatusCode::OK, "another tag gets the body");
    assert!(!body.is_empty());
    etag
}

async fn send(server: &TestServer, method: Method, path: &str, body: Option<Value>) -> Value {
    let (status, _, body) = server.send(method, path, body.as_ref(), true).await;
    assert!(status.is_success(), "{path}: {status} {body}");
    body
}

#[tokio::test]
async fn a_read_asked_again_is_not_modified_until_it_changes() {
    let server = TestServer::memory().await;
    let created = send(
        &server,
        Method::POST,
        BASE,
        Some(json!({"contact_id": "+15550123", "objective": "book a demo"})),
    )
    .await;
    let id = created["conversation"]["instance_id"].as_str().unwrap();
    let one = format!("{BASE}/{id}");
    let audit = format!("{one}/audit");
    let newest = format!("{BASE}?state=CREATED,PAUSED&order=newest&limit=20");

    let mut tags = Vec::new();
    for path in [BASE, newest.as_str(), one.as_str(), audit.as_str()] {
        tags.push(settled(&server, path).await);
    }
    assert_ne!(tags[2], tags[3], "another body, another tag");

    // A command changes every one of them: each answers 200 to its old
    // tag, with a new tag, which is then 304 again.
    send(&server, Method::POST, &format!("{one}/pause"), None).await;
    for (path, old) in [BASE, newest.as_str(), one.as_str(), audit.as_str()]
        .into_iter()
        .zip(&tags)
    {
        let (status, etag, _, body) = get(&server, path, Some(old)).await;
        assert_eq!(status, StatusCode::OK, "{path} changed");
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert!(body.to_string().contains("PAUSED"), "{path}: {body}");
        let etag = etag.unwrap();
        assert_ne!(&etag, old, "{path}");
        assert_eq!(settled(&server, path).await, etag);
    }
}

#[tokio::test]
async fn commands_errors_and_other_routes_carry_no_tag() {
    let server = TestServer::memory().await;
    let res = server
        .client
        .post(format!("http://{}{BASE}", server.addr))
        .bearer_auth(KEY)
        .json(&json!({"contact_id": "+15550124", "objective": "book a demo"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert!(res.headers().get(ETAG).is_none(), "a command's answer");

    let missing = format!("{BASE}/0190b5a0-0000-7000-8000-000000000009");
    let (status, etag, _, _) = get(&server, &missing, Some("*")).await;
    assert_eq!((status, etag), (StatusCode::NOT_FOUND, None), "an error");
    let (status, etag, _, _) = get(&server, "/healthz", None).await;
    assert_eq!((status, etag), (StatusCode::OK, None), "outside /v1");

    // Without the key there is no 304 to learn anything from.
    let res = server
        .client
        .get(format!("http://{}{BASE}", server.addr))
        .header(IF_NONE_MATCH, "*")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn the_document_describes_the_tags_of_every_read() {
    let server = TestServer::memory().await;
    let (status, _, doc) = server.send(Method::GET, "/openapi.json", None, false).await;
    assert_eq!(status, StatusCode::OK);
    let mut reads = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let tagged = op["responses"].get("304").is_some();
            let condition = op["parameters"].as_array().is_some_and(|params| {
                params
                    .iter()
                    .any(|p| p["name"] == "If-None-Match" && p["in"] == "header")
            });
            let json_read = method == "get"
                && path.starts_with("/v1/")
                && op["responses"]["200"]["content"]
                    .as_object()
                    .is_some_and(|c| c.keys().any(|k| k.starts_with("application/json")));
            assert_eq!(tagged, json_read, "{method} {path}: a 304 only on reads");
            assert_eq!(condition, json_read, "{method} {path}: If-None-Match");
            if json_read {
                reads += 1;
                let headers = &op["responses"]["200"]["headers"];
                assert!(headers["ETag"].is_object(), "{path}");
                assert!(headers["Cache-Control"].is_object(), "{path}");
                assert_eq!(
                    op["responses"]["304"]["$ref"], "#/components/responses/NotModified",
                    "{path}"
                );
            }
        }
    }
    assert!(reads >= 20, "{reads} reads described");
    let not_modified = &doc["components"]["responses"]["NotModified"];
    assert!(not_modified["headers"]["ETag"].is_object());
    assert!(not_modified["content"].is_null(), "a 304 has no body");
}
