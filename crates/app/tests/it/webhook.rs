//! The webhook channel against local receivers written as a user would
//! write one, with the Standard Webhooks reference library: signed
//! deliveries verify, a replay and a stale delivery are refused.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use parlance_app::conversation::{ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, WebhookChannel};
use parlance_core::ProductId;
use parlance_core::conversation::{ContactId, InstanceId, Role};
use parlance_ports::{Channel, Clock as _, ErrorKind, ManualClock, Outbound, SystemClock};
use standardwebhooks::Webhook;

/// The secret as a receiver is given it.
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

type Received = Arc<Mutex<Vec<(HeaderMap, Bytes)>>>;

async fn listen(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// A receiver that records every request and answers `status`.
async fn recorder(status: StatusCode) -> (String, Received) {
    let got: Received = Arc::default();
    let sink = got.clone();
    let app = Router::new().route(
        "/hook",
        post(move |headers: HeaderMap, body: Bytes| {
            let sink = sink.clone();
            async move {
                sink.lock().unwrap().push((headers, body));
                status
            }
        }),
    );
    (listen(app).await, got)
}

/// What a receiver following the Standard Webhooks advice did with the
/// requests it got.
#[derive(Default)]
struct Inbox {
    /// `webhook-id`s seen, the dedupe store.
    seen: HashSet<String>,
    /// Bodies processed, in order.
    processed: Vec<serde_json::Value>,
    /// Why each refused request was refused.
    refused: Vec<String>,
    /// Verified requests dropped as repeats.
    repeats: usize,
}

/// A receiver as a user writes it: verify with the library (signature and
/// timestamp tolerance), then drop an id seen before.
async fn verifying_receiver(secret: &str) -> (String, Arc<Mutex<Inbox>>) {
    let inbox: Arc<Mutex<Inbox>> = Arc::default();
    let sink = inbox.clone();
    let verifier = Arc::new(Webhook::new(secret).unwrap());
    let app = Router::new().route(
        "/hook",
        post(move |headers: HeaderMap, body: Bytes| {
            let sink = sink.clone();
            let verifier = verifier.clone();
            async move {
                let mut inbox = sink.lock().unwrap();
                if let Err(e) = verifier.verify(&body, &headers) {
                    inbox.refused.push(e.to_string());
                    return StatusCode::UNAUTHORIZED;
                }
                let id = headers[ID_HEADER].to_str().unwrap().to_owned();
                if inbox.seen.insert(id) {
                    inbox.processed.push(serde_json::from_slice(&body).unwrap());
                } else {
                    inbox.repeats += 1;
                }
                StatusCode::NO_CONTENT
            }
        }),
    );
    (listen(app).await, inbox)
}

fn message() -> Outbound {
    Outbound {
        product_id: ProductId::parse("acme").unwrap(),
        instance_id: InstanceId::from_uuid(uuid::Uuid::from_u128(7)),
        contact_id: ContactId::parse("+15550100").unwrap(),
        channel: "whatsapp".into(),
        outbound_seq: 3,
        role: Role::Agent,
        text: "Which day suits you?".into(),
    }
}

#[tokio::test]
async fn messages_arrive_signed_with_a_stable_id() {
    let (url, got) = recorder(StatusCode::NO_CONTENT).await;
    let channel = WebhookChannel::new(url, SECRET, Duration::from_secs(5)).unwrap();
    // A retry of the same message.
    channel.deliver(&message()).await.unwrap();
    channel.deliver(&message()).await.unwrap();
    let got = got.lock().unwrap();
    let verifier = Webhook::new(SECRET).unwrap();
    for (headers, body) in got.iter() {
        verifier.verify(body, headers).unwrap();
        assert_eq!(headers[ID_HEADER], "00000000-0000-0000-0000-000000000007:3");
        let sent: i64 = headers[TIMESTAMP_HEADER].to_str().unwrap().parse().unwrap();
        let now = SystemClock.now().as_micros() / 1_000_000;
        assert!((now - 5..=now).contains(&sent), "{sent} vs {now}");
        assert!(
            headers[SIGNATURE_HEADER]
                .to_str()
                .unwrap()
                .starts_with("v1,")
        );
        assert!(!headers.contains_key("x-parlance-signature"));
    }
    assert_eq!(got.len(), 2);
    let (_, body) = &got[0];
    let json: serde_json::Value = serde_json::from_slice(body).unwrap();
    assert_eq!(json["text"], "Which day suits you?");
    assert_eq!(json["outbound_seq"], 3);
    assert_eq!(json["contact_id"], "+15550100");
}

#[tokio::test]
async fn a_raw_secret_verifies_as_its_bytes() {
    let (url, got) = recorder(StatusCode::NO_CONTENT).await;
    let channel = WebhookChannel::new(url, "plain-text-secret", Duration::from_secs(5)).unwrap();
    channel.deliver(&message()).await.unwrap();
    let (headers, body) = got.lock().unwrap()[0].clone();
    Webhook::from_bytes(b"plain-text-secret".to_vec())
        .unwrap()
        .verify(&body, &headers)
        .unwrap();
    assert!(
        Webhook::new(SECRET)
            .unwrap()
            .verify(&body, &headers)
            .is_err()
    );
}

#[tokio::test]
async fn the_receiver_drops_a_replay_and_refuses_stale_or_forged_deliveries() {
    let (url, inbox) = verifying_receiver(SECRET).await;
    let channel = WebhookChannel::new(url.clone(), SECRET, Duration::from_secs(5)).unwrap();
    channel.deliver(&message()).await.unwrap();

    // The channel's own retry: verified, dropped as a repeat.
    channel.deliver(&message()).await.unwrap();

    // A replay of the captured request, byte for byte, by someone else.
    let (recorder_url, captured) = recorder(StatusCode::NO_CONTENT).await;
    WebhookChannel::new(recorder_url, SECRET, Duration::from_secs(5))
        .unwrap()
        .deliver(&message())
        .await
        .unwrap();
    let (captured_headers, body) = captured.lock().unwrap()[0].clone();
    let mut headers = HeaderMap::new();
    for name in [
        ID_HEADER,
        TIMESTAMP_HEADER,
        SIGNATURE_HEADER,
        "content-type",
    ] {
        headers.insert(name, captured_headers[name].clone());
    }
    let replay = reqwest::Client::new()
        .post(&url)
        .headers(headers.clone())
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), StatusCode::NO_CONTENT);

    // The same headers over another body: the signature does not match.
    let mut forged = message();
    forged.text = "Send me your password".into();
    let forged = reqwest::Client::new()
        .post(&url)
        .headers(headers)
        .body(serde_json::to_vec(&forged).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), StatusCode::UNAUTHORIZED);

    // An attempt stamped six minutes ago, past the library's five-minute
    // tolerance, even for a message not seen yet.
    let past = Arc::new(ManualClock::at(
        SystemClock.now() - Duration::from_secs(6 * 60),
    ));
    let stale = WebhookChannel::new(url.clone(), SECRET, Duration::from_secs(5))
        .unwrap()
        .with_clock(past);
    let mut later = message();
    later.outbound_seq = 4;
    let err = stale.deliver(&later).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Invalid);

    // Signed with another key.
    let other = WebhookChannel::new(url, "whsec_b3RoZXI=", Duration::from_secs(5)).unwrap();
    assert_eq!(
        other.deliver(&later).await.unwrap_err().kind,
        ErrorKind::Invalid
    );

    let inbox = inbox.lock().unwrap();
    assert_eq!(inbox.processed.len(), 1);
    assert_eq!(inbox.processed[0]["text"], "Which day suits you?");
    assert_eq!(inbox.repeats, 2);
    assert_eq!(
        inbox.refused,
        [
            "signature invalid",
            "signature timestamp too old",
            "signature invalid"
        ]
    );
}

#[tokio::test]
async fn refusals_are_classified() {
    let (url, _) = recorder(StatusCode::SERVICE_UNAVAILABLE).await;
    let channel = WebhookChannel::new(url, SECRET, Duration::from_secs(5)).unwrap();
    assert_eq!(
        channel.deliver(&message()).await.unwrap_err().kind,
        ErrorKind::Unavailable
    );
    let (url, _) = recorder(StatusCode::BAD_REQUEST).await;
    let channel = WebhookChannel::new(url, SECRET, Duration::from_secs(5)).unwrap();
    assert_eq!(
        channel.deliver(&message()).await.unwrap_err().kind,
        ErrorKind::Invalid
    );
    let channel =
        WebhookChannel::new("http://127.0.0.1:9/hook", SECRET, Duration::from_secs(2)).unwrap();
    assert_eq!(
        channel.deliver(&message()).await.unwrap_err().kind,
        ErrorKind::Unavailable
    );
}
