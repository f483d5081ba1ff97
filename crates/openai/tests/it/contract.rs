//! The LLM contract suite, run against the fake server.

use std::sync::Arc;
use std::time::Duration;

use parlance_openai::{ApiSecret, OpenAiClient, OpenAiConfig};
use parlance_ports::{CompletionRequest, LlmClient};
use parlance_testkit::llm::{LlmFixture, Scripted, Subject};

use crate::fake::{FakeServer, Step, decode_request};

/// The adapter, not retrying, in front of a scripted server.
struct Fixture {
    server: FakeServer,
    client: Arc<OpenAiClient>,
}

impl LlmFixture for Fixture {
    fn client(&self) -> Arc<dyn LlmClient> {
        self.client.clone()
    }

    fn script(&self, answer: Scripted) {
        self.server.push(Step::Scripted(answer));
    }

    fn received(&self) -> Vec<CompletionRequest> {
        self.server.bodies().iter().map(decode_request).collect()
    }
}

async fn fixture() -> Option<Subject> {
    let server = FakeServer::start().await;
    let config = OpenAiConfig::new(server.base_url(), "contract-model")
        .with_api_key(ApiSecret::new("sk-contract"))
        .with_timeout(Duration::from_secs(10))
        .with_retries(0, Duration::from_millis(1), Duration::from_millis(1));
    let client = Arc::new(OpenAiClient::new(config).expect("client"));
    Some(Arc::new(Fixture { server, client }) as Subject)
}

parlance_testkit::llm_client_suite!(fixture());
