//! The webhook channel against a local receiver: signed, keyed bodies.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use parlance_app::conversation::{IDEMPOTENCY_HEADER, SIGNATURE_HEADER, WebhookChannel, signature};
use parlance_core::ProductId;
use parlance_core::conversation::{ContactId, InstanceId, Role};
use parlance_ports::{Channel, ErrorKind, Outbound};

type Received = Arc<Mutex<Vec<(HeaderMap, Bytes)>>>;

async fn receiver(status: StatusCode) -> (String, Received) {
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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, got)
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
async fn messages_arrive_signed_with_their_idempotency_key() {
    let (url, got) = receiver(StatusCode::NO_CONTENT).await;
    let channel = WebhookChannel::new(url, "s3cret", Duration::from_secs(5)).unwrap();
    channel.deliver(&message()).await.unwrap();
    let got = got.lock().unwrap();
    let (headers, body) = &got[0];
    assert_eq!(
        headers[SIGNATURE_HEADER],
        signature(b"s3cret", body).as_str()
    );
    assert_eq!(
        headers[IDEMPOTENCY_HEADER],
        "00000000-0000-0000-0000-000000000007:3"
    );
    let json: serde_json::Value = serde_json::from_slice(body).unwrap();
    assert_eq!(json["text"], "Which day suits you?");
    assert_eq!(json["outbound_seq"], 3);
    assert_eq!(json["contact_id"], "+15550100");
}

#[tokio::test]
async fn refusals_are_classified() {
    let (url, _) = receiver(StatusCode::SERVICE_UNAVAILABLE).await;
    let channel = WebhookChannel::new(url, "k", Duration::from_secs(5)).unwrap();
    assert_eq!(
        channel.deliver(&message()).await.unwrap_err().kind,
        ErrorKind::Unavailable
    );
    let (url, _) = receiver(StatusCode::BAD_REQUEST).await;
    let channel = WebhookChannel::new(url, "k", Duration::from_secs(5)).unwrap();
    assert_eq!(
        channel.deliver(&message()).await.unwrap_err().kind,
        ErrorKind::Invalid
    );
    let channel =
        WebhookChannel::new("http://127.0.0.1:9/hook", "k", Duration::from_secs(2)).unwrap();
    assert_eq!(
        channel.deliver(&message()).await.unwrap_err().kind,
        ErrorKind::Unavailable
    );
}
