//! Contract suites for the adapters that live in the app: the webhook
//! channel and the API keys given at start-up.

mod webhook_channel {
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use axum::Router;
    use axum::body::Bytes;
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::post;
    use parlance_app::conversation::{ID_HEADER, WebhookChannel};
    use parlance_ports::Channel;
    use parlance_testkit::channel::{ChannelFixture, Subject};
    use standardwebhooks::Webhook as Verifier;

    const SECRET: &str = "whsec_Y29udHJhY3Qtc2VjcmV0LWF0LWxlYXN0LTI0LWJ5dGVz";

    /// What a receiver following the Standard Webhooks advice keeps:
    /// bodies the reference verifier accepts, the first of each
    /// `webhook-id`.
    #[derive(Default)]
    struct Receiver {
        seen: HashSet<String>,
        accepted: Vec<serde_json::Value>,
    }

    struct Webhook {
        channel: Arc<WebhookChannel>,
        receiver: Arc<Mutex<Receiver>>,
    }

    impl ChannelFixture for Webhook {
        fn channel(&self) -> Arc<dyn Channel> {
            self.channel.clone()
        }

        fn received(&self) -> Vec<serde_json::Value> {
            self.receiver.lock().unwrap().accepted.clone()
        }
    }

    async fn fixture() -> Subject {
        let receiver: Arc<Mutex<Receiver>> = Arc::default();
        let sink = receiver.clone();
        let verifier = Arc::new(Verifier::new(SECRET).unwrap());
        let app = Router::new().route(
            "/hook",
            post(move |headers: HeaderMap, body: Bytes| {
                let sink = sink.clone();
                let verifier = verifier.clone();
                async move {
                    if verifier.verify(&body, &headers).is_err() {
                        return StatusCode::UNAUTHORIZED;
                    }
                    let Some(key) = headers.get(ID_HEADER).and_then(|k| k.to_str().ok()) else {
                        return StatusCode::BAD_REQUEST;
                    };
                    let Ok(json) = serde_json::from_slice(&body) else {
                        return StatusCode::BAD_REQUEST;
                    };
                    let mut r = sink.lock().unwrap();
                    if r.seen.insert(key.to_owned()) {
                        r.accepted.push(json);
                    }
                    StatusCode::NO_CONTENT
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let channel = WebhookChannel::new(url, SECRET, Duration::from_secs(10)).unwrap();
        Arc::new(Webhook {
            channel: Arc::new(channel),
            receiver,
        })
    }

    parlance_testkit::channel_suite!(async { Some(fixture().await) });
}

mod start_up_keys {
    use std::sync::{Arc, Mutex};

    use async_trait::async_trait;
    use parlance_app::auth::{ApiKey, ApiKeys};
    use parlance_core::ProductId;
    use parlance_ports::{PortError, PortResult};
    use parlance_testkit::api_keys::{KeyStoreFixture, Subject};

    /// The keys given at start-up, as the service reads them.
    #[derive(Default)]
    struct StartUp {
        keys: Mutex<(ApiKeys, i64)>,
    }

    #[async_trait]
    impl KeyStoreFixture for StartUp {
        async fn add(&self, product: &ProductId, key: &str) -> i64 {
            let mut g = self.keys.lock().unwrap();
            g.0.insert(&ApiKey::new(key), product.clone());
            g.1 += 1;
            g.1
        }

        async fn resolve(&self, presented: &str) -> PortResult<Option<ProductId>> {
            let keys = self.keys.lock().unwrap().0.clone();
            keys.resolve(presented).await
        }

        async fn revoke(&self, _: &ProductId, _: i64) -> PortResult<()> {
            Err(PortError::invalid("keys given at start-up are fixed"))
        }
    }

    parlance_testkit::api_key_suite!(async { Some(Arc::new(StartUp::default()) as Subject) });
}
