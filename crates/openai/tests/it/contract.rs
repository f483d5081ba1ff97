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

mod embedding {
    use std::sync::Arc;

    use parlance_openai::{OpenAiConfig, OpenAiEmbedder};

    use crate::fake::FakeServer;

    /// The fake server answers unscripted embedding requests itself.
    async fn provider() -> Option<parlance_testkit::embedding::Subject> {
        let server = FakeServer::start().await;
        let config = OpenAiConfig::new(server.base_url(), "unused");
        let embedder = OpenAiEmbedder::new(config, "contract-embed", None).expect("embedder");
        // The server task keeps running for the rest of the test.
        drop(server);
        Some(Arc::new(embedder) as parlance_testkit::embedding::Subject)
    }

    parlance_testkit::embedding_suite!(provider());
}
