//! The key never reaches the logs, even at trace level, through retries,
//! failures and streams.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use parlance_openai::{ApiSecret, OpenAiClient, OpenAiConfig};
use parlance_ports::{CompletionRequest, LlmClient, Message, Usage};
use parlance_testkit::llm::Scripted;

use crate::fake::{FakeServer, Step};

const KEY: &str = "sk-live-0123456789abcdef";

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn the_key_never_reaches_the_logs() {
    let captured = Captured::default();
    let sink = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let server = FakeServer::start().await;
        server.push(Step::Scripted(Scripted::status(503, None)));
        server.push(Step::Scripted(Scripted::text("fine", Usage::new(1, 1))));
        server.push(Step::Scripted(Scripted::status(401, None)));
        server.push(Step::Scripted(Scripted::text("streamed", Usage::new(1, 1))));
        let config = OpenAiConfig::new(server.base_url(), "m")
            .with_api_key(ApiSecret::new(KEY))
            .with_retries(2, Duration::from_millis(1), Duration::from_millis(2));
        let client = OpenAiClient::new(config).unwrap();
        tracing::debug!(?client, "client built");
        let req = CompletionRequest::new(vec![Message::user("hi")]).with_prompt_name("probe");
        assert_eq!(client.complete(&req).await.unwrap().content, "fine");
        assert!(client.complete(&req).await.is_err());
        let chunks: Vec<_> = client.stream(&req).await.unwrap().collect().await;
        assert!(chunks.iter().all(Result::is_ok));
    });
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("model call failed; retrying"), "{logs}");
    assert!(logs.contains("prompt=\"probe\""), "{logs}");
    assert!(logs.contains("ApiSecret(***)"), "{logs}");
    assert!(!logs.contains(KEY), "the key leaked into the logs");
    assert!(!logs.contains("0123456789abcdef"), "part of the key leaked");
}
